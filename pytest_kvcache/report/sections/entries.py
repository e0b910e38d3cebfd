"""The run's boots, arms and blocks as report entries, from ``run.json`` and each boot's evidence: what
``BuildContext`` offers every section (``ctx.boots``, ``ctx.entries``, ``ctx.blocks``). It reads the run only,
never the context, so the sections that render these entries and the context that holds them import it, not each
other."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pytest_kvcache.model.evidence import Evidence, PlanEntry, kv_capacity_tokens, resolved_cache_dtype, speculative
from pytest_kvcache.model.report import ArmEntry, BlockEntry, BootEntry
from pytest_kvcache.report.load import RunData
from pytest_kvcache.report.sections.gpu import gpu_summary


def boot_entries(run: RunData) -> list[BootEntry]:
    """Every planned boot in run order: position, arm, replicate, whether it ran (or why not)."""
    out: list[BootEntry] = []
    for position, entry in enumerate(run.meta.get("plan") or [], 1):
        boot = str(entry.get("boot"))
        evidence = run.evidence.get(boot) or {}
        out.append(
            {
                "position": position,
                "boot": boot,
                "arm": entry.get("arm"),
                "replicate": entry.get("replicate", 1),
                "extra": bool(entry.get("extra")),
                "status": evidence.get("status") or ("skipped" if entry.get("skipped") else "not booted"),
                "skipped": entry.get("skipped"),
                "ready_s": evidence.get("ready_s"),
                "started_unix_s": evidence.get("started_unix_s"),
                "compile_s": (evidence.get("log") or {}).get("compile_s"),
                "compile_cache": (evidence.get("log") or {}).get("compile_cache"),
                "init_engine_s": (evidence.get("log") or {}).get("init_engine_s"),
            }
        )
    return out


def arm_entries(run: RunData, arms: Sequence[str]) -> list[ArmEntry]:
    entries: list[ArmEntry] = []
    plan = run.meta.get("plan") or []
    for i, name in enumerate(arms):
        boots = [str(p.get("boot")) for p in plan if p.get("arm") == name] or [name]
        evidence = {boot: run.evidence[boot] for boot in boots if boot in run.evidence}
        first: Evidence = next(iter(evidence.values()), Evidence())
        log = first.get("log") or {}
        entries.append(
            {
                "name": name,
                "baseline": i == 0,
                "declared": first.get("arm") or {"name": name},
                "resolved": {
                    "cache_dtype": resolved_cache_dtype(first),
                    "kv_cache_size_tokens": kv_capacity_tokens(first),
                    "attention_backend": log.get("attention_backend"),
                    "attention_candidates": log.get("attention_candidates"),
                    "engine_version": first.get("engine_version") or log.get("engine_version"),
                    "max_model_len": first.get("max_model_len"),
                    "served_model": first.get("served_model"),
                    "ready_s": first.get("ready_s"),
                    "status": first.get("status"),
                    "speculative": speculative(first),
                },
                "gpu": gpu_summary(first),
                "boots": boots,
                "evidence": evidence,
            }
        )
    return entries


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
