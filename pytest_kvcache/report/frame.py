"""Measured requests as one pandas frame, and the one comparison every table, gate and saved-run check uses.

One row per measured request (a concurrency trial is one row for all its streams) with its metrics,
validity, axis point and pairing key, all taken from the probe's :class:`ProbeSpec`. Reads records only.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from pytest_kvcache import stats
from pytest_kvcache.metrics import catalogue
from pytest_kvcache.model.records import Record
from pytest_kvcache.model.report import Comparison
from pytest_kvcache.probes.registry import ProbeSpec
from pytest_kvcache.report.capacity import search as capacity_search
from pytest_kvcache.report.capacity import statistics as capacity_statistics
from pytest_kvcache.report.energy import request_windows, trial_windows
from pytest_kvcache.report.points import MIN_BOOTS_FOR_BOOT_CI, Specs, comparison, point_of, provisional_note, spec_of

#: A sample's flag that the host was busy outside the engine and the client (``run.hostload``): its boot may
#: have measured the other work (``report.spread``: no one-boot claim on the default band then).
HOST_BUSY = "host_cpu_busy"

PairKey = tuple[object, ...]


def pair_key(record: Record, specs: Specs) -> PairKey | None:
    """Requests that are the same prompt in every arm pair up, within the same replicate (A.r2 with B.r2):
    by the spec's ``paired_by`` fields (prefill: depth and index; agentic replay: session and turn)."""
    spec = spec_of(record.get("probe"), specs)
    if spec.paired_by is None:
        return None
    if spec.paired_shapes is not None and record.get("shape") not in spec.paired_shapes:
        return None
    fields: Mapping[str, object] = record
    return (record.get("replicate") or 1, *(fields.get(name) for name in spec.paired_by))


def frame(records: Sequence[Record], specs: Specs) -> pd.DataFrame:
    """One row per measured request with its metrics, validity, axis point and pairing key."""
    rows: list[dict[str, object]] = []
    trial_records: list[Record] = []
    search_records: list[Record] = []
    for r in records:
        if r.get("phase") != "measured":
            continue
        if spec_of(r.get("probe"), specs).trials:
            trial_records.append(r)
            continue
        if spec_of(r.get("probe"), specs).search:
            search_records.append(r)
            continue
        sample = r.get("sample") or {}
        row: dict[str, object] = {
            "arm": r.get("arm"),
            "boot": r.get("boot"),
            "probe": r.get("probe"),
            "point": point_of(r, specs),
            "depth": r.get("depth"),
            "turn": r.get("turn"),
            "session": r.get("session"),
            "index": r.get("index"),
            "pair": pair_key(r, specs),
            "valid": bool(r.get("ok")) and not r.get("excluded_reason"),
            "flagged": bool(r.get("flags")),
            "host_busy": HOST_BUSY in (r.get("flags") or []),
            "excluded_reason": r.get("excluded_reason"),
            "prompt_tokens": sample.get("prompt_tokens"),
            "cached_tokens": sample.get("cached_tokens"),
            **request_windows({**sample, "ok": r.get("ok")}),  # for energy per token (report.energy)
        }
        for metric, value in (r.get("metrics") or {}).items():
            row[metric] = value
        rows.append(row)
    rows += trial_rows(trial_records, specs)
    if search_records:  # one row per boot and point: the search's result (the capacity probe's)
        rows += capacity_search.frame_rows(search_records)
    return pd.DataFrame(rows)


def trial_rows(records: Sequence[Record], specs: Specs) -> list[dict[str, object]]:
    """One row per concurrency trial (N simultaneous streams): aggregate TPS (all streams' tokens over the
    span from the first send to the last ``[DONE]``), the median of per-stream decode TPS, and p95 TTFT.
    A trial with a failed or excluded stream is invalid as a whole."""
    trials: dict[tuple[object, ...], list[Record]] = {}
    for r in records:
        trials.setdefault((r.get("boot"), r.get("probe"), r.get("shape"), r.get("index")), []).append(r)
    rows: list[dict[str, object]] = []
    for (_, probe, _, index), streams in trials.items():
        first = streams[0]
        valid = all(s.get("ok") and not s.get("excluded_reason") for s in streams)
        starts = [float(s.get("sample", {}).get("send_unix_s") or 0.0) for s in streams]
        ends = [
            float(s.get("sample", {}).get("send_unix_s") or 0.0) + float(s.get("sample", {}).get("end_s") or 0.0)
            for s in streams
        ]
        tokens = sum(int(s.get("sample", {}).get("completion_tokens") or 0) for s in streams)
        tps = [v for s in streams if (v := (s.get("metrics") or {}).get("decode_tps")) is not None]
        ttfts = [v for s in streams if (v := (s.get("metrics") or {}).get("ttft_s")) is not None]
        span = max(ends) - min(starts)
        reasons = sorted({str(s.get("excluded_reason")) for s in streams if s.get("excluded_reason")})
        rows.append(
            {
                "arm": first.get("arm"),
                "boot": first.get("boot"),
                "probe": probe,
                "point": point_of(first, specs),
                "index": index,
                "pair": None,
                "valid": valid,
                "flagged": any(s.get("flags") for s in streams),
                "host_busy": any(HOST_BUSY in (s.get("flags") or []) for s in streams),
                "excluded_reason": "; ".join(reasons) or None,
                "streams": len(streams),
                "aggregate_tps": tokens / span if valid and span > 0 else None,
                "stream_tps_median": float(np.median(tps)) if valid and tps else None,
                "ttft_p95_s": float(np.percentile(ttfts, 95)) if valid and ttfts else None,
                **trial_windows(starts, ends, tokens),
            }
        )
    return rows


