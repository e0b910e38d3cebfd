"""Where two curves cross: the first depth (or prompt size) at which an arm's ratio to the baseline changes side,
interpolated in log(ratio), with its bootstrap interval (requests, or boots and blocks, resampled) and the share of
resampled curves that cross the same way. Plain numpy."""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from pytest_kvcache.stats import CONFIDENCE, _percentiles, _rng


def first_crossing(xs: Sequence[float], ratios: Sequence[float]) -> float | None:
    """The first change of sign of log(ratio) along ``xs``, interpolated linearly in log(ratio); a ratio of
    exactly 1 between the two sides is the crossing itself, but touching 1 (or staying at 1: identical arms)
    without changing side is none."""
    return _signed_crossing(xs, ratios)[0]


def _signed_crossing(xs: Sequence[float], ratios: Sequence[float]) -> tuple[float | None, int]:
    """:func:`first_crossing` and the side the curve starts on (+1: ratio above 1, −1: below; 0: none)."""
    logs = np.log(np.asarray(ratios, dtype=float))
    signs = np.sign(logs)
    sided = [i for i in range(len(logs)) if signs[i] != 0]
    for i, j in itertools.pairwise(sided):
        if signs[i] == signs[j]:
            continue
        if j > i + 1:  # exactly 1 at the points between: the first of them is where it crosses
            return float(xs[i + 1]), int(signs[i])
        x0, x1 = xs[i], xs[j]
        return float(x0 + (x1 - x0) * logs[i] / (logs[i] - logs[j])), int(signs[i])
    return None, 0


#: A crossover is stated when at least this share of resamples crosses the same way as the estimate (or when
#: a point on each side has a CI that excludes parity: ``report.build.judge_crossovers``).
CROSSING_SHARE = 0.95


def _crossing_summary(
    estimate: float | None, found: list[float], n_boot: int, confidence: float, points: int
) -> dict[str, Any]:
    """``share``: the fraction of resamples whose curve crosses 1 the same way as the estimate's (from the same
    side), the significance of the crossing; ``ci_low``/``ci_high``: where those resamples cross."""
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
    boot_sd: float = 0.0,
    n_boot: int = 1000,
    confidence: float = CONFIDENCE,
    seed: int = 0,
) -> dict[str, Any]:
    """Where the arm/base ratio of a curve crosses 1 (the delta changes sign), with a bootstrap CI.

    ``xs`` are the curve's positions (depth or prompt tokens), ascending; ``base[i]``/``arm[i]`` the
    samples at ``xs[i]``. The crossing is interpolated linearly in log(ratio) between the two points that
    bracket the first sign change. The CI comes from resampling within each point (samples of one boot);
    ``share`` is the fraction of resamples that cross the same way as the estimate. ``boot_sd`` (the log
    ratio's boot-to-boot standard deviation, from a default band) moves each resampled curve as a whole by a
    random boot effect: a boot is one engine along the curve, and a within-boot resample cannot see how the
    next boot would sit. With boots to resample, see :func:`crossover_boots`.
    """
    points = [
        (x, np.asarray(b, float), np.asarray(a, float))
        for x, b, a in zip(xs, base, arm, strict=True)
        if len(b) and len(a)
    ]
    if len(points) < 2:
        return _crossing_summary(None, [], n_boot, confidence, len(points))
    at = [p[0] for p in points]
    estimate, side = _signed_crossing(at, [float(a.mean() / b.mean()) for _, b, a in points])
    rng = _rng(seed)
    found = []
    for _ in range(n_boot):
        shift = math.exp(rng.normal(0.0, boot_sd)) if boot_sd > 0 else 1.0
        ratios = []
        for _, b, a in points:
            resampled = a[rng.integers(0, a.size, a.size)].mean() / b[rng.integers(0, b.size, b.size)].mean()
            ratios.append(float(resampled) * shift)
        c, start = _signed_crossing(at, ratios)
        if c is not None and (estimate is None or start == side):
            found.append(c)
    return _crossing_summary(estimate, found, n_boot, confidence, len(points))


BootCurve = Sequence[Mapping[str, Sequence[float]]]


