"""Summary statistics of measured samples (numpy)."""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from pytest_kvcache.metrics import catalogue
from pytest_kvcache.model.base import Verdict


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


def _by_block(
    groups: Sequence[Sequence[float]], blocks: Sequence[object] | None
) -> dict[object, list[Sequence[float]]]:
    """Boots (non-empty sample groups) per block label, in first-seen order."""
    labels: Sequence[object] = blocks if blocks is not None else [None] * len(groups)
    if len(labels) != len(groups):
        raise ValueError("one block label per boot")
    out: dict[object, list[Sequence[float]]] = {}
    for label, group in zip(labels, groups, strict=True):
        if len(group):
            out.setdefault(label, []).append(group)
    return out


def ratio_ci_boots(
    base: Sequence[Sequence[float]],
    arm: Sequence[Sequence[float]],
    *,
    base_blocks: Sequence[object] | None = None,
    arm_blocks: Sequence[object] | None = None,
    n_boot: int = BOOTSTRAP_SAMPLES,
    confidence: float = CONFIDENCE,
    seed: int = 0,
) -> tuple[float | None, float | None, float | None]:
    """Ratio arm/base over boots, with a CI that holds at a few boots: the boot is the unit.

    ``base``/``arm`` hold one sequence of samples per boot. Each boot counts once, by its mean, however many
    samples it holds, and the CI covers boot-to-boot variation as well as the noise within a boot (a boot's
    mean carries both). The estimate is the ratio of the geometric means of the boot means, and the CI a
    Welch t-interval on the log of the boot means (``log_t_ratio``): a percentile bootstrap over 3–8 boots
    covers the true ratio in only 76–85% of runs at a nominal 95% (``benchmarks/ci_coverage.py``), the
    t-interval in about 95%. Boots without samples are ignored; fewer than 2 boots on a side gives no CI.

    ``base_blocks``/``arm_blocks`` (one label per boot) name the block each boot ran in under pytest-xdist —
    one boot of every arm, back to back on one lane. With more than one block the comparison is paired
    by block: each block's log ratio (arm boot mean / baseline boot mean, both on the same lane), a
    t-interval over the blocks (``blocks - 1`` degrees of freedom). A lane faster for every arm moves no
    block's ratio, so neither the estimate nor its CI; and since every block is a unit the CI still covers
    boot-to-boot variation, however few blocks a lane ran. Blocks that lack one side (a boot that failed,
    a worker that died) are left out. Without blocks (a plain run) the boots of each arm stand on their own.

    A metric whose boot means are not all positive has no log: it falls back to the hierarchical percentile
    bootstrap (boots, then samples; ``n_boot`` resamples seeded with ``seed``).
    """
    by_base, by_arm = _by_block(base, base_blocks), _by_block(arm, arm_blocks)
    paired = [b for b in by_base if b in by_arm]
    if base_blocks is not None and len(set(base_blocks)) > 1 and paired:
        return _block_ratio_ci(
            [(by_base[b], by_arm[b]) for b in paired], n_boot=n_boot, confidence=confidence, seed=seed
        )
    b = [x for x in base if len(x)]
    a = [x for x in arm if len(x)]
    if not b or not a:
        return None, None, None
    base_means = np.asarray([np.mean(x) for x in b], dtype=float)
    arm_means = np.asarray([np.mean(x) for x in a], dtype=float)
    if (base_means > 0).all() and (arm_means > 0).all():
        return log_t_ratio(base_means.tolist(), arm_means.tolist(), confidence)
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


@functools.lru_cache(maxsize=4096)
def t_quantile(df: float, confidence: float = CONFIDENCE) -> float:
    """The two-sided Student t quantile (scipy) for ``df`` degrees of freedom; the normal one for inf. Kept per
    (df, confidence): a report asks for the same few many times (a quarter of an A/A acceptance cell's time)."""
    from scipy import stats as scipy_stats

    tail = 1 - (1 - confidence) / 2
    if not math.isfinite(df):
        return float(scipy_stats.norm.ppf(tail))
    return float(scipy_stats.t.ppf(tail, df))


