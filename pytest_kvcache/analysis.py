"""The A/B report's content, built from a run folder alone: summary, deltas with CIs, crossovers, verdicts.

Reads ``run.json``, ``requests.jsonl`` and ``arms/*/evidence.json``; never talks to a server. The same
folder always yields the same report (the bootstrap is seeded), so a stored run re-renders identically.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from pytest_kvcache import stats
from pytest_kvcache.engines.evidence import kv_capacity_tokens, resolved_cache_dtype
from pytest_kvcache.records import read_json, read_records

REPORT_VERSION = 1

#: Which metrics each probe reports, in table order. Other probes (a user's) report the client metrics.
PROBE_METRICS: dict[str, tuple[str, ...]] = {
    "short": ("wall_tps", "decode_tps", "ttft_s"),
    "prefill": ("prefill_tps", "ttft_s", "engine_prefill_s", "prompt_tokens"),
    "agentic": ("decode_tps", "ttft_s", "prompt_tokens", "cached_tokens"),
}
CLIENT_METRICS = ("ttft_s", "wall_tps", "decode_tps", "prefill_tps")
KNOWN_METRICS = tuple(
    dict.fromkeys([*CLIENT_METRICS, "engine_prefill_s", "engine_ttft_s", "prompt_tokens", "cached_tokens"])
)
KNOWN_PROBES = ("short", "prefill", "agentic", "concurrency")
PROBE_ORDER = {name: i for i, name in enumerate(KNOWN_PROBES)}


class IncompleteRun(ValueError):
    """A run folder lacks what a report needs; the message lists what is missing."""


def point_of(record: Mapping[str, Any]) -> str:
    """The position a record occupies on its probe's axis: shape, depth label or ``turnN``."""
    probe = record.get("probe")
    if probe == "agentic" and record.get("turn") is not None:
        return f"turn{record['turn']}"
    if probe == "prefill" and record.get("depth") is not None:
        depth = int(record["depth"])
        return f"{depth // 1000}k" if depth % 1000 == 0 else str(depth)
    return str(record.get("shape") or "-")


def pair_key(record: Mapping[str, Any]) -> tuple[Any, ...] | None:
    """Requests that are the same prompt in every arm pair up: prefill by index, agentic replay by
    (session, turn). Short probes are compared unpaired."""
    if record.get("probe") == "prefill":
        return (record.get("depth"), record.get("index"))
    if record.get("probe") == "agentic" and record.get("shape") == "replay":
        return (record.get("session"), record.get("turn"))
    return None


