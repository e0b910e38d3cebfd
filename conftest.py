"""This repository's own test configuration.

The plugin itself is registered by its ``pytest11`` entry point (the editable install); this file must
not register it again. It only provides shared helpers for the project's tests.
"""

from __future__ import annotations

import os

# The project's own tests never inherit a user's arms from the environment.
for _name in [k for k in os.environ if k.startswith("PYTEST_KVCACHE_")]:
    del os.environ[_name]
