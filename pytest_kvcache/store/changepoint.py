"""Change points in a series of run means: E-Divisive means (Matteson & James, 2014), as Apache Otava
(formerly Hunter, MongoDB's and DataStax's nightly-perf tool) runs it on performance history.

Numpy, and scipy's Student t. :func:`e_divisive` bisects hierarchically: in each segment it finds the split that
maximises the energy statistic ``q`` (α = 1), tests it with a permutation test (the segment's values shuffled
``permutations`` times by a generator seeded with ``seed``, so a history gives the same answer every
time), and keeps it when its p-value is below ``alpha``; then it looks again in every segment.

A permutation test cannot call a one-run segment significant (its p-value cannot go below about
1/len(segment)), so the newest run is judged by :func:`tail_shift` instead: against the regime it follows,
with a Student-t prediction interval.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

#: Fewest runs on either side of a change point found by :func:`e_divisive`.
MIN_SIZE = 3
ALPHA = 0.005
PERMUTATIONS = 999


@dataclass(frozen=True)
class ChangePoint:
    """The series changes at ``index``: ``values[index]`` is the first value of the new regime."""

    index: int
    p_value: float
    mean_before: float
    mean_after: float

    @property
    def shift_pct(self) -> float | None:
        """(mean after / mean before − 1) × 100."""
        if self.mean_before == 0:
            return None
        return (self.mean_after / self.mean_before - 1.0) * 100.0


def _q_all(values: np.ndarray, min_size: int) -> np.ndarray:
    """The energy statistic q(τ) for every split τ of each row of ``values`` (shape (rows, T) → (rows, T + 1));
    NaN where a side holds fewer than ``min_size`` values."""
    rows, t = values.shape
    dist = np.abs(values[:, :, None] - values[:, None, :])
    cum = np.zeros((rows, t + 1, t + 1))
    cum[:, 1:, 1:] = dist.cumsum(1).cumsum(2)
    tau = np.arange(t + 1)
    zero, end = np.zeros_like(tau), np.full_like(tau, t)

    def block(r0: np.ndarray, r1: np.ndarray, c0: np.ndarray, c1: np.ndarray) -> np.ndarray:
        return np.asarray(cum[:, r1, c1] - cum[:, r0, c1] - cum[:, r1, c0] + cum[:, r0, c0])

    q = np.full((rows, t + 1), np.nan)
    ok = (tau >= min_size) & (t - tau >= min_size)
    if not ok.any():
        return q
    m, n = tau[ok].astype(float), (t - tau[ok]).astype(float)
    between = block(zero[ok], tau[ok], tau[ok], end[ok])
    within_x = block(zero[ok], tau[ok], zero[ok], tau[ok]) / 2.0
    within_y = block(tau[ok], end[ok], tau[ok], end[ok]) / 2.0
    energy = 2.0 * between / (m * n) - within_x / (m * (m - 1) / 2) - within_y / (n * (n - 1) / 2)
    q[:, ok] = m * n / (m + n) * energy
    return q


def _best_split(values: np.ndarray, min_size: int) -> tuple[int, float] | None:
    q = _q_all(values[None, :], min_size)[0]
    if np.all(np.isnan(q)):
        return None
    tau = int(np.nanargmax(q))
    return tau, float(q[tau])


def _p_value(values: np.ndarray, observed: float, min_size: int, permutations: int, rng: np.random.Generator) -> float:
    """The share of ``permutations`` shuffles of ``values`` whose best split is at least ``observed``."""
    hits = 0
    for first in range(0, permutations, 250):
        count = min(250, permutations - first)
        shuffled = rng.permuted(np.tile(values, (count, 1)), axis=1)
        best = np.nanmax(_q_all(shuffled, min_size), axis=1)
        hits += int(np.sum(best >= observed))
    return (hits + 1) / (permutations + 1)


def e_divisive(
    values: Sequence[float],
    *,
    alpha: float = ALPHA,
    min_size: int = MIN_SIZE,
    permutations: int = PERMUTATIONS,
    seed: int = 0,
) -> list[ChangePoint]:
    """Every significant change point of ``values``, in index order."""
    data = np.asarray(values, dtype=float)
    if data.size < 2 * min_size or not np.all(np.isfinite(data)):
        return []
    rng = np.random.default_rng(seed)
    cuts = [0, data.size]
    found: dict[int, float] = {}
    rejected: set[tuple[int, int]] = set()
    while True:
        candidates = []
        for start, stop in itertools.pairwise(cuts):
            if (start, stop) in rejected:
                continue
            best = _best_split(data[start:stop], min_size)
            if best is not None:
                candidates.append((best[1], start, stop, start + best[0]))
        if not candidates:
            break
        q, start, stop, tau = max(candidates)
        p = _p_value(data[start:stop], q, min_size, permutations, rng)
        if p >= alpha:
            rejected.add((start, stop))
            continue
        found[tau] = p
        cuts = sorted([*cuts, tau])
    points = []
    for tau in sorted(found):
        left = max(c for c in cuts if c < tau)
        right = min(c for c in cuts if c > tau)
        before, after = data[left:tau], data[tau:right]
        points.append(ChangePoint(tau, found[tau], float(before.mean()), float(after.mean())))
    return points


@dataclass(frozen=True)
class TailShift:
    """The newest value against the regime it follows (``values[start:-1]``)."""

    start: int
    mean_before: float
    value: float
    p_value: float  # two-sided, Student-t prediction interval

    @property
    def shift_pct(self) -> float | None:
        if self.mean_before == 0:
            return None
        return (self.value / self.mean_before - 1.0) * 100.0


def tail_shift(values: Sequence[float], start: int = 0, *, min_size: int = MIN_SIZE) -> TailShift | None:
    """Is the newest value outside the regime ``values[start:-1]``? None with fewer than ``min_size`` runs
    in that regime. The p-value is that of the value under the regime's normal prediction interval
    (t = (x − mean) / (s √(1 + 1/m)), m − 1 degrees of freedom)."""
    from scipy import stats as scipy_stats  # on demand: importing it takes 0.8 s here

    data = np.asarray(values, dtype=float)
    regime = data[start:-1]
    if regime.size < min_size or data.size == 0:
        return None
    mean, sd = float(regime.mean()), float(regime.std(ddof=1))
    value = float(data[-1])
    if sd == 0:
        p = 1.0 if value == mean else 0.0
    else:
        t = (value - mean) / (sd * math.sqrt(1.0 + 1.0 / regime.size))
        p = min(1.0, 2.0 * float(scipy_stats.t.sf(abs(t), regime.size - 1)))
    return TailShift(start=start, mean_before=mean, value=value, p_value=p)
