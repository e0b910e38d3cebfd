"""Summary statistics of measured samples (numpy)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

import numpy as np

SUMMARY_FIELDS = ("n", "mean", "median", "std", "cv_pct", "min", "max")


def describe(values: Iterable[float | None]) -> dict[str, Any]:
    """n, mean, median, sample std (ddof=1), CV %, min, max of the non-missing values."""
    data = np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=float)
    n = int(data.size)
    if n == 0:
        return {"n": 0, "mean": None, "median": None, "std": None, "cv_pct": None, "min": None, "max": None}
    mean = float(data.mean())
    std = float(data.std(ddof=1)) if n > 1 else None
    return {
        "n": n,
        "mean": mean,
        "median": float(np.median(data)),
        "std": std,
        "cv_pct": (100.0 * std / mean) if std is not None and mean != 0 else None,
        "min": float(data.min()),
        "max": float(data.max()),
    }


# ------------------------------------------------------------------------------- A/B statistics

BOOTSTRAP_SAMPLES = 4000
CONFIDENCE = 0.95


#: Metrics better higher that are not throughputs: speculative acceptance.
HIGHER_IS_BETTER = frozenset({"acceptance_length", "acceptance_rate"})


def higher_is_better(metric: str) -> bool:
    """Throughputs (``*_tps``) and acceptance are better higher; times (``*_s``) and token counts better lower."""
    return metric.endswith("_tps") or metric in HIGHER_IS_BETTER


def _rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def _percentiles(values: np.ndarray, confidence: float) -> tuple[float, float]:
    tail = 100 * (1 - confidence) / 2
    lo, hi = np.percentile(values, [tail, 100 - tail])
    return float(lo), float(hi)


def ratio_ci(
    base: Sequence[float],
    arm: Sequence[float],
    *,
    paired: bool = False,
    n_boot: int = BOOTSTRAP_SAMPLES,
    confidence: float = CONFIDENCE,
    seed: int = 0,
) -> tuple[float | None, float | None, float | None]:
    """Ratio of means arm/base and its percentile-bootstrap CI.

    Unpaired: each arm resampled on its own. Paired (``base[i]`` and ``arm[i]`` belong together, e.g. the
    same prompt in both arms): pair indices are resampled together. With fewer than 2 values on a side
    the CI is (None, None); an empty side gives (None, None, None).
    """
    b = np.asarray(base, dtype=float)
    a = np.asarray(arm, dtype=float)
    if b.size == 0 or a.size == 0 or b.mean() == 0:
        return None, None, None
    ratio = float(a.mean() / b.mean())
    if b.size < 2 or a.size < 2:
        return ratio, None, None
    rng = _rng(seed)
    if paired:
        if a.size != b.size:
            raise ValueError("paired samples need equal lengths")
        idx = rng.integers(0, b.size, size=(n_boot, b.size))
        boot = a[idx].mean(axis=1) / b[idx].mean(axis=1)
    else:
        bi = rng.integers(0, b.size, size=(n_boot, b.size))
        ai = rng.integers(0, a.size, size=(n_boot, a.size))
        boot = a[ai].mean(axis=1) / b[bi].mean(axis=1)
    boot = boot[np.isfinite(boot)]
    lo, hi = _percentiles(boot, confidence)
    return ratio, lo, hi


def _boot_level_means(
    boots: Sequence[Sequence[float]], rng: np.random.Generator, n_boot: int
) -> tuple[float, np.ndarray]:
    """Mean of boot means, and ``n_boot`` two-level resamples of it: pick boots with replacement, then
    resample the samples within each picked boot."""
    arrays = [np.asarray(b, dtype=float) for b in boots]
    # within[j, i]: boot j's mean in resample i (its samples resampled with replacement)
    within = np.stack([a[rng.integers(0, a.size, size=(n_boot, a.size))].mean(axis=1) for a in arrays])
    picks = rng.integers(0, len(arrays), size=(n_boot, len(arrays)))
    resampled = within[picks, np.arange(n_boot)[:, None]].mean(axis=1)
    return float(np.mean([a.mean() for a in arrays])), resampled


def _by_stratum(
    groups: Sequence[Sequence[float]], strata: Sequence[object] | None
) -> dict[object, list[Sequence[float]]]:
    """Boots (non-empty sample groups) per stratum, in first-seen order; no strata: one stratum."""
    labels: Sequence[object] = strata if strata is not None else [None] * len(groups)
    if len(labels) != len(groups):
        raise ValueError("one stratum label per boot")
    out: dict[object, list[Sequence[float]]] = {}
    for label, group in zip(labels, groups, strict=True):
        if len(group):
            out.setdefault(label, []).append(group)
    return out


def ratio_ci_boots(
    base: Sequence[Sequence[float]],
    arm: Sequence[Sequence[float]],
    *,
    base_strata: Sequence[object] | None = None,
    arm_strata: Sequence[object] | None = None,
    n_boot: int = BOOTSTRAP_SAMPLES,
    confidence: float = CONFIDENCE,
    seed: int = 0,
) -> tuple[float | None, float | None, float | None]:
    """Ratio of boot-level means arm/base with a hierarchical bootstrap CI (boots, then samples).

    ``base``/``arm`` hold one sequence of samples per boot. The boot is the unit: each boot's mean counts
    once, however many samples it holds, and the CI covers boot-to-boot variation as well as the noise
    within a boot. Boots without samples are ignored; fewer than 2 boots on a side gives no CI.

    ``base_strata``/``arm_strata`` (one label per boot) name where each boot ran — its lane (pytest-xdist
    worker, GPU group, host). With more than one stratum the ratio is taken within each stratum and
    averaged, weighted by the stratum's boots, and the bootstrap resamples boots *within* strata: a lane
    that is faster for every arm moves neither the ratio nor its CI. Strata holding only one side are
    left out. One stratum (or none given) is exactly the unstratified estimate.
    """
    by_base, by_arm = _by_stratum(base, base_strata), _by_stratum(arm, arm_strata)
    strata = [s for s in by_base if s in by_arm]
    if not strata:
        return None, None, None
    rng = _rng(seed)
    weights: list[float] = []
    ratios: list[float] = []
    resampled: list[np.ndarray] = []
    for stratum in strata:
        b, a = by_base[stratum], by_arm[stratum]
        base_mean, base_boot = _boot_level_means(b, rng, n_boot)
        arm_mean, arm_boot = _boot_level_means(a, rng, n_boot)
        if base_mean == 0:
            return None, None, None
        weights.append((len(b) + len(a)) / 2)
        ratios.append(arm_mean / base_mean)
        resampled.append(arm_boot / base_boot)
    w = np.asarray(weights) / sum(weights)
    ratio = float(np.dot(w, ratios))
    boots_base = sum(len(by_base[s]) for s in strata)
    boots_arm = sum(len(by_arm[s]) for s in strata)
    if boots_base < 2 or boots_arm < 2:
        return ratio, None, None
    boot = np.tensordot(w, np.stack(resampled), axes=1)
    boot = boot[np.isfinite(boot)]
    lo, hi = _percentiles(boot, confidence)
    return ratio, lo, hi


def mean_ci(
    values: Sequence[float], *, n_boot: int = BOOTSTRAP_SAMPLES, confidence: float = CONFIDENCE, seed: int = 0
) -> tuple[float | None, float | None, float | None]:
    """Mean and its percentile-bootstrap CI."""
    v = np.asarray(values, dtype=float)
    if v.size == 0:
        return None, None, None
    if v.size < 2:
        return float(v.mean()), None, None
    idx = _rng(seed).integers(0, v.size, size=(n_boot, v.size))
    lo, hi = _percentiles(v[idx].mean(axis=1), confidence)
    return float(v.mean()), lo, hi


def mean_ci_boots(
    boots: Sequence[Sequence[float]], *, n_boot: int = BOOTSTRAP_SAMPLES, confidence: float = CONFIDENCE, seed: int = 0
) -> tuple[float | None, float | None, float | None]:
    """Mean of boot-level means and its hierarchical bootstrap CI (boots, then samples within a boot):
    each boot counts once, and the CI covers boot-to-boot variation. Fewer than 2 boots: no CI."""
    groups = [x for x in boots if len(x)]
    if not groups:
        return None, None, None
    mean, resampled = _boot_level_means(groups, _rng(seed), n_boot)
    if len(groups) < 2:
        return mean, None, None
    lo, hi = _percentiles(resampled, confidence)
    return mean, lo, hi


Verdict = Literal["better", "worse", "inconclusive"]


def verdict(metric: str, lo: float | None, hi: float | None) -> Verdict:
    """Direction-aware and three-valued: a CI of the ratio that contains 1 is inconclusive."""
    if lo is None or hi is None:
        return "inconclusive"
    if lo > 1.0:
        return "better" if higher_is_better(metric) else "worse"
    if hi < 1.0:
        return "worse" if higher_is_better(metric) else "better"
    return "inconclusive"


def _first_crossing(xs: Sequence[float], ratios: Sequence[float]) -> float | None:
    """The first change of sign of log(ratio) along ``xs``, interpolated linearly in log(ratio); a ratio of
    exactly 1 between the two sides is the crossing itself, but touching 1 (or staying at 1: identical arms)
    without changing side is none."""
    logs = np.log(np.asarray(ratios, dtype=float))
    signs = np.sign(logs)
    sided = [i for i in range(len(logs)) if signs[i] != 0]
    for i, j in itertools.pairwise(sided):
        if signs[i] == signs[j]:
            continue
        if j > i + 1:  # exactly 1 at the points between: the first of them is where it crosses
            return float(xs[i + 1])
        x0, x1 = xs[i], xs[j]
        return float(x0 + (x1 - x0) * logs[i] / (logs[i] - logs[j]))
    return None


def _crossing_summary(
    estimate: float | None, found: list[float], n_boot: int, confidence: float, points: int
) -> dict[str, Any]:
    share = len(found) / n_boot
    lo = hi = None
    if found and estimate is not None:
        lo, hi = _percentiles(np.asarray(found), confidence)
    return {"estimate": estimate, "ci_low": lo, "ci_high": hi, "share": share, "points": points}


def crossover(
    xs: Sequence[float],
    base: Sequence[Sequence[float]],
    arm: Sequence[Sequence[float]],
    *,
    n_boot: int = 1000,
    confidence: float = CONFIDENCE,
    seed: int = 0,
) -> dict[str, Any]:
    """Where the arm/base ratio of a curve crosses 1 (the delta changes sign), with a bootstrap CI.

    ``xs`` are the curve's positions (depth or prompt tokens), ascending; ``base[i]``/``arm[i]`` the
    samples at ``xs[i]``. The crossing is interpolated linearly in log(ratio) between the two points that
    bracket the first sign change. The CI comes from resampling within each point (samples of one boot);
    ``share`` is the fraction of resamples that cross at all. With boots to resample, see
    :func:`crossover_boots`.
    """
    points = [
        (x, np.asarray(b, float), np.asarray(a, float))
        for x, b, a in zip(xs, base, arm, strict=True)
        if len(b) and len(a)
    ]
    if len(points) < 2:
        return _crossing_summary(None, [], n_boot, confidence, len(points))
    at = [p[0] for p in points]
    estimate = _first_crossing(at, [float(a.mean() / b.mean()) for _, b, a in points])
    rng = _rng(seed)
    found = []
    for _ in range(n_boot):
        ratios = []
        for _, b, a in points:
            ratios.append(float(a[rng.integers(0, a.size, a.size)].mean() / b[rng.integers(0, b.size, b.size)].mean()))
        c = _first_crossing(at, ratios)
        if c is not None:
            found.append(c)
    return _crossing_summary(estimate, found, n_boot, confidence, len(points))


BootCurve = Sequence[Mapping[str, Sequence[float]]]


def crossover_boots(
    xs: Sequence[float],
    base: BootCurve,
    arm: BootCurve,
    *,
    strata: Mapping[str, object] | None = None,
    n_boot: int = 1000,
    confidence: float = CONFIDENCE,
    seed: int = 0,
) -> dict[str, Any]:
    """:func:`crossover` with the boot as the resampling unit, as every delta's CI over boots.

    ``base[i]``/``arm[i]`` map each boot to its samples at ``xs[i]``; ``strata`` maps a boot to its lane.
    Each resample picks boots with replacement within each lane — the same boots at every point of the
    curve, since a boot is one engine measured along the whole curve — then resamples each picked boot's
    samples; the ratio at a point is the per-lane ratio of boot-level means, averaged over lanes weighted
    by boots (as :func:`ratio_ci_boots`).
    """
    strata = strata or {}
    usable = [
        i for i in range(len(xs)) if any(len(v) for v in base[i].values()) and any(len(v) for v in arm[i].values())
    ]
    if len(usable) < 2:
        return _crossing_summary(None, [], n_boot, confidence, len(usable))
    at = [float(xs[i]) for i in usable]
    sides = []
    for curve in (base, arm):
        boots = sorted({b for i in usable for b, v in curve[i].items() if len(v)})
        lanes: dict[object, list[str]] = {}
        for b in boots:
            lanes.setdefault(strata.get(b), []).append(b)
        arrays = [{b: np.asarray(curve[i].get(b, ()), dtype=float) for b in boots} for i in usable]
        sides.append((lanes, arrays))
    (base_lanes, base_arrays), (arm_lanes, arm_arrays) = sides
    shared = [lane for lane in base_lanes if lane in arm_lanes]
    if not shared:
        return _crossing_summary(None, [], n_boot, confidence, len(usable))
    weights = np.asarray([(len(base_lanes[s]) + len(arm_lanes[s])) / 2 for s in shared], dtype=float)

    def side_mean(arrays: dict[str, np.ndarray], picked: Sequence[str], rng: np.random.Generator | None) -> float:
        means = []
        for b in picked:
            v = arrays[b]
            if v.size:
                means.append(float(v[rng.integers(0, v.size, v.size)].mean()) if rng is not None else float(v.mean()))
        return float(np.mean(means)) if means else float("nan")

    def curve_ratios(picks: Mapping[tuple[int, object], Sequence[str]], rng: np.random.Generator | None) -> list[float]:
        ratios = []
        for p in range(len(usable)):
            per_lane = []
            for s in shared:
                b = side_mean(base_arrays[p], picks[(0, s)], rng)
                a = side_mean(arm_arrays[p], picks[(1, s)], rng)
                per_lane.append(a / b if b else float("nan"))
            values = np.asarray(per_lane)
            ok = np.isfinite(values)
            ratios.append(float(np.dot(weights[ok], values[ok]) / weights[ok].sum()) if ok.any() else float("nan"))
        return ratios

    observed = {(0, s): base_lanes[s] for s in shared} | {(1, s): arm_lanes[s] for s in shared}
    estimate = _first_crossing(at, curve_ratios(observed, None))
    rng = _rng(seed)
    found = []
    for _ in range(n_boot):
        picks: dict[tuple[int, object], Sequence[str]] = {}
        for side, lanes in ((0, base_lanes), (1, arm_lanes)):
            for s in shared:
                members = lanes[s]
                picks[(side, s)] = [members[k] for k in rng.integers(0, len(members), len(members))]
        ratios = curve_ratios(picks, rng)
        if all(np.isfinite(ratios)):
            c = _first_crossing(at, ratios)
            if c is not None:
                found.append(c)
    return _crossing_summary(estimate, found, n_boot, confidence, len(usable))