def welch_df(var_a: float, n_a: int, var_b: float, n_b: int) -> float:
    """Welch–Satterthwaite degrees of freedom of a difference of two means (inf when both variances are 0)."""
    va, vb = var_a / n_a, var_b / n_b
    den = va**2 / (n_a - 1) + vb**2 / (n_b - 1)
    return (va + vb) ** 2 / den if den > 0 else math.inf


def log_t_ratio(
    base_means: Sequence[float], arm_means: Sequence[float], confidence: float = CONFIDENCE
) -> tuple[float | None, float | None, float | None]:
    """Ratio of geometric means of positive boot means, arm/base, and its Welch t-interval on the log scale.
    Fewer than 2 means on a side: the ratio without a CI."""
    la = np.log(np.asarray(arm_means, dtype=float))
    lb = np.log(np.asarray(base_means, dtype=float))
    if not la.size or not lb.size:
        return None, None, None
    diff = float(la.mean() - lb.mean())
    ratio = math.exp(diff)
    if la.size < 2 or lb.size < 2:
        return ratio, None, None
    var_a, var_b = float(la.var(ddof=1)), float(lb.var(ddof=1))
    se = math.sqrt(var_a / la.size + var_b / lb.size)
    half = t_quantile(welch_df(var_a, la.size, var_b, lb.size), confidence) * se if se > 0 else 0.0
    return ratio, math.exp(diff - half), math.exp(diff + half)


def _block_ratio_ci(
    blocks: Sequence[tuple[Sequence[Sequence[float]], Sequence[Sequence[float]]]],
    *,
    n_boot: int,
    confidence: float,
    seed: int,
) -> tuple[float | None, float | None, float | None]:
    """Geometric mean of per-block ratios and its t-interval over the blocks (``blocks - 1`` df); a block with
    a mean that is not positive falls back to resampling blocks, then samples within each boot."""
    observed: list[float] = []
    for base, arm in blocks:
        base_mean = float(np.mean([np.mean(x) for x in base]))
        arm_mean = float(np.mean([np.mean(x) for x in arm]))
        if base_mean == 0:
            return None, None, None
        observed.append(arm_mean / base_mean)
    if all(r > 0 for r in observed):
        logs = np.log(np.asarray(observed))
        ratio = math.exp(float(logs.mean()))
        if len(logs) < 2:
            return ratio, None, None
        se = float(logs.std(ddof=1)) / math.sqrt(len(logs))
        half = t_quantile(len(logs) - 1, confidence) * se if se > 0 else 0.0
        return ratio, ratio * math.exp(-half), ratio * math.exp(half)
    rng = _rng(seed)
    resampled: list[np.ndarray] = []  # per block: n_boot resampled ratios
    for base, arm in blocks:
        _, base_boot = _boot_level_means(base, rng, n_boot)
        _, arm_boot = _boot_level_means(arm, rng, n_boot)
        resampled.append(arm_boot / base_boot)
    ratio = float(np.mean(observed))
    if len(blocks) < 2:
        return ratio, None, None
    table = np.stack(resampled)  # blocks × n_boot
    picks = rng.integers(0, len(blocks), size=(n_boot, len(blocks)))
    boot = table[picks, np.arange(n_boot)[:, None]].mean(axis=1)
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
    boots: Sequence[Sequence[float]], *, confidence: float = CONFIDENCE
) -> tuple[float | None, float | None, float | None]:
    """Mean of boot-level means and its t-interval over the boot means (``boots - 1`` df): each boot counts
    once, and the CI covers boot-to-boot variation. Fewer than 2 boots: no CI."""
    groups = [x for x in boots if len(x)]
    if not groups:
        return None, None, None
    means = np.asarray([np.mean(x) for x in groups], dtype=float)
    mean = float(means.mean())
    if len(groups) < 2:
        return mean, None, None
    se = float(means.std(ddof=1)) / math.sqrt(len(groups))
    half = t_quantile(len(groups) - 1, confidence) * se
    return mean, mean - half, mean + half


#: The fewest clusters (texts, prompts) a CI over clusters is computed from: a t-interval over 2 has 1 degree of
#: freedom (±12.7 standard errors), and 2 texts or prompts say little of a third.
MIN_CLUSTERS = 3