def crossover_boots(
    xs: Sequence[float],
    base: BootCurve,
    arm: BootCurve,
    *,
    blocks: Mapping[str, object] | None = None,
    n_boot: int = 1000,
    confidence: float = CONFIDENCE,
    seed: int = 0,
) -> dict[str, Any]:
    """:func:`crossover` with the boot as the resampling unit, as every delta's CI over boots.

    ``base[i]``/``arm[i]`` map each boot to its samples at ``xs[i]``. A boot is one engine measured along
    the whole curve, so a resample picks boots (the same boots at every point), then resamples each picked
    boot's samples. ``blocks`` maps a boot to its pytest-xdist block: with more than one block the curve is
    paired by block, as :func:`ratio_ci_boots` — the ratio at a point is the mean of the blocks' ratios,
    and whole blocks are resampled; without, each arm's boots are resampled on their own.
    """
    blocks = blocks or {}
    usable = [
        i for i in range(len(xs)) if any(len(v) for v in base[i].values()) and any(len(v) for v in arm[i].values())
    ]
    if len(usable) < 2:
        return _crossing_summary(None, [], n_boot, confidence, len(usable))
    at = [float(xs[i]) for i in usable]

    def arrays(curve: BootCurve) -> tuple[list[str], list[dict[str, np.ndarray]]]:
        boots = sorted({b for i in usable for b, v in curve[i].items() if len(v)})
        return boots, [{b: np.asarray(curve[i].get(b, ()), dtype=float) for b in boots} for i in usable]

    (base_boots, base_at), (arm_boots, arm_at) = arrays(base), arrays(arm)

    def mean_of(values: np.ndarray, rng: np.random.Generator | None) -> float:
        if not values.size:
            return float("nan")
        return float(values[rng.integers(0, values.size, values.size)].mean() if rng is not None else values.mean())

    labels = {blocks.get(b) for b in (*base_boots, *arm_boots)}
    pairs = [
        ([b for b in base_boots if blocks.get(b) == k], [a for a in arm_boots if blocks.get(a) == k])
        for k in sorted(labels, key=str)
    ]
    pairs = [(b, a) for b, a in pairs if b and a]
    by_block = len(labels) > 1 and bool(pairs)

    def curve_ratios(
        picked: Sequence[tuple[Sequence[str], Sequence[str]]], rng: np.random.Generator | None
    ) -> list[float]:
        ratios = []
        for p in range(len(usable)):
            if by_block:  # the mean of the picked blocks' ratios
                per = [
                    np.nanmean([mean_of(arm_at[p][a], rng) for a in arm_boots_])
                    / np.nanmean([mean_of(base_at[p][b], rng) for b in base_boots_])
                    for base_boots_, arm_boots_ in picked
                ]
                values = np.asarray(per)
                ratios.append(float(np.nanmean(values)) if np.isfinite(values).any() else float("nan"))
            else:
                base_boots_, arm_boots_ = picked[0]
                b = np.nanmean([mean_of(base_at[p][x], rng) for x in base_boots_])
                a = np.nanmean([mean_of(arm_at[p][x], rng) for x in arm_boots_])
                ratios.append(float(a / b) if b else float("nan"))
        return ratios

    with np.errstate(all="ignore"):
        observed = pairs if by_block else [(base_boots, arm_boots)]
        estimate, side = _signed_crossing(at, curve_ratios(observed, None))
        rng = _rng(seed)
        found = []
        for _ in range(n_boot):
            if by_block:
                picked = [pairs[k] for k in rng.integers(0, len(pairs), len(pairs))]
            else:
                picked = [
                    (
                        [base_boots[k] for k in rng.integers(0, len(base_boots), len(base_boots))],
                        [arm_boots[k] for k in rng.integers(0, len(arm_boots), len(arm_boots))],
                    )
                ]
            ratios = curve_ratios(picked, rng)
            if all(np.isfinite(ratios)):
                c, start = _signed_crossing(at, ratios)
                if c is not None and (estimate is None or start == side):
                    found.append(c)
    return _crossing_summary(estimate, found, n_boot, confidence, len(usable))
