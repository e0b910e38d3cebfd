"""``report["self_check"]`` and ``report["client_load"]``: the measuring client's own check (and whether its
time per chunk is small beside the inter-token time this run measured), and the many-stream client's load."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import numpy as np

from pytest_kvcache.model.records import Record
from pytest_kvcache.model.report import ClientLoadSection, SelfCheckSection
from pytest_kvcache.report.load import RunData
from pytest_kvcache.report.part import ReportPart
from pytest_kvcache.report.sections.context import BuildContext
from pytest_kvcache.selfcheck import overhead_warning


def measured_itl_s(records: Sequence[Record]) -> float | None:
    """Median time between token chunks over the run's valid measured streams (decode window / gaps)."""
    gaps = []
    for r in records:
        sample = r.get("sample") or {}
        chunks = sample.get("token_chunks") or 0
        first, last = sample.get("first_token_s"), sample.get("last_token_s")
        if r.get("phase") == "measured" and r.get("ok") and chunks > 1 and first is not None and last is not None:
            gaps.append((last - first) / (chunks - 1))
    return float(np.median(gaps)) if gaps else None


def client_load_report(records: Sequence[Record]) -> ClientLoadSection | None:
    """The many-stream client's load over the concurrency probe's measured trials (None: no such trial)."""
    trials: dict[tuple[object, ...], dict[str, Any]] = {}
    for r in records:
        load = r.get("client")
        if r.get("probe") == "concurrency" and r.get("phase") == "measured" and isinstance(load, dict):
            trials.setdefault((r.get("boot"), r.get("shape"), r.get("index")), {"arm": r.get("arm"), **load})
    if not trials:
        return None
    loads = list(trials.values())

    def worst(key: str) -> float:
        return max(float(load.get(key) or 0.0) for load in loads)

    return {
        "trials": len(loads),
        "processes_max": int(worst("processes")),
        "cpu_share_max": worst("cpu_share_max"),
        "loop_lag_p99_max_s": worst("loop_lag_p99_s"),
        "timer_lag_p99_max_s": worst("timer_lag_p99_s"),
        "schedule_delay_max_s": worst("schedule_delay_max_s"),
        "saturated": [
            {
                "boot": str(boot),
                "arm": str(load["arm"]),
                "point": str(shape),
                "trial": int(cast(int, index)),
                "reasons": [str(reason) for reason in load.get("reasons") or []],
            }
            for (boot, shape, index), load in trials.items()
            if load.get("saturated")
        ],
    }


def self_check_report(run: RunData) -> SelfCheckSection | None:
    """The run's self-check in one sentence, and a warning when the client's own time per chunk exceeds 2%
    of the inter-token time this run measured."""
    check = run.meta.get("self_check")
    if not check:
        return None

    if check.get("error"):
        return {"error": str(check["error"]), "warnings": []}
    m = cast(dict[str, dict[str, float | None]], check.get("metrics") or {})

    def fig(name: str, key: str = "median") -> str:
        value = (m.get(name) or {}).get(key)
        return "–" if value is None else f"{value:.3g}"

    schedule = cast(dict[str, float], check.get("schedule") or {})
    summary = (
        f"Measuring-client self-check ({check.get('mode', 'quick')}, {check.get('n')} streams of "
        f"{schedule.get('completion_tokens')} tokens at ITL {1e3 * (schedule.get('itl_s') or 0):.2f} ms on loopback): "
        f"TTFT error median {fig('ttft_error_ms')} ms (p95 {fig('ttft_error_ms', 'p95')} ms), decode-TPS error "
        f"median {fig('decode_tps_error_pct')}% (p95 {fig('decode_tps_error_pct', 'p95')}%), client CPU "
        f"{fig('cpu_per_chunk_us')} µs per chunk (selfcheck.json)."
    )
    itl = measured_itl_s(run.records)
    warning = overhead_warning(dict(check), itl) if itl else None
    overhead = check.get("overhead_per_chunk_s")
    return {
        "summary": summary,
        "measured_itl_s": itl,
        "overhead_per_chunk_s": float(overhead) if isinstance(overhead, int | float) else None,
        "warnings": [warning] if warning else [],
    }


def section(run: RunData, ctx: BuildContext) -> dict[str, Any]:
    return {"self_check": self_check_report(run), "client_load": client_load_report(run.records)}


PART = ReportPart(json=(100, section))
