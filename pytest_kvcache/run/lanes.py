"""The controller's side of a pytest-xdist run: what becomes of its lanes — the workers each lane was given, what
they forwarded, the blocks a dead worker lost and the engines it left running. The scheduler and the controller's
hooks (``distributed.py``, the plugin layer) call it; it writes into the run (no pytest here)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from pytest_kvcache.config.plan import Boot, BootPlan
from pytest_kvcache.config.settings import Settings
from pytest_kvcache.engines.registry import reap_orphans
from pytest_kvcache.run import rounds
from pytest_kvcache.run.forward import apply
from pytest_kvcache.run.run import Run, reap_dead_containers

_PARAMS = re.compile(r"\[(?P<params>.*)\]$")


def boot_of_nodeid(nodeid: str, boots: Sequence[Boot]) -> Boot | None:
    """The boot a collected test belongs to, from its id: ``test_short[fp8.r2-code]`` → ``fp8.r2`` (the arm is
    the plugin's first parametrization, so its id comes first)."""
    found = _PARAMS.search(nodeid)
    if found is None:
        return None
    params = found.group("params")
    for boot in sorted(boots, key=lambda b: -len(b.boot_id)):
        if params == boot.boot_id or params.startswith(boot.boot_id + "-"):
            return boot
    return None


@dataclass
class Lanes:
    """What the controller learns of its lanes, written into ``run`` (its run.json's ``lanes`` and problems)."""

    run: Run
    boot_plan: BootPlan
    settings: Settings

    def skip_reason(self, block: int) -> str | None:
        """Whether an adaptive block is skipped (its round's deltas are already narrow enough)."""
        first = next((b for b in self.boot_plan if b.block == block), None)
        return rounds.skip_reason(self.run, first) if first is not None else None

    def assigned(self, lane: int, worker: str) -> None:
        self.run.lanes_info.setdefault(lane, {}).setdefault("workers", []).append(worker)

    def forwarded(self, lane: int, events: Sequence[Sequence[str]]) -> None:
        apply(self.run, lane, events)

    def block_lost(self, lane: int, block: int | None, worker: str, tests: Sequence[str]) -> None:
        """A worker died in a block: the block's boots that had tests left are lost (the report names them)."""
        info = self.run.lanes_info.setdefault(lane, {})
        boots = sorted({b.boot_id for t in tests if (b := boot_of_nodeid(t, self.boot_plan.boots)) is not None})
        died = [d for d in info.get("died", []) if d.get("worker") == worker]
        lost = {"block": block, "worker": worker, "tests_not_run": len(tests), "boots": boots}
        if died:  # pytest-xdist says a worker is down before the scheduler gives up its tests
            lost["error"] = died[-1]["error"]
        info.setdefault("lost", []).append(lost)
        for entry in self.run.plan:
            if entry.get("boot") in boots:
                entry["lost"] = f"worker {worker} died in block {block} with {len(tests)} test(s) of the block left"
        self.run.problems.append(f"lane {lane}: worker {worker} died in block {block}; boots lost: {', '.join(boots)}")
        self.run.write_meta(status="running")

    def worker_died(self, lane: int, worker: str, error: str) -> None:
        self.run.lanes_info.setdefault(lane, {}).setdefault("died", []).append({"worker": worker, "error": error})
        self.reap()
        self.run.write_meta(status="running")

    def problem(self, lane: int, text: str) -> None:
        self.run.problems.append(f"lane {lane}: {text}")

    def reap(self) -> None:
        """Stop engines that dead local workers left running: process groups in their registries (under
        ``workers/``), and containers labelled with a pytest process that is gone."""
        self.run.reaped += reap_orphans(self.settings.report_dir / "workers")
        if self.settings.launcher == "docker":
            self.run.reaped += reap_dead_containers()
