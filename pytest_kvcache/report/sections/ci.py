"""``report["ci"]``: how many boots each arm had, what the report's CIs therefore cover, the boot order (per
lane under pytest-xdist) and what the adaptive rounds added."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pytest_kvcache.model.report import BlockEntry, BootEntry, CiStatement
from pytest_kvcache.report.load import RunData
from pytest_kvcache.report.part import ReportPart
from pytest_kvcache.report.points import MIN_BOOTS_FOR_BOOT_CI
from pytest_kvcache.report.sections.context import BuildContext


def adaptive_text(run: RunData, boots: Sequence[BootEntry]) -> str | None:
    """How many boots the adaptive rounds added and why (from ``sampling.jsonl``'s round decisions), or None
    when the plan held no adaptive round."""
    extra = [b for b in boots if b.get("extra")]
    if not extra:
        return None
    budget = run.settings.get("max_replicates")
    booted = [b for b in extra if b["status"] in ("ready", "stopped", "failed")]
    decisions = [s for s in run.sampling if s.get("kind") == "rounds"]
    why = "; ".join(f"round {s.get('round')}: {s.get('decision')} — {s.get('reason')}" for s in decisions)
    return (
        f"Adaptive boots: {len(booted)} of {len(extra)} added (boot budget {budget} per arm, --kv-max-replicates)"
        + (f" — {why}" if why else "")
        + "."
    )


def ci_statement(
    boots: Sequence[BootEntry],
    arms: Sequence[str],
    launcher: object = None,
    blocks: Sequence[BlockEntry] = (),
    adaptive: str | None = None,
) -> CiStatement:
    """How many boots each arm had, and what the report's CIs therefore cover. Against external endpoints
    (``launcher`` "external") nothing is booted: replicates are repeats against one server per arm, one
    resampling unit, and the sentence says so. With ``blocks`` (pytest-xdist) comparisons are paired by
    block, and each lane's order is given."""
    ran = [b for b in boots if b["status"] in ("ready", "stopped")]
    per_arm = {arm: sum(1 for b in ran if b["arm"] == arm) for arm in arms}
    fewest = min(per_arm.values()) if per_arm else 0
    counts = ", ".join(f"{a} {n}" for a, n in per_arm.items())
    if launcher == "external":
        return {
            "boots_per_arm": {arm: min(n, 1) for arm, n in per_arm.items()},
            "method": "within-boot",
            "order": [b["boot"] for b in ran],
            "text": (
                f"CIs cover repeats against one server per arm only (external endpoints are measured, not booted: "
                f"repeats per arm: {counts}); server-to-server variation is not in them — boot the engines "
                f"(--kv-launcher=process or docker) with --kv-replicates={MIN_BOOTS_FOR_BOOT_CI} for CIs over boots."
            ),
        }
    lanes = sorted({b["lane"] for b in blocks})
    if fewest >= MIN_BOOTS_FOR_BOOT_CI and len(lanes) > 1:
        text = (
            f"CIs are computed over boots, paired by block across {len(lanes)} lanes (each block's ratio of its "
            f"arms' boot means, both on one lane; a t-interval over the blocks' log ratios); boots per arm: {counts}."
        )
    elif fewest >= MIN_BOOTS_FOR_BOOT_CI:
        text = (
            f"CIs are computed over boots (a Welch t-interval on the log of the boot means); boots per arm: {counts}."
        )
    else:
        text = (
            f"CIs cover within-boot noise only (boots per arm: {counts}); verdicts and gates judge them widened by "
            f"the default boot-to-boot band of each metric family (docs/gates.md) — --kv-replicates="
            f"{MIN_BOOTS_FOR_BOOT_CI} or more puts boot-to-boot variation in the CIs themselves."
        )
    if adaptive:
        text += " " + adaptive
    found: CiStatement = {
        "boots_per_arm": per_arm,
        "method": "boots" if fewest >= MIN_BOOTS_FOR_BOOT_CI else "within-boot",
        "order": [b["boot"] for b in ran],
        "text": text,
    }
    if lanes:
        started = {b["boot"]: b.get("started_unix_s") or 0.0 for b in ran}
        found["lane_order"] = {
            f"lane {lane}": sorted(
                (boot for block in blocks if block["lane"] == lane for boot in block["boots"] if boot in started),
                key=lambda boot: started[boot],
            )
            for lane in lanes
        }
    return found


def section(run: RunData, ctx: BuildContext) -> dict[str, Any]:
    adaptive = adaptive_text(run, ctx.boots)
    return {"ci": ci_statement(ctx.boots, ctx.arms, run.settings.get("launcher"), ctx.blocks, adaptive)}


PART = ReportPart(json=(60, section))
