"""``report["blocks"]``: the blocks of a pytest-xdist run (only there: a run without lanes has none)."""

from __future__ import annotations

from typing import Any

from pytest_kvcache.model import BlockEntry, PlanEntry
from pytest_kvcache.report.load import RunData
from pytest_kvcache.report.sections.context import BuildContext


def block_entries(run: RunData) -> list[BlockEntry]:
    """The blocks of a pytest-xdist run, from the controller's ``run.json`` (plan and lanes) and each boot's
    evidence: lane, its workers, host and cards, the cards' models and driver, the engine version, the boots
    in the order they ran, and what became of the block (complete, lost with the worker that died, …)."""
    lanes = {int(entry.get("lane") or 0): entry for entry in run.meta.get("lanes") or []}
    if not lanes:
        return []
    by_block: dict[int, list[PlanEntry]] = {}
    for entry in run.meta.get("plan") or []:
        by_block.setdefault(int(entry.get("block") or entry.get("replicate") or 1), []).append(entry)
    out: list[BlockEntry] = []
    for number, entries in sorted(by_block.items()):
        lane = int(entries[0].get("lane") or 0)
        info = lanes.get(lane, {})
        evidence = [run.evidence.get(str(e.get("boot"))) or {} for e in entries]
        ran = [e for e in evidence if e.get("status") in ("ready", "stopped")]
        before: dict[str, Any] = next(
            (dict(e.get("gpu_before") or {}) for e in ran if (e.get("gpu_before") or {}).get("gpu")), {}
        )
        lost = [str(e["lost"]) for e in entries if e.get("lost")]
        skipped = [e for e in entries if e.get("skipped")]
        failed = [e for e in evidence if e.get("status") == "failed"]
        if lost:
            status = f"lost: {lost[0]}"
        elif skipped and len(skipped) == len(entries):
            status = "skipped (adaptive)"
        elif failed:
            status = f"failed: {', '.join(str(e.get('boot')) for e in failed)} did not boot"
        elif len(ran) == len(entries):
            status = "complete"
        else:
            status = "incomplete"
        out.append(
            {
                "block": number,
                "lane": lane,
                "workers": [str(w) for w in info.get("workers") or []],
                "host": info.get("host"),
                "gpus": info.get("gpus"),
                "gpu_models": sorted({str(c.get("name")) for c in before.get("cards") or [] if c.get("name")}),
                "driver": before.get("driver_version"),
                "engine_version": next((str(e["engine_version"]) for e in ran if e.get("engine_version")), None),
                "boots": [str(e.get("boot")) for e in entries],
                "status": status,
            }
        )
    return out


def section(run: RunData, ctx: BuildContext) -> dict[str, Any]:
    return {"blocks": ctx.blocks} if ctx.blocks else {}
