"""The A/B comparison statistics of a run: per probe, point and metric the summary of each arm, every arm's
delta against the baseline arm with its CI, and where curves cross the baseline's (prefill by depth, agentic
by prompt tokens). Judging the crossings and the verdict prose are :mod:`pytest_kvcache.report.verdicts`.

Plain Python over the loaded run's frame: no pytest, no I/O. The bootstrap is seeded (``seed``), so the same
frame always yields the same rows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import cast

import pandas as pd

from pytest_kvcache import crossing, stats
from pytest_kvcache.model.report import CrossoverRow, DeltaRow, SummaryRow
from pytest_kvcache.report import bands
from pytest_kvcache.report.frame import compare, metrics_for, values
from pytest_kvcache.report.points import MIN_BOOTS_FOR_BOOT_CI, Specs, point_sort, spec_of


def _probes(data: pd.DataFrame, specs: Specs) -> list[str]:
    return sorted(data["probe"].unique(), key=lambda p: (spec_of(p, specs).order, str(p)))


def summary_rows(data: pd.DataFrame, arms: Sequence[str], specs: Specs) -> list[SummaryRow]:
    """n, mean, median, std, CV, min, max per probe × point × metric × arm, over valid measured samples."""
    rows: list[SummaryRow] = []
    if data.empty:
        return rows
    for probe in _probes(data, specs):
        by_probe = data[data["probe"] == probe]
        for point in sorted(by_probe["point"].unique(), key=point_sort):
            at = by_probe[by_probe["point"] == point]
            for metric in metrics_for(spec_of(probe, specs), at):
                for arm in arms:
                    group = at[at["arm"] == arm]
                    if group.empty:
                        continue
                    excluded = group.loc[~group["valid"], "excluded_reason"].dropna().tolist()
                    described = stats.describe(values(group, metric))
                    rows.append(
                        {
                            "probe": probe,
                            "point": point,
                            "metric": metric,
                            "arm": arm,
                            "n": described["n"],
                            "mean": described["mean"],
                            "median": described["median"],
                            "std": described["std"],
                            "cv_pct": described["cv_pct"],
                            "min": described["min"],
                            "max": described["max"],
                            "excluded": len(group) - int(group["valid"].sum()),
                            "excluded_reasons": sorted(set(excluded)),
                        }
                    )
    return rows


def delta_rows(data: pd.DataFrame, arms: Sequence[str], specs: Specs, seed: int) -> list[DeltaRow]:
    """Every arm against the baseline arm, per probe, point and compared metric."""
    rows: list[DeltaRow] = []
    if data.empty or len(arms) < 2:
        return rows
    baseline = arms[0]
    for probe in _probes(data, specs):
        spec = spec_of(probe, specs)
        by_probe = data[data["probe"] == probe]
        for point in sorted(by_probe["point"].unique(), key=point_sort):
            at = by_probe[by_probe["point"] == point]
            base = at[at["arm"] == baseline]
            for metric in metrics_for(spec, at):
                if metric not in spec.compared_metrics or spec.own_section:
                    continue
                for arm in arms[1:]:
                    other = at[at["arm"] == arm]
                    if other.empty and base.empty:
                        continue
                    found = compare(base, other, metric, seed=seed)
                    where = {"arm": arm, "baseline": baseline, "probe": probe, "point": point, "metric": metric}
                    row = cast(DeltaRow, {**where, **found})
                    rows.append(row)
    return rows


def ci_half_width_pct(row: DeltaRow) -> float | None:
    """Half the width of a ratio's CI, in percentage points (None without a CI)."""
    lo, hi = row.get("ci_low"), row.get("ci_high")
    if lo is None or hi is None:
        return None
    return float((hi - lo) / 2 * 100)


