"""The A/B report's content, built from a run folder alone: summary, deltas with CIs, crossovers, verdicts.

Reads ``run.json``, ``requests.jsonl`` and ``arms/*/evidence.json``; never talks to a server. The same
folder always yields the same report (the bootstrap is seeded), so a stored run re-renders identically.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from pytest_kvcache import confounds, stats
from pytest_kvcache.engines.evidence import kv_capacity_tokens, resolved_cache_dtype
from pytest_kvcache.probes import agreement
from pytest_kvcache.records import read_json, read_records

REPORT_VERSION = 1

#: Which metrics each probe reports, in table order. Other probes (a user's) report the client metrics.
PROBE_METRICS: dict[str, tuple[str, ...]] = {
    "short": ("wall_tps", "decode_tps", "ttft_s"),
    "prefill": ("prefill_tps", "ttft_s", "engine_prefill_s", "prompt_tokens"),
    "agentic": ("decode_tps", "ttft_s", "prompt_tokens", "cached_tokens"),
    "concurrency": ("aggregate_tps", "stream_tps_median", "ttft_p95_s"),
}
#: The one metric per probe that adaptive sampling, per-boot tables and round decisions look at.
PRIMARY_METRIC = {
    "short": "decode_tps",
    "prefill": "prefill_tps",
    "agentic": "decode_tps",
    "concurrency": "aggregate_tps",
}
#: With this many boots per arm or more, CIs are computed over boots (hierarchical bootstrap).
MIN_BOOTS_FOR_BOOT_CI = 3
CLIENT_METRICS = ("ttft_s", "wall_tps", "decode_tps", "prefill_tps")
KNOWN_METRICS = tuple(
    dict.fromkeys(
        [
            *CLIENT_METRICS,
            "engine_prefill_s",
            "engine_ttft_s",
            "prompt_tokens",
            "cached_tokens",
            "aggregate_tps",
            "stream_tps_median",
            "ttft_p95_s",
        ]
    )
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
    (session, turn), each within the same replicate (A.r2 pairs with B.r2). Short probes are unpaired."""
    replicate = record.get("replicate") or 1
    if record.get("probe") == "prefill":
        return (replicate, record.get("depth"), record.get("index"))
    if record.get("probe") == "agentic" and record.get("shape") == "replay":
        return (replicate, record.get("session"), record.get("turn"))
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
    rows += concurrency_trials(records)
    return pd.DataFrame(rows)