def mean_ci_clusters(
    means: Sequence[float], *, confidence: float = CONFIDENCE, min_clusters: int = MIN_CLUSTERS
) -> tuple[float | None, float | None, float | None]:
    """Mean of cluster means and Student's t-interval over them (``clusters − 1`` df): the CI of a measure that
    is deterministic across boots (fidelity, speculative acceptance), replicated over the texts or prompts it
    was measured on instead. No interval with fewer than ``min_clusters``; cluster means that are all equal give
    a zero-width interval at that value (exactly: their float mean may differ from each in the last bit)."""
    values = np.asarray(means, dtype=float)
    if values.size == 0:
        return None, None, None
    if values.min() == values.max():
        mean = float(values[0])
        return (mean, mean, mean) if values.size >= min_clusters else (mean, None, None)
    mean = float(values.mean())
    if values.size < min_clusters:
        return mean, None, None
    half = t_quantile(values.size - 1, confidence) * float(values.std(ddof=1)) / math.sqrt(values.size)
    return mean, mean - half, mean + half


def widen(
    centre: float,
    lo: float,
    hi: float,
    boot_sd: float,
    boots: Sequence[int],
    confidence: float = CONFIDENCE,
    df: float = math.inf,
) -> tuple[float, float]:
    """A within-boot CI ``[lo, hi]`` of a ratio (``boots``: base's, arm's) or of one arm's mean (``boots``: its
    own) widened by the boot-to-boot variation it cannot see.

    ``boot_sd`` is the standard deviation of the log of one boot's mean around its arm's level (a default band
    per metric family, ``report.bands``). The within-boot CI's half-width on the log scale gives its standard
    error; the boot component of the log's variance is ``boot_sd² · Σ 1/boots``; the two add, and the interval
    is the normal one around ``centre`` (Student's t on ``df`` degrees of freedom where ``boot_sd`` was estimated
    from a few boots): it shrinks as boots are added. A centre or bound that is not positive (a ratio of
    differences, a mean that can be negative) has no log scale: the same sum, linearly. On the log scale a
    positive time or rate never reaches 0."""
    z = t_quantile(df, confidence)
    normal = t_quantile(math.inf, confidence)
    boot_var = boot_sd**2 * sum(1 / max(b, 1) for b in boots)
    if centre <= 0 or lo <= 0 or hi <= 0:
        total = math.sqrt(((hi - lo) / (2 * normal)) ** 2 + abs(centre) ** 2 * boot_var)
        return centre - z * total, centre + z * total
    total = math.sqrt(((math.log(hi) - math.log(lo)) / (2 * normal)) ** 2 + boot_var)
    return math.exp(math.log(centre) - z * total), math.exp(math.log(centre) + z * total)


def verdict(metric: str, lo: float | None, hi: float | None) -> Verdict:
    """Direction-aware and three-valued: a CI of the ratio that contains 1 is inconclusive."""
    if lo is None or hi is None:
        return "inconclusive"
    if lo > 1.0:
        return "better" if catalogue.higher_is_better(metric) else "worse"
    if hi < 1.0:
        return "worse" if catalogue.higher_is_better(metric) else "better"
    return "inconclusive"


#: The family-wise error rate Holm's step-down procedure holds within each family of deltas
#: (one arm and probe over its points and metrics; ``report.multiplicity``).
FAMILY_ALPHA = 0.05


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values (Holm 1979): the i-th smallest of m p-values times (m − i + 1),
    made monotone (running maximum) and capped at 1. Rejecting where the adjusted p < α holds the family-wise
    error rate at α; the same numbers as statsmodels' ``multipletests(method="holm")``."""
    p = np.asarray(p_values, dtype=float)
    m = len(p)
    if m == 0:
        return []
    order = np.argsort(p, kind="stable")
    stepped = np.maximum.accumulate((m - np.arange(m)) * p[order])
    adjusted = np.empty(m)
    adjusted[order] = np.minimum(stepped, 1.0)
    return [float(v) for v in adjusted]


def holm_levels(p_values: Sequence[float], alpha: float = FAMILY_ALPHA) -> list[float]:
    """Each hypothesis's α at its step of Holm's procedure, so that an interval at ``1 − level`` excludes the null
    exactly when Holm rejects it: the i-th smallest p is tested at α / (m − i + 1) while every smaller one was
    rejected; from the first that was not, each later one gets that first failing step's α (its p is at least
    that step's, so its interval holds the null too)."""
    p = np.asarray(p_values, dtype=float)
    m = len(p)
    levels = np.empty(m)
    stopped: float | None = None
    for rank, i in enumerate(np.argsort(p, kind="stable")):
        step = alpha / (m - rank)
        if stopped is None and p[i] >= step:
            stopped = step
        levels[i] = step if stopped is None else stopped
    return [float(v) for v in levels]


