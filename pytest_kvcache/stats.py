"""Summary statistics of measured samples (numpy)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
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


def ratio_ci_boots(
    base: Sequence[Sequence[float]],
    arm: Sequence[Sequence[float]],
    *,
    n_boot: int = BOOTSTRAP_SAMPLES,
    confidence: float = CONFIDENCE,
    seed: int = 0,
) -> tuple[float | None, float | None, float | None]:
    """Ratio of boot-level means arm/base with a hierarchical bootstrap CI (boots, then samples).

    ``base``/``arm`` hold one sequence of samples per boot. The boot is the unit: each boot's mean counts
    once, however many samples it holds, and the CI covers boot-to-boot variation as well as the noise
    within a boot. Boots without samples are ignored; fewer than 2 boots on a side gives no CI.
    """
    b = [x for x in base if len(x)]
    a = [x for x in arm if len(x)]
    if not b or not a:
        return None, None, None
    rng = _rng(seed)
    base_mean, base_boot = _boot_level_means(b, rng, n_boot)
    arm_mean, arm_boot = _boot_level_means(a, rng, n_boot)
    if base_mean == 0:
        return None, None, None
    ratio = arm_mean / base_mean
    if len(b) < 2 or len(a) < 2:
        return ratio, None, None
    boot = arm_boot / base_boot
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
    bracket the first sign change. The CI comes from resampling within each point; ``share`` is the
    fraction of resamples that cross at all.
    """
    points = [
        (x, np.asarray(b, float), np.asarray(a, float))
        for x, b, a in zip(xs, base, arm, strict=True)
        if len(b) and len(a)
    ]
    if len(points) < 2:
        return {"estimate": None, "ci_low": None, "ci_high": None, "share": 0.0, "points": len(points)}

    def first_crossing(ratios: list[float]) -> float | None:
        """The first change of sign of log(ratio); a ratio of exactly 1 between the two sides is the
        crossing itself, but touching 1 (or staying at 1: identical arms) without changing side is none."""
        logs = np.log(np.asarray(ratios))
        signs = np.sign(logs)
        sided = [i for i in range(len(logs)) if signs[i] != 0]
        for i, j in itertools.pairwise(sided):
            if signs[i] == signs[j]:
                continue
            if j > i + 1:  # exactly 1 at the points between: the first of them is where it crosses
                return float(points[i + 1][0])
            x0, x1 = points[i][0], points[j][0]
            return float(x0 + (x1 - x0) * logs[i] / (logs[i] - logs[j]))
        return None

    estimate = first_crossing([float(a.mean() / b.mean()) for _, b, a in points])
    rng = _rng(seed)
    found = []
    for _ in range(n_boot):
        ratios = []
        for _, b, a in points:
            ratios.append(float(a[rng.integers(0, a.size, a.size)].mean() / b[rng.integers(0, b.size, b.size)].mean()))
        c = first_crossing(ratios)
        if c is not None:
            found.append(c)
    share = len(found) / n_boot
    lo = hi = None
    if found and estimate is not None:
        lo, hi = _percentiles(np.asarray(found), confidence)
    return {"estimate": estimate, "ci_low": lo, "ci_high": hi, "share": share, "points": len(points)}