def concurrency_trials(records: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per concurrency trial (N simultaneous streams): aggregate TPS (all streams' tokens over the
    span from the first send to the last ``[DONE]``), the median of per-stream decode TPS, and p95 TTFT.
    A trial with a failed or excluded stream is invalid as a whole."""
    trials: dict[tuple[Any, ...], list[Mapping[str, Any]]] = {}
    for r in records:
        if r.get("probe") == "concurrency" and r.get("phase") == "measured":
            trials.setdefault((r.get("boot"), r.get("shape"), r.get("index")), []).append(r)
    rows = []
    for (_, _, index), streams in trials.items():
        first = streams[0]
        valid = all(s.get("ok") and not s.get("excluded_reason") for s in streams)
        starts = [s["sample"]["send_unix_s"] for s in streams]
        ends = [s["sample"]["send_unix_s"] + (s["sample"].get("end_s") or 0.0) for s in streams]
        tokens = sum(s["sample"].get("completion_tokens") or 0 for s in streams)
        tps = [s["metrics"].get("decode_tps") for s in streams if s["metrics"].get("decode_tps") is not None]
        ttfts = [s["metrics"].get("ttft_s") for s in streams if s["metrics"].get("ttft_s") is not None]
        span = max(ends) - min(starts)
        reasons = sorted({str(s.get("excluded_reason")) for s in streams if s.get("excluded_reason")})
        rows.append(
            {
                "arm": first.get("arm"),
                "boot": first.get("boot"),
                "probe": "concurrency",
                "point": point_of(first),
                "index": index,
                "pair": None,
                "valid": valid,
                "flagged": any(s.get("flags") for s in streams),
                "excluded_reason": "; ".join(reasons) or None,
                "streams": len(streams),
                "aggregate_tps": tokens / span if valid and span > 0 else None,
                "stream_tps_median": float(np.median(tps)) if valid and tps else None,
                "ttft_p95_s": float(np.percentile(ttfts, 95)) if valid and ttfts else None,
            }
        )
    return rows


def _values(group: pd.DataFrame, metric: str) -> list[float]:
    if metric not in group:
        return []
    return [float(v) for v in group.loc[group["valid"], metric].tolist() if v is not None and v == v]


def _point_sort(point: str) -> tuple[int, float, str]:
    if point.startswith("turn") and point[4:].isdigit():
        return (1, float(point[4:]), point)
    if point.startswith("c") and point[1:].isdigit():  # concurrency level
        return (1, float(point[1:]), point)
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


def _by_boot(group: pd.DataFrame, metric: str) -> list[list[float]]:
    if group.empty or "boot" not in group:
        return []
    return [values for _, g in group.groupby("boot", sort=False) if (values := _values(g, metric))]


def compare(base: pd.DataFrame, other: pd.DataFrame, metric: str, *, seed: int = 0) -> dict[str, Any]:
    """Ratio other/base of one metric at one point, its CI and verdict.

    With ``MIN_BOOTS_FOR_BOOT_CI`` boots or more on both sides the boot is the unit: ratio of boot-level
    means with a hierarchical bootstrap (``ci_method`` "boots"). Otherwise samples are pooled, paired where
    requests pair up, and the CI covers only the noise within a boot ("within-boot").
    """
    bv, av = _values(base, metric), _values(other, metric)
    base_boots, arm_boots = _by_boot(base, metric), _by_boot(other, metric)
    paired = False
    base_value: float | None
    arm_value: float | None
    if len(base_boots) >= MIN_BOOTS_FOR_BOOT_CI and len(arm_boots) >= MIN_BOOTS_FOR_BOOT_CI:
        method = "boots"
        ratio, lo, hi = stats.ratio_ci_boots(base_boots, arm_boots, seed=seed)
        base_value = float(np.mean([np.mean(b) for b in base_boots]))
        arm_value = float(np.mean([np.mean(a) for a in arm_boots]))
    else:
        method = "within-boot"
        paired = bool(len(base) and base["pair"].notna().all() and other["pair"].notna().all())
        if paired:
            pb, pa = _paired_values(base[base["valid"]], other[other["valid"]], metric)
            if len(pb) >= 2:
                bv, av = pb, pa
            else:
                paired = False
        ratio, lo, hi = stats.ratio_ci(bv, av, paired=paired, seed=seed)
        base_value = (sum(bv) / len(bv)) if bv else None
        arm_value = (sum(av) / len(av)) if av else None
    return {
        "baseline_value": base_value,
        "arm_value": arm_value,
        "ratio": ratio,
        "delta_pct": (ratio - 1) * 100 if ratio is not None else None,
        "ci_low": lo,
        "ci_high": hi,
        "paired": paired,
        "ci_method": method,
        "n_baseline": len(bv),
        "n_arm": len(av),
        "boots_baseline": len(base_boots),
        "boots_arm": len(arm_boots),
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


def ci_half_width_pct(row: Mapping[str, Any]) -> float | None:
    """Half the width of a ratio's CI, in percentage points (None without a CI)."""
    if row.get("ci_low") is None or row.get("ci_high") is None:
        return None
    return float((row["ci_high"] - row["ci_low"]) / 2 * 100)


def rounds_check(data: pd.DataFrame, arms: list[str], target_pct: float, seed: int = 0) -> dict[str, Any]:
    """Is every delta of a probe's primary metric narrow enough (CI half-width ≤ ``target_pct``)?

    Returns ``done`` and the widest delta (``probe``, ``point``, ``metric``, ``arm``, ``half_width_pct``);
    a delta without a CI counts as too wide.
    """
    rows = [r for r in delta_rows(data, arms, seed) if PRIMARY_METRIC.get(r["probe"]) == r["metric"]]
    if not rows:
        return {"done": False, "widest": None, "reason": "no deltas of the primary metrics yet"}
    widths = [(ci_half_width_pct(r), r) for r in rows]
    worst_width, worst = max(widths, key=lambda w: float("inf") if w[0] is None else w[0])
    widest = {k: worst[k] for k in ("probe", "point", "metric", "arm")} | {"half_width_pct": worst_width}
    done = all(w is not None and w <= target_pct for w, _ in widths)
    return {"done": done, "widest": widest}


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


def boot_entries(run: Path, meta: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every planned boot in run order: position, arm, replicate, whether it ran (or why not)."""
    out = []
    for position, entry in enumerate(meta.get("plan") or [], 1):
        path = run / "arms" / entry["boot"] / "evidence.json"
        evidence = read_json(path) if path.exists() else {}
        out.append(
            {
                "position": position,
                "boot": entry["boot"],
                "arm": entry.get("arm"),
                "replicate": entry.get("replicate", 1),
                "extra": bool(entry.get("extra")),
                "status": evidence.get("status") or ("skipped" if entry.get("skipped") else "not booted"),
                "skipped": entry.get("skipped"),
                "ready_s": evidence.get("ready_s"),
                "started_unix_s": evidence.get("started_unix_s"),
            }
        )
    return out


def boot_results(data: pd.DataFrame, boots: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per boot, per probe point: the probe's primary metric (mean and n of valid samples)."""
    rows: list[dict[str, Any]] = []
    if data.empty:
        return rows
    for boot in boots:
        mine = data[data["boot"] == boot["boot"]]
        for probe in sorted(mine["probe"].unique(), key=lambda p: PROBE_ORDER.get(p, 99)):
            metric = PRIMARY_METRIC.get(probe, "decode_tps")
            by_probe = mine[mine["probe"] == probe]
            for point in sorted(by_probe["point"].unique(), key=_point_sort):
                values = _values(by_probe[by_probe["point"] == point], metric)
                if values:
                    rows.append(
                        {
                            "boot": boot["boot"],
                            "arm": boot["arm"],
                            "position": boot["position"],
                            "probe": probe,
                            "point": point,
                            "metric": metric,
                            "mean": float(np.mean(values)),
                            "n": len(values),
                        }
                    )
    return rows


def ci_statement(boots: Sequence[Mapping[str, Any]], arms: Sequence[str]) -> dict[str, Any]:
    """How many boots each arm had, and what the report's CIs therefore cover."""
    ran = [b for b in boots if b["status"] in ("ready", "stopped")]
    per_arm = {arm: sum(1 for b in ran if b["arm"] == arm) for arm in arms}
    fewest = min(per_arm.values()) if per_arm else 0
    if fewest >= MIN_BOOTS_FOR_BOOT_CI:
        text = (
            f"CIs are computed over boots (hierarchical bootstrap: boots, then samples within a boot); "
            f"boots per arm: {', '.join(f'{a} {n}' for a, n in per_arm.items())}."
        )
    else:
        text = (
            f"CIs cover within-boot noise only (boots per arm: {', '.join(f'{a} {n}' for a, n in per_arm.items())}; "
            f"boot-to-boot variation is not in them — use --kv-replicates={MIN_BOOTS_FOR_BOOT_CI} or more)."
        )
    return {
        "boots_per_arm": per_arm,
        "method": "boots" if fewest >= MIN_BOOTS_FOR_BOOT_CI else "within-boot",
        "order": [b["boot"] for b in ran],
        "text": text,
    }


def agreement_report(run: Path, arms: Sequence[str]) -> dict[str, Any]:
    """Output agreement from ``agreement.jsonl``: between each arm and the baseline (same replicate, same
    request index), within a boot (request 0 vs 1) and across boots of one arm (request 0 of each)."""
    records = read_records(run / "agreement.jsonl")
    if not records:
        return {"rows": [], "notes": []}
    tokens = {
        (r["boot"], r["shape"], r["index"]): agreement.Tokens(tuple(r["ids"]), tuple(r["logprobs"]))
        for r in records
        if r.get("ok")
    }
    notes = sorted({f"{r['boot']} {r['shape']}: {r.get('error')}" for r in records if not r.get("ok")})
    shapes = list(dict.fromkeys(r["shape"] for r in records))
    boots_of: dict[str, dict[int, str]] = {}
    indices = sorted({int(r["index"]) for r in records})
    for r in records:
        boots_of.setdefault(r["arm"], {})[int(r.get("replicate") or 1)] = r["boot"]
    rows: list[dict[str, Any]] = []

    def add(kind: str, arm: str, other: str, shape: str, pairs: list[tuple[Any, Any]]) -> None:
        found = [agreement.compare_pair(tokens[a], tokens[b]) for a, b in pairs if a in tokens and b in tokens]
        if found:
            rows.append({"kind": kind, "arm": arm, "baseline": other, "shape": shape, **agreement.summarize(found)})

    base = arms[0] if arms else None
    for shape in shapes:
        for arm in arms[1:]:
            if base is None:
                continue
            reps = sorted(set(boots_of.get(base, {})) & set(boots_of.get(arm, {})))
            pairs = [((boots_of[base][r], shape, i), (boots_of[arm][r], shape, i)) for r in reps for i in indices]
            add("between arms", arm, base, shape, pairs)
        for arm in arms:
            boots = [boots_of.get(arm, {})[r] for r in sorted(boots_of.get(arm, {}))]
            if len(indices) >= 2:
                add("within a boot", arm, arm, shape, [((b, shape, indices[0]), (b, shape, indices[1])) for b in boots])
            if len(boots) >= 2:
                add("across boots", arm, arm, shape, [((boots[0], shape, 0), (b, shape, 0)) for b in boots[1:]])
    return {"rows": rows, "notes": notes}


def agreement_sentences(rows: Sequence[Mapping[str, Any]], arms: Sequence[str]) -> list[str]:
    """Next to the speed verdicts: whether each arm's greedy outputs match the baseline's."""
    out = []
    for arm in arms[1:]:
        mine = [r for r in rows if r["kind"] == "between arms" and r["arm"] == arm]
        if not mine:
            continue
        pairs = sum(r["pairs"] for r in mine)
        same = sum(round(r["identical_share"] * r["pairs"]) for r in mine)
        if same == pairs:
            out.append(f"{arm}'s greedy outputs are identical to {arms[0]}'s ({same} of {pairs} sequences).")
            continue
        where = ", ".join(
            f"{r['shape']} at token {r['mean_first_divergence']:.0f}"
            for r in mine
            if r.get("mean_first_divergence") is not None
        )
        out.append(
            f"{arm} changes greedy outputs: {same} of {pairs} sequences identical to {arms[0]}'s"
            + (f"; first divergence (mean) {where}." if where else ".")
        )
    return out


def sampling_report(run: Path) -> list[dict[str, Any]]:
    """Why each adaptive loop stopped (``sampling.jsonl``), as written during the run."""
    return read_records(run / "sampling.jsonl")


def confound_report(run: Path, boots: Sequence[Mapping[str, Any]], allow: Sequence[str]) -> dict[str, Any]:
    evidence = []
    for boot in boots:
        path = run / "arms" / boot["boot"] / "evidence.json"
        if path.exists():
            evidence.append(read_json(path))
    found = confounds.find(evidence, allow)
    found["lines"] = [confounds.describe(e) for e in found["confounds"]]
    return found


def measured_itl_s(records: Sequence[Mapping[str, Any]]) -> float | None:
    """Median time between token chunks over the run's valid measured streams (decode window / gaps)."""
    gaps = []
    for r in records:
        sample = r.get("sample") or {}
        chunks = sample.get("token_chunks") or 0
        first, last = sample.get("first_token_s"), sample.get("last_token_s")
        if r.get("phase") == "measured" and r.get("ok") and chunks > 1 and first is not None and last is not None:
            gaps.append((last - first) / (chunks - 1))
    return float(np.median(gaps)) if gaps else None


def self_check_report(check: Mapping[str, Any] | None, records: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The run's self-check in one sentence, and a warning when the client's own time per chunk exceeds 2%
    of the inter-token time this run measured."""
    if not check:
        return None
    from pytest_kvcache.selfcheck import overhead_warning

    if check.get("error"):
        return {"error": check["error"], "warnings": []}
    m = check.get("metrics") or {}

    def fig(name: str, key: str = "median") -> str:
        value = (m.get(name) or {}).get(key)
        return "–" if value is None else f"{value:.3g}"

    schedule = check.get("schedule") or {}
    summary = (
        f"Measuring-client self-check ({check.get('mode', 'quick')}, {check.get('n')} streams of "
        f"{schedule.get('completion_tokens')} tokens at ITL {1e3 * (schedule.get('itl_s') or 0):.2f} ms on loopback): "
        f"TTFT error median {fig('ttft_error_ms')} ms (p95 {fig('ttft_error_ms', 'p95')} ms), decode-TPS error "
        f"median {fig('decode_tps_error_pct')}% (p95 {fig('decode_tps_error_pct', 'p95')}%), client CPU "
        f"{fig('cpu_per_chunk_us')} µs per chunk (selfcheck.json)."
    )
    itl = measured_itl_s(records)
    warning = overhead_warning(dict(check), itl) if itl else None
    return {
        "summary": summary,
        "measured_itl_s": itl,
        "overhead_per_chunk_s": check.get("overhead_per_chunk_s"),
        "warnings": [warning] if warning else [],
    }


def build(run: Path, allow_diff: Sequence[str] = ()) -> dict[str, Any]:
    """The report of one run folder (``report.json``'s content). ``allow_diff`` adds to the run's own
    ``--kv-allow-diff`` keys."""
    meta, records = load_run(run)
    settings = meta.get("settings") or {}
    arms = [a["name"] for a in settings.get("arms", [])] or list(dict.fromkeys(r["arm"] for r in records))
    seed = int(settings.get("seed") or 0)
    data = frame(records)
    deltas = delta_rows(data, arms, seed)
    crossovers = crossover_rows(data, arms, seed)
    boots = boot_entries(run, meta)
    notes = []
    if not records:
        notes.append("no requests were recorded")
    for arm in arms:
        if not (run / "arms" / arm / "evidence.json").exists() and not any(
            p.get("arm") == arm for p in meta.get("plan", [])
        ):
            notes.append(f"no evidence for arm {arm}")
    ci = ci_statement(boots, arms)
    allow = [*(settings.get("allow_diff") or []), *allow_diff]
    agreed = agreement_report(run, arms)
    return {
        "report_version": REPORT_VERSION,
        "run_id": meta.get("run_id"),
        "status": meta.get("status"),
        "model": meta.get("model"),
        "versions": meta.get("versions"),
        "arms": arm_entries(run, meta.get("plan", []), arms),
        "boots": boots,
        "boot_results": boot_results(data, boots),
        "ci": ci,
        "confounds": confound_report(run, boots, allow),
        "agreement": agreed,
        "sampling": sampling_report(run),
        "self_check": self_check_report(meta.get("self_check"), records),
        "summary": summary_rows(data, arms),
        "deltas": deltas,
        "crossovers": crossovers,
        "verdicts": verdict_sentences(deltas, crossovers, arms) + agreement_sentences(agreed["rows"], arms),
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