def ratio_df_boots(
    base: Sequence[Sequence[float]],
    arm: Sequence[Sequence[float]],
    *,
    base_blocks: Sequence[object] | None = None,
    arm_blocks: Sequence[object] | None = None,
) -> float | None:
    """The degrees of freedom of :func:`ratio_ci_boots`'s t-interval on the same boots: blocks − 1 when paired
    by block, else Welch–Satterthwaite on the log boot means (inf: no spread); None where it falls back to a
    percentile bootstrap or gives no CI. Read by :func:`interval_p_value` (the t-test the interval is)."""
    by_base, by_arm = _by_block(base, base_blocks), _by_block(arm, arm_blocks)
    paired = [b for b in by_base if b in by_arm]
    if base_blocks is not None and len(set(base_blocks)) > 1 and paired:
        ratios = [
            float(np.mean([np.mean(x) for x in by_arm[b]])) / float(np.mean([np.mean(x) for x in by_base[b]]))
            for b in paired
            if float(np.mean([np.mean(x) for x in by_base[b]])) != 0
        ]
        return float(len(ratios) - 1) if len(ratios) == len(paired) >= 2 and all(r > 0 for r in ratios) else None
    b = np.asarray([np.mean(x) for x in base if len(x)], dtype=float)
    a = np.asarray([np.mean(x) for x in arm if len(x)], dtype=float)
    if b.size < 2 or a.size < 2 or not (b > 0).all() or not (a > 0).all():
        return None
    la, lb = np.log(a), np.log(b)
    return welch_df(float(la.var(ddof=1)), la.size, float(lb.var(ddof=1)), lb.size)


def interval_p_value(
    ratio: float, lo: float, hi: float, confidence: float = CONFIDENCE, df: float | None = None
) -> float:
    """The two-sided p-value of H0: ratio = 1 that agrees with the ``confidence`` interval [lo, hi] a verdict
    is decided on, on the log-ratio scale, its standard error read from the half of the interval that faces
    parity: with ``df`` (a t-interval over boots or blocks: ``ratio_df_boots``) the t-test that interval
    inverts, else the normal approximation (a bootstrap or widened interval). So p < 1 − confidence exactly
    when the interval excludes 1 (up to floating point), for a symmetric or a skewed interval alike."""
    from scipy import stats as scipy_stats

    if not ratio > 0 or ratio == 1.0:
        return 1.0
    bound = lo if ratio > 1 else hi
    if (bound - ratio) * (ratio - 1) > 0:
        return 0.0  # the estimate lies outside its own interval on the far side of parity: excluded anyway
    if not bound > 0:
        return 1.0
    distance = abs(math.log(ratio) - math.log(bound))
    if distance == 0:
        return 0.0  # a degenerate interval [r, r] away from parity
    if df is not None and math.isfinite(df) and df > 0:
        t = abs(math.log(ratio)) / (distance / t_quantile(df, confidence))
        return float(2 * scipy_stats.t.sf(t, df))
    z = abs(math.log(ratio)) / (distance / t_quantile(math.inf, confidence))
    return float(2 * scipy_stats.norm.sf(z))


def pooled_log_sd(*sides: Sequence[Sequence[float]]) -> tuple[float, int] | None:
    """The pooled standard deviation of log(boot mean) within each side (each side a list of boots, each boot
    its values) and its degrees of freedom (boots − 1 summed over the sides); None without a side of 2+ boots
    with positive means. It holds the boot-to-boot spread and the within-boot noise of each mean alike."""
    squares, df = 0.0, 0
    for boots in sides:
        means = [float(np.mean(b)) for b in boots if len(b)]
        logs = np.log([m for m in means if m > 0])
        if logs.size >= 2:
            squares += float(np.sum((logs - logs.mean()) ** 2))
            df += int(logs.size) - 1
    if df < 1:
        return None
    return math.sqrt(squares / df), df