def values(group: pd.DataFrame, metric: str) -> list[float]:
    """The valid, present values of one metric in a frame slice."""
    if metric not in group:
        return []
    return [float(v) for v in group.loc[group["valid"], metric].tolist() if v is not None and v == v]


def metrics_for(spec: ProbeSpec, data: pd.DataFrame) -> tuple[str, ...]:
    """The spec's metrics that this slice of data actually has."""
    return tuple(m for m in spec.metrics if m in data and data[m].notna().any())


def _paired_values(base: pd.DataFrame, arm: pd.DataFrame, metric: str) -> tuple[list[float], list[float]]:
    b = {k: v for k, v in zip(base["pair"], base[metric], strict=True) if v is not None and v == v}
    a = {k: v for k, v in zip(arm["pair"], arm[metric], strict=True) if v is not None and v == v}
    keys = [k for k in b if k in a]
    return [float(b[k]) for k in keys], [float(a[k]) for k in keys]


def by_boot(group: pd.DataFrame, metric: str) -> list[list[float]]:
    """The values of ``metric`` per resampling unit: the ``unit`` column (a boot, or one external server
    per arm) where the run folder's loader set it, else the boot."""
    return by_boot_strata(group, metric)[0]


def by_boot_strata(group: pd.DataFrame, metric: str) -> tuple[list[list[float]], list[object]]:
    """:func:`by_boot`, and each unit's block: the ``block`` column (set by the loader from the boot plan of
    a pytest-xdist run: one boot of every arm on one lane), or 0 for every unit."""
    key = "unit" if "unit" in group else "boot"
    if group.empty or key not in group or metric not in group:
        return [], []
    # One pass over plain lists, not a groupby with a frame per unit: a report asks this of every point, metric
    # and arm (a third of an A/A acceptance cell's time). Units keep the order they first appear in, as a
    # groupby(sort=False) does, and a row without a unit belongs to none.
    blocks = group["block"].tolist() if "block" in group else [0] * len(group)
    found: dict[object, list[float]] = {}
    block_of: dict[object, object] = {}
    rows = zip(group[key].tolist(), blocks, group["valid"].tolist(), group[metric].tolist(), strict=True)
    for unit, block, ok, value in rows:
        if unit is None or unit != unit:
            continue
        if unit not in found:
            found[unit], block_of[unit] = [], block
        if ok and value is not None and value == value:
            found[unit].append(float(value))
    units = [unit for unit, got in found.items() if got]
    return [found[unit] for unit in units], [block_of[unit] for unit in units]


def compare(base: pd.DataFrame, other: pd.DataFrame, metric: str, *, seed: int) -> Comparison:
    """Ratio other/base of one metric at one point, its CI and verdict.

    With ``MIN_BOOTS_FOR_BOOT_CI`` boots or more on both sides the boot is the unit: ratio of boot-level
    means with a hierarchical bootstrap (``ci_method`` "boots"); in a pytest-xdist run paired by block (the
    blocks' ratios, whole blocks resampled, see ``stats.ratio_ci_boots``). Otherwise samples are pooled, paired where
    requests pair up, and the CI covers only the noise within a boot ("within-boot"). A search's metric (the
    capacity: one value per boot) carries its own bootstrap, over turns and boots (``report.capacity.statistics``).
    """
    if any("search" in g and g["search"].notna().any() for g in (base, other)):
        return capacity_statistics.compare(base, other, metric, seed=seed)
    if catalogue.family(metric) in OVER_PROMPTS:
        return compare_over_prompts(base, other, metric)
    bv, av = values(base, metric), values(other, metric)
    (base_boots, base_strata), (arm_boots, arm_strata) = by_boot_strata(base, metric), by_boot_strata(other, metric)
    paired = False
    df: float | None = None
    base_value: float | None
    arm_value: float | None
    if len(base_boots) >= MIN_BOOTS_FOR_BOOT_CI and len(arm_boots) >= MIN_BOOTS_FOR_BOOT_CI:
        method = "boots"
        ratio, lo, hi = stats.ratio_ci_boots(
            base_boots, arm_boots, base_blocks=base_strata, arm_blocks=arm_strata, seed=seed
        )
        df = stats.ratio_df_boots(base_boots, arm_boots, base_blocks=base_strata, arm_blocks=arm_strata)
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
    found = comparison(
        metric,
        (base_value, arm_value),
        (ratio, lo, hi),
        paired=paired,
        method=method,
        n=(len(bv), len(av)),
        boots=(len(base_boots), len(arm_boots)),
    )
    verdict = found["verdict"]
    spread = stats.pooled_log_sd(base_boots, arm_boots)
    if spread is not None:  # the run's own boot-to-boot spread (report.spread), from 2 boots on a side
        found["boot_sd"], found["boot_df"] = spread
    found["host_busy"] = host_busy(base) + host_busy(other)
    if method == "boots" and lo is not None and df is not None:
        found["ci_df"] = df  # the t-interval's degrees of freedom: the p-value of the same test (report.multiplicity)
    if method == "within-boot" and verdict != "inconclusive":
        found["provisional"] = provisional_note(max(1, min(len(base_boots), len(arm_boots))))
    return found


