"""``report["arms"]``: each arm as declared and as the engine resolved it (its first boot's evidence), with
its GPU state and its boots; and what each arm's kind of server cannot show."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pytest_kvcache.engines.evidence import kv_capacity_tokens, resolved_cache_dtype, speculative
from pytest_kvcache.model import ArmEntry, Evidence
from pytest_kvcache.report.load import RunData
from pytest_kvcache.report.sections.context import BuildContext
from pytest_kvcache.report.sections.gpu import gpu_summary


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


def missing_evidence_notes(entries: Sequence[ArmEntry]) -> list[str]:
    """What each arm's kind of server cannot show (``--kv-engine``), one line per distinct list."""
    by_list: dict[tuple[str, str], list[str]] = {}
    for entry in entries:
        first: Evidence = next(iter(entry["evidence"].values()), Evidence())
        missing = first.get("evidence_missing") or []
        if missing:
            key = (str(first.get("engine_kind") or "?"), "; ".join(missing))
            by_list.setdefault(key, []).append(entry["name"])
    return [f"evidence missing for {', '.join(n)} ({kind} server): {listed}" for (kind, listed), n in by_list.items()]


def section(run: RunData, ctx: BuildContext) -> dict[str, Any]:
    return {"arms": ctx.entries}