def _curve(
    data: pd.DataFrame, probe: str, arm: str, metric: str, specs: Specs
) -> list[tuple[float, dict[str, list[float]], str]]:
    """(x, {boot: values}, point) per point of a curve: x = depth, or the mean prompt tokens of a turn."""
    spec = spec_of(probe, specs)
    sub = data[(data["probe"] == probe) & (data["arm"] == arm)]
    key = "unit" if "unit" in sub else "boot"
    out = []
    for point in sorted(sub["point"].unique(), key=point_sort):
        at = sub[sub["point"] == point]
        if spec.exclude_first_point and at["turn"].iloc[0] == 1:
            continue  # turn 1 is cold: excluded from the curve, as from the growth verdict
        x = float(at["depth"].iloc[0]) if spec.curve_x == "depth" else float(at["prompt_tokens"].dropna().mean())
        found = {str(unit): v for unit, g in at.groupby(key, sort=False) if (v := values(g, metric))}
        if found:
            out.append((x, found, str(point)))
    return out


def _sessions(data: pd.DataFrame, probe: str) -> int:
    """How many sessions a probe's points come from (the agentic probe); 0: the probe has none."""
    if "session" not in data:
        return 0
    return int(data.loc[data["probe"] == probe, "session"].dropna().nunique())


def _pooled(boots: Mapping[str, list[float]]) -> list[float]:
    return [v for values_ in boots.values() for v in values_]


def _nearest(curve: Mapping[float, object], x: float) -> float:
    return min(curve, key=lambda c: abs(c - x))


def crossover_rows(
    data: pd.DataFrame, arms: Sequence[str], specs: Specs, seed: int, platform: bands.Platform = "cpu"
) -> list[CrossoverRow]:
    """Where each arm's curve (prefill by depth, agentic by prompt tokens) crosses the baseline's, with the
    resampled crossing's CI and share; :func:`judge_crossovers` then decides which are significant. Within
    boots, each resample also moves the curve by a boot effect drawn from the default band (a boot is one
    engine along the whole curve)."""
    rows: list[CrossoverRow] = []
    if data.empty or len(arms) < 2:
        return rows
    key = "unit" if "unit" in data else "boot"
    blocks = (
        {str(u): s for u, s in zip(data[key], data["block"], strict=True)} if "block" in data and key in data else {}
    )
    for spec in sorted(specs.values(), key=lambda s: (s.order, s.name)):
        for metric in spec.curve:
            base_curve = _curve(data, spec.name, arms[0], metric, specs)
            base = {x: found for x, found, _ in base_curve}
            names = {x: point for x, _, point in base_curve}
            for arm in arms[1:]:
                curve = {x: found for x, found, _ in _curve(data, spec.name, arm, metric, specs)}
                xs = [x for x in sorted(base) if x in curve or any(abs(x - c) / max(x, 1) < 0.02 for c in curve)]
                if len(xs) < 2:
                    continue
                arm_vals = [curve[_nearest(curve, x)] for x in xs]
                base_vals = [base[x] for x in xs]
                boots = min(len(set().union(*base_vals)), len(set().union(*arm_vals)))
                if boots >= MIN_BOOTS_FOR_BOOT_CI:  # the same unit as every delta's CI: boots (blocks)
                    found = crossing.crossover_boots(xs, base_vals, arm_vals, blocks=blocks, seed=seed)
                else:
                    band = bands.band(metric, platform)
                    per_side = [max(min(len(v) for v in vals), 1) for vals in (base_vals, arm_vals)]
                    boot_sd = band.boot_sd * (1 / per_side[0] + 1 / per_side[1]) ** 0.5 if band else 0.0
                    found = crossing.crossover(
                        xs,
                        [_pooled(b) for b in base_vals],
                        [_pooled(a) for a in arm_vals],
                        boot_sd=boot_sd,
                        seed=seed,
                    )
                    found["boot_sd_pct"] = boot_sd * 100
                found["ci_method"] = "boots" if boots >= MIN_BOOTS_FOR_BOOT_CI else "within-boot"
                axis = "depth" if spec.curve_x == "depth" else "prompt tokens"
                row = cast(
                    CrossoverRow,
                    {"arm": arm, "baseline": arms[0], "probe": spec.name, "metric": metric, "axis": axis, "xs": xs},
                )
                row.update(cast(CrossoverRow, found))
                row["point_names"] = [names[x] for x in xs]
                if sessions := _sessions(data, spec.name):
                    row["sessions"] = sessions
                rows.append(row)
    return rows