#: Metric families deterministic across boots and repeats of one prompt (greedy decoding, the same drafts):
#: replicated over prompts, not boots or requests (:func:`compare_over_prompts`).
OVER_PROMPTS = ("acceptance",)


def prompt_means(group: pd.DataFrame, metric: str) -> dict[object, float]:
    """``metric``'s mean per prompt of a frame slice, over its valid samples of every boot and repeat. A prompt is
    what pairs requests across arms without the replicate (``pair_key``: prefill's depth and index, an agentic
    replay's session and turn); where a probe pairs nothing (a short shape, repeated) the point holds one."""
    if group.empty or metric not in group:
        return {}
    rows = group[group["valid"] & group[metric].notna()] if "valid" in group else group[group[metric].notna()]
    keys = [str(pair[1:]) if isinstance(pair, tuple) else "one" for pair in rows.get("pair", [None] * len(rows))]
    return {k: float(v) for k, v in rows[metric].astype(float).groupby(keys).mean().items()}


def too_few_prompts(metric: str, prompts: int) -> str:
    """Why a metric deterministic across boots has no CI over ``prompts`` prompts."""
    return (
        f"fewer than {stats.MIN_CLUSTERS} prompts ({prompts}): {metric} is deterministic across boots and repeats, "
        "so only prompts replicate it"
    )


def compare_over_prompts(base: pd.DataFrame, other: pd.DataFrame, metric: str) -> Comparison:
    """Ratio other/base of a metric deterministic across boots and repeats (speculative acceptance): a boot or a
    repeat of the same prompt gives the same value again, so neither replicates it — prompts do. Each prompt's
    value is the mean over its boots and repeats (a prompt: one agentic session; one per point elsewhere); the CI
    is Student's t over the prompts' log ratios, paired by prompt (``ci_method`` "prompts", ``ci_df`` = prompts −
    1), none with fewer than ``stats.MIN_CLUSTERS`` prompts or a prompt without a positive value (``ci_note``
    says why; the verdict is then inconclusive)."""

    b, a = prompt_means(base, metric), prompt_means(other, metric)
    shared = sorted(set(b) & set(a), key=str)
    base_value = float(np.mean(list(b.values()))) if b else None
    arm_value = float(np.mean(list(a.values()))) if a else None
    ratio = arm_value / base_value if base_value and arm_value is not None else None
    lo = hi = None
    note = None
    if len(shared) < stats.MIN_CLUSTERS:
        note = too_few_prompts(metric, len(shared))
    elif any(b[k] <= 0 or a[k] <= 0 for k in shared):
        note = f"a prompt without a positive {metric}: no ratio interval"
    else:
        centre, low, high = stats.mean_ci_clusters([math.log(a[k] / b[k]) for k in shared])
        if centre is not None and low is not None and high is not None:
            ratio, lo, hi = math.exp(centre), math.exp(low), math.exp(high)
    found = comparison(
        metric,
        (base_value, arm_value),
        (ratio, lo, hi),
        paired=True,
        method="prompts",
        n=(len(values(base, metric)), len(values(other, metric))),
        boots=(
            int(base["boot"].nunique()) if "boot" in base and not base.empty else 0,
            int(other["boot"].nunique()) if "boot" in other and not other.empty else 0,
        ),
    )
    found["host_busy"] = host_busy(base) + host_busy(other)
    found["prompts"] = len(shared)
    if lo is not None:
        found["ci_df"] = len(shared) - 1
    if note is not None:
        found["ci_note"] = note
    return found


def host_busy(group: pd.DataFrame) -> int:
    """How many valid samples of a frame slice saw the host busy (``HOST_BUSY``)."""
    if group.empty or "host_busy" not in group:
        return 0
    return int(group.loc[group["valid"], "host_busy"].fillna(False).astype(bool).sum())