def frame(records: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """One row per measured request with its metrics, validity, axis point and pairing key."""
    rows = []
    for r in records:
        if r.get("phase") != "measured":
            continue
        sample = r.get("sample") or {}
        row: dict[str, Any] = {
            "arm": r.get("arm"),
            "boot": r.get("boot"),
            "probe": r.get("probe"),
            "point": point_of(r),
            "depth": r.get("depth"),
            "turn": r.get("turn"),
            "session": r.get("session"),
            "index": r.get("index"),
            "pair": pair_key(r),
            "valid": bool(r.get("ok")) and not r.get("excluded_reason"),
            "flagged": bool(r.get("flags")),
            "excluded_reason": r.get("excluded_reason"),
            "prompt_tokens": sample.get("prompt_tokens"),
            "cached_tokens": sample.get("cached_tokens"),
        }
        for metric, value in (r.get("metrics") or {}).items():
            row[metric] = value
        rows.append(row)
    return pd.DataFrame(rows)


def _values(group: pd.DataFrame, metric: str) -> list[float]:
    if metric not in group:
        return []
    return [float(v) for v in group.loc[group["valid"], metric].tolist() if v is not None and v == v]


def _point_sort(point: str) -> tuple[int, float, str]:
    if point.startswith("turn") and point[4:].isdigit():
        return (1, float(point[4:]), point)
    digits = point[:-1] if point.endswith("k") else point
    try:
        return (0, float(digits) * (1000 if point.endswith("k") else 1), point)
    except ValueError:
        return (2, 0.0, point)


def _metrics_for(probe: str, data: pd.DataFrame) -> tuple[str, ...]:
    wanted = PROBE_METRICS.get(probe, CLIENT_METRICS)
    return tuple(m for m in wanted if m in data and data[m].notna().any())


def summary_rows(data: pd.DataFrame, arms: list[str]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    if data.empty:
        return rows
    for probe in sorted(data["probe"].unique(), key=lambda p: PROBE_ORDER.get(p, 99)):
        by_probe = data[data["probe"] == probe]
        for point in sorted(by_probe["point"].unique(), key=_point_sort):
            at = by_probe[by_probe["point"] == point]
            for metric in _metrics_for(probe, at):
                for arm in arms:
                    group = at[at["arm"] == arm]
                    if group.empty:
                        continue
                    excluded = group.loc[~group["valid"], "excluded_reason"].dropna().tolist()
                    rows.append(
                        {
                            "probe": probe,
                            "point": point,
                            "metric": metric,
                            "arm": arm,
                            **stats.describe(_values(group, metric)),
                            "excluded": len(group) - int(group["valid"].sum()),
                            "excluded_reasons": sorted(set(excluded)),
                        }
                    )
    return rows


def _paired_values(base: pd.DataFrame, arm: pd.DataFrame, metric: str) -> tuple[list[float], list[float]]:
    b = {k: v for k, v in zip(base["pair"], base[metric], strict=True) if v is not None and v == v}
    a = {k: v for k, v in zip(arm["pair"], arm[metric], strict=True) if v is not None and v == v}
    keys = [k for k in b if k in a]
    return [float(b[k]) for k in keys], [float(a[k]) for k in keys]


def compare(base: pd.DataFrame, other: pd.DataFrame, metric: str, *, seed: int = 0) -> dict[str, Any]:
    """Ratio other/base of one metric at one point, its CI and verdict; paired where requests pair up."""
    bv, av = _values(base, metric), _values(other, metric)
    paired = bool(len(base) and base["pair"].notna().all() and other["pair"].notna().all())
    if paired:
        pb, pa = _paired_values(base[base["valid"]], other[other["valid"]], metric)
        if len(pb) >= 2:
            bv, av = pb, pa
        else:
            paired = False
    ratio, lo, hi = stats.ratio_ci(bv, av, paired=paired, seed=seed)
    return {
        "baseline_value": (sum(bv) / len(bv)) if bv else None,
        "arm_value": (sum(av) / len(av)) if av else None,
        "ratio": ratio,
        "delta_pct": (ratio - 1) * 100 if ratio is not None else None,
        "ci_low": lo,
        "ci_high": hi,
        "paired": paired,
        "n_baseline": len(bv),
        "n_arm": len(av),
        "direction": "higher" if stats.higher_is_better(metric) else "lower",
        "verdict": stats.verdict(metric, lo, hi),
    }


def delta_rows(data: pd.DataFrame, arms: list[str], seed: int = 0) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    if data.empty or len(arms) < 2:
        return rows
    baseline = arms[0]
    for probe in sorted(data["probe"].unique(), key=lambda p: PROBE_ORDER.get(p, 99)):
        by_probe = data[data["probe"] == probe]
        for point in sorted(by_probe["point"].unique(), key=_point_sort):
            at = by_probe[by_probe["point"] == point]
            base = at[at["arm"] == baseline]
            for metric in _metrics_for(probe, at):
                if metric in ("prompt_tokens", "cached_tokens"):
                    continue
                for arm in arms[1:]:
                    other = at[at["arm"] == arm]
                    if other.empty and base.empty:
                        continue
                    rows.append(
                        {
                            "arm": arm,
                            "baseline": baseline,
                            "probe": probe,
                            "point": point,
                            "metric": metric,
                            **compare(base, other, metric, seed=seed),
                        }
                    )
    return rows


def _curve(data: pd.DataFrame, probe: str, arm: str, metric: str) -> list[tuple[float, list[float]]]:
    """(x, values) per point of a depth or turn curve: x = depth for prefill, mean prompt tokens per turn."""
    sub = data[(data["probe"] == probe) & (data["arm"] == arm)]
    out = []
    for point in sorted(sub["point"].unique(), key=_point_sort):
        at = sub[sub["point"] == point]
        if probe == "agentic" and at["turn"].iloc[0] == 1:
            continue  # turn 1 is cold: excluded from the curve, as from the growth verdict
        x = float(at["depth"].iloc[0]) if probe == "prefill" else float(at["prompt_tokens"].dropna().mean())
        values = _values(at, metric)
        if values:
            out.append((x, values))
    return out


def _nearest(curve: Mapping[float, Any], x: float) -> float:
    return min(curve, key=lambda c: abs(c - x))


CURVES = {"prefill": ("prefill_tps", "ttft_s"), "agentic": ("decode_tps", "ttft_s")}


def crossover_rows(data: pd.DataFrame, arms: list[str], seed: int = 0) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    if data.empty or len(arms) < 2:
        return rows
    for probe, metrics in CURVES.items():
        for metric in metrics:
            base = dict(_curve(data, probe, arms[0], metric))
            for arm in arms[1:]:
                curve = dict(_curve(data, probe, arm, metric))
                xs = [x for x in sorted(base) if x in curve or any(abs(x - c) / max(x, 1) < 0.02 for c in curve)]
                if len(xs) < 2:
                    continue
                arm_vals = [curve[_nearest(curve, x)] for x in xs]
                found = stats.crossover(xs, [base[x] for x in xs], arm_vals, seed=seed)
                axis = "depth" if probe == "prefill" else "prompt tokens"
                if found["estimate"] is None:
                    statement = f"no crossover in the measured range ({xs[0]:,.0f}–{xs[-1]:,.0f} {axis})"
                else:
                    ci = ""
                    if found["ci_low"] is not None:
                        ci = f" (95% CI {found['ci_low']:,.0f}–{found['ci_high']:,.0f})"
                    statement = f"{arm}/{arms[0]} {metric} crosses 1 at ~{found['estimate']:,.0f} {axis}{ci}"
                rows.append(
                    {
                        "arm": arm,
                        "baseline": arms[0],
                        "probe": probe,
                        "metric": metric,
                        "axis": axis,
                        "xs": xs,
                        **found,
                        "statement": statement,
                    }
                )
    return rows


def _short_k(tokens: float) -> str:
    return f"~{tokens / 1000:.1f}K" if tokens >= 1000 else f"~{tokens:.0f}"


def verdict_sentences(deltas: list[dict[str, Any]], crossovers: list[dict[str, Any]], arms: list[str]) -> list[str]:
    """Plain sentences from the data, like the seed's verdict."""
    out = []
    for arm in arms[1:]:
        short = [d for d in deltas if d["arm"] == arm and d["probe"] == "short" and d["metric"] == "decode_tps"]
        if short:
            parts = ", ".join(f"{d['point']} {d['delta_pct']:+.1f}%" for d in short if d["delta_pct"] is not None)
            verdicts = {d["verdict"] for d in short}
            if verdicts == {"better"}:
                lead = f"{arm} wins short requests on decode_tps"
            elif verdicts == {"worse"}:
                lead = f"{arm} loses short requests on decode_tps"
            else:
                lead = f"{arm} vs {arms[0]} on short requests is not conclusive for every shape"
            out.append(f"{lead} ({parts}).")
        for probe, metric in (("agentic", "decode_tps"), ("prefill", "prefill_tps")):
            cross = [c for c in crossovers if c["arm"] == arm and c["probe"] == probe and c["metric"] == metric]
            for c in cross:
                if c["estimate"] is not None:
                    out.append(
                        f"{arm}'s {probe} {metric} relative to {arms[0]} changes sign by "
                        f"{_short_k(c['estimate'])} {c['axis']}"
                        + (f" (95% CI {_short_k(c['ci_low'])}–{_short_k(c['ci_high'])})." if c["ci_low"] else ".")
                    )
                else:
                    rows = [d for d in deltas if d["arm"] == arm and d["probe"] == probe and d["metric"] == metric]
                    signs = {d["verdict"] for d in rows}
                    where = (
                        f"ahead of {arms[0]} at every point"
                        if signs == {"better"}
                        else f"behind {arms[0]} at every point"
                        if signs == {"worse"}
                        else f"no consistent difference from {arms[0]}"
                    )
                    out.append(f"{arm}'s {probe} {metric}: {c['statement']}; {where}.")
    return out


def arm_entries(run: Path, plan: list[dict[str, Any]], arms: list[str]) -> list[dict[str, Any]]:
    entries = []
    for i, name in enumerate(arms):
        boots = [p["boot"] for p in plan if p.get("arm") == name] or [name]
        evidence: dict[str, dict[str, Any]] = {}
        for boot in boots:
            path = run / "arms" / boot / "evidence.json"
            if path.exists():
                evidence[boot] = read_json(path)
        first: dict[str, Any] = next(iter(evidence.values()), {})
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
                },
                "gpu": gpu_summary(first),
                "boots": boots,
                "evidence": evidence,
            }
        )
    return entries


