"""The capacity's bootstrap CI (turns, trials and boots resampled, the knee read again in each replicate) and the
ratio between arms: see the package's docstring."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from pytest_kvcache import stats
from pytest_kvcache.model.report import Comparison
from pytest_kvcache.report.points import MIN_BOOTS_FOR_BOOT_CI, comparison, provisional_note

if TYPE_CHECKING:
    pass
from pytest_kvcache.report.capacity.search import METRIC, Search


def _units(group: pd.DataFrame, metric: str = METRIC) -> list[tuple[object, Search]]:
    """(block, search) of every boot in a frame slice that has a judged search (with a knee for ``metric``: the
    residency knee needs a hit rate)."""
    if group.empty or "search" not in group:
        return []
    out = []
    for _, row in group.iterrows():
        found = row.get("search")
        if isinstance(found, Search) and found.judged and bool(row.get("valid")) and found.knee_of(metric) is not None:
            out.append((row.get("block", 0) if "block" in group else 0, found))
    return out


def _knee(s: Search, metric: str) -> float:
    return float(s.knee_of(metric) or 0)


def _resample(
    base: list[tuple[object, np.ndarray]], arm: list[tuple[object, np.ndarray]], rng: np.random.Generator
) -> np.ndarray:
    """Replicates of the ratio of the arms' knees (boots × replicates arrays): whole blocks paired between the
    arms when both sides carry the same two or more blocks (pytest-xdist), else each side's boots resampled."""
    count = base[0][1].size
    blocks = sorted({b for b, _ in base} & {b for b, _ in arm}, key=str)
    if len(blocks) >= 2 and all(b not in (0, None) for b, _ in [*base, *arm]):
        per_block = []
        for block in blocks:
            b = np.mean([d for k, d in base if k == block], axis=0)
            a = np.mean([d for k, d in arm if k == block], axis=0)
            per_block.append(a / np.where(b > 0, b, np.nan))
        table = np.stack(per_block)
        picks = rng.integers(0, len(blocks), size=(count, len(blocks)))
        return np.asarray(np.nanmean(table[picks, np.arange(count)[:, None]], axis=1))

    def side(units: list[tuple[object, np.ndarray]]) -> np.ndarray:
        table = np.stack([d for _, d in units])
        if len(units) == 1:
            return np.asarray(table[0])
        picks = rng.integers(0, len(units), size=(count, len(units)))
        return np.asarray(table[picks, np.arange(count)[:, None]].mean(axis=1))

    b, a = side(base), side(arm)
    return np.asarray(a / np.where(b > 0, b, np.nan))


def _percentiles(values: np.ndarray) -> tuple[float | None, float | None]:
    """The 2.5% and 97.5% percentiles by nearest rank: each a replicate's value (a tried level, a ratio of two,
    or a mean of them over boots), never one interpolated between two."""
    values = values[np.isfinite(values)]
    if values.size == 0:
        return None, None
    tail = 100 * (1 - stats.CONFIDENCE) / 2
    lo, hi = np.percentile(values, [tail, 100 - tail], method="inverted_cdf")
    return float(lo), float(hi)


def unmeasured(units: Sequence[tuple[object, Search]], metric: str = METRIC) -> str | None:
    """Why an arm's capacity (or residency knee) has no interval: one boot whose search did not try the knee and
    the levels either side of it ``MIN_TRIALS`` times each (``Search.unmeasured``); None: it has one (several
    boots: over them)."""
    if len(units) != 1:
        return None
    return units[0][1].unmeasured(metric)


def compare(base: pd.DataFrame, other: pd.DataFrame, metric: str, *, seed: int) -> Comparison:
    """``report.frame.compare`` for the capacity: the ratio of the arms' knees (means over boots) and its
    bootstrap CI: the ratio of the two arms' knees in each replicate (turns resampled in every trial, each a
    tried level; boots resampled too). No CI where a one-boot side's knee was not tried enough
    (:func:`unmeasured`; ``ci_note`` says why). From 2 boots on a side, the pooled SD of the log knees
    (``boot_sd``: the run's own spread, ``report.spread``)."""
    bu, au = _units(base, metric), _units(other, metric)
    base_value = float(np.mean([_knee(s, metric) for _, s in bu])) if bu else None
    arm_value = float(np.mean([_knee(s, metric) for _, s in au])) if au else None
    ratio = arm_value / base_value if base_value and arm_value is not None else None
    lo = hi = None
    note = None
    if ratio is not None:
        why = [f"{s.arm}: {said}" for side in (bu, au) if (said := unmeasured(side, metric)) for _, s in side]
        if why:
            note = "no interval: " + "; ".join(why)
        else:
            rng = np.random.default_rng(seed)
            replicates = _resample(
                [(b, s.draws_of(metric, seed)) for b, s in bu], [(b, s.draws_of(metric, seed)) for b, s in au], rng
            )
            lo, hi = _percentiles(replicates)
    method = "boots" if len(bu) >= MIN_BOOTS_FOR_BOOT_CI and len(au) >= MIN_BOOTS_FOR_BOOT_CI else "within-boot"
    found = comparison(
        metric,
        (base_value, arm_value),
        (ratio, lo, hi),
        paired=False,
        method=method,
        n=(
            sum(int(t.ttft.size) for _, s in bu for t in s.judged),
            sum(int(t.ttft.size) for _, s in au for t in s.judged),
        ),
        boots=(len(bu), len(au)),
    )
    verdict = found["verdict"]
    found["censored"] = any(s.censored_of(metric) for _, s in [*bu, *au])
    if note:
        found["ci_note"] = note
    spread = stats.pooled_log_sd([[_knee(s, metric)] for _, s in bu], [[_knee(s, metric)] for _, s in au])
    if spread is not None:  # the run's own boot-to-boot spread of the knee (report.spread), from 2 boots on a side
        found["boot_sd"], found["boot_df"] = spread
    if method == "within-boot" and verdict != "inconclusive":
        found["provisional"] = provisional_note(max(1, min(len(bu), len(au))))
    return found


def capacity_ci(
    group: pd.DataFrame, seed: int, metric: str = METRIC
) -> tuple[float | None, float | None, float | None, str]:
    """An arm's capacity (or residency knee: ``metric``; mean over its boots), its CI (nearest-rank percentiles
    of the replicates' knees, boots resampled too; none where :func:`unmeasured` says why) and the CI's method,
    for the section and absolute gates (``capacity[capacity@2k]: >= 6``)."""
    units = _units(group, metric)
    if not units:
        return None, None, None, "within-boot"
    value = float(np.mean([_knee(s, metric) for _, s in units]))
    method = "boots" if len(units) >= MIN_BOOTS_FOR_BOOT_CI else "within-boot"
    if unmeasured(units, metric):
        return value, None, None, method
    table = np.stack([s.draws_of(metric, seed) for _, s in units])
    if len(units) > 1:
        rng = np.random.default_rng(seed)
        picks = rng.integers(0, len(units), size=(table.shape[1], len(units)))
        table = table[picks, np.arange(table.shape[1])[:, None]].T
    lo, hi = _percentiles(table.mean(axis=0))
    return value, lo, hi, method
