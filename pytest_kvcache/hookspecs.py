"""pytest-kvcache's own hooks (added with ``pytest_addhooks``)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from pytest_kvcache.config.plan import Boot
    from pytest_kvcache.config.settings import Settings
    from pytest_kvcache.engines.base import Engine
    from pytest_kvcache.engines.registry import EngineRegistry


@pytest.hookspec(firstresult=True)
def pytest_kvcache_make_engine(
    config: pytest.Config, settings: Settings, boot: Boot, arm_dir: Path, registry: EngineRegistry
) -> Engine | None:
    """Return an (unstarted) Engine for ``boot``, or None to let the next implementation decide.

    The plugin's own implementation (``--kv-launcher`` process/external) runs last, so a conftest or
    plugin can launch engines its own way (a cluster scheduler, a remote box). ``start()`` must clean up
    after itself on failure and raise ``EngineError``; ``stop()`` must be idempotent. An engine that
    spawns processes should ``registry.add(key, pid)`` them so a later run can reap them if pytest dies.
    """


@pytest.hookspec()
def pytest_kvcache_report(config: pytest.Config, report: dict[str, Any]) -> None:
    """Called once per run after all probes (also when some failed), with the built report.

    ``report`` is ``report.json``'s content (arms, summary, deltas, crossovers, verdicts, gates); the
    files are already written in the run folder (``report["run_folder"]``). Use it to publish results.
    """