def gpu_summary(evidence: Mapping[str, Any]) -> dict[str, Any]:
    """Per card: power cap before/after the arm, VRAM when ready and before stopping; or why none."""
    before, after = evidence.get("gpu_before") or {}, evidence.get("gpu_after") or {}
    if not before.get("gpu"):
        return {"gpu": False, "reason": before.get("reason")}
    post = {c.get("uuid"): c for c in after.get("cards") or []}
    ready = evidence.get("vram_ready_mib") or {}
    loaded = evidence.get("vram_before_stop_mib") or {}
    cards = []
    for card in before.get("cards") or []:
        uuid = card.get("uuid")
        cards.append(
            {
                "index": card.get("index"),
                "uuid": uuid,
                "name": card.get("name"),
                "power_limit_before_w": card.get("power_limit_w"),
                "power_limit_after_w": (post.get(uuid) or {}).get("power_limit_w"),
                "vram_ready_mib": ready.get(uuid),
                "vram_before_stop_mib": loaded.get(uuid),
                "driver_version": before.get("driver_version"),
            }
        )
    return {"gpu": True, "cards": cards, "changes": evidence.get("gpu_changes") or []}


def load_run(run: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    missing = [name for name in ("run.json", "requests.jsonl") if not (run / name).exists()]
    if not run.is_dir():
        raise IncompleteRun(f"{run}: not a run folder (it does not exist)")
    if missing:
        raise IncompleteRun(f"{run}: incomplete run folder — missing {', '.join(missing)}")
    meta = read_json(run / "run.json")
    records = read_records(run / "requests.jsonl")
    return meta, records


def build(run: Path) -> dict[str, Any]:
    """The report of one run folder (``report.json``'s content)."""
    meta, records = load_run(run)
    settings = meta.get("settings") or {}
    arms = [a["name"] for a in settings.get("arms", [])] or list(dict.fromkeys(r["arm"] for r in records))
    seed = int(settings.get("seed") or 0)
    data = frame(records)
    deltas = delta_rows(data, arms, seed)
    crossovers = crossover_rows(data, arms, seed)
    notes = []
    if not records:
        notes.append("no requests were recorded")
    for arm in arms:
        if not (run / "arms" / arm / "evidence.json").exists() and not any(
            p.get("arm") == arm for p in meta.get("plan", [])
        ):
            notes.append(f"no evidence for arm {arm}")
    return {
        "report_version": REPORT_VERSION,
        "run_id": meta.get("run_id"),
        "status": meta.get("status"),
        "model": meta.get("model"),
        "versions": meta.get("versions"),
        "arms": arm_entries(run, meta.get("plan", []), arms),
        "summary": summary_rows(data, arms),
        "deltas": deltas,
        "crossovers": crossovers,
        "verdicts": verdict_sentences(deltas, crossovers, arms),
        "notes": notes,
    }


def clean(value: Any) -> Any:
    """JSON-safe: NaN/inf → None, tuples → lists, numpy scalars → Python numbers."""
    if isinstance(value, dict):
        return {str(k): clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [clean(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, str | bytes):
        value = value.item()
    if (isinstance(value, float) and value != value) or value in (float("inf"), float("-inf")):
        return None
    return value


def dumps(report: Mapping[str, Any]) -> str:
    return json.dumps(clean(report), indent=2, sort_keys=False, default=str, allow_nan=False) + "\n"
