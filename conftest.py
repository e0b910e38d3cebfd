"""This repository's own test configuration.

The plugin itself is registered by its ``pytest11`` entry point (the editable install); this file must
not register it again. It only provides shared helpers for the project's tests.
"""

from __future__ import annotations

import os

# The project's own tests never inherit a user's arms from the environment. Once per process tree: pytester's
# in-process runs import this file again, and must keep what a test set (tests/plugin's embedded model).
if not os.environ.get("KVCACHE_TESTS_ENV_CLEARED"):
    for _name in [k for k in os.environ if k.startswith("PYTEST_KVCACHE_")]:
        del os.environ[_name]
    os.environ["KVCACHE_TESTS_ENV_CLEARED"] = "1"
