"""The retrieval probe's statistics, apart from its records: a proportion's Wilson and Clopper–Pearson
intervals, the exact McNemar test, and two intervals of a paired difference of proportions — Newcombe's hybrid
score interval (a gate's) and the exact one a cell's verdict is decided on (``report.retrieval``).

Plain Python: no pytest.
"""

from __future__ import annotations

import math

from pytest_kvcache import stats


def wilson_interval(found: int, n: int, confidence: float = stats.CONFIDENCE) -> tuple[float, float]:
    """The Wilson score interval for ``found`` successes in ``n`` trials (no continuity correction): the
    proportions a score test does not reject. ``n`` must be positive."""
    if n <= 0:
        raise ValueError("a Wilson interval needs at least one trial")
    z = stats.t_quantile(math.inf, confidence)
    p = found / n
    scale = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / scale
    half = z / scale * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, centre - half), min(1.0, centre + half)


def paired_difference_interval(
    both: int, base_only: int, arm_only: int, neither: int, confidence: float = stats.CONFIDENCE
) -> tuple[float, float]:
    """Newcombe's hybrid score interval (1998, method 10) for the paired difference ``p_arm − p_base``.

    With ``(l1, u1)`` and ``(l2, u2)`` the Wilson intervals of the arm's and the baseline's accuracy:
    ``L = D − √((p_arm − l1)² − 2φ(p_arm − l1)(u2 − p_base) + (u2 − p_base)²)`` and
    ``U = D + √((u1 − p_arm)² − 2φ(u1 − p_arm)(p_base − l2) + (p_base − l2)²)``, where φ is the correlation of
    the paired outcomes, ``(ad − bc) / √(marginal product)`` with its numerator shrunk by ``n/2`` when positive
    (0 between 0 and ``n/2``), and 0 when a marginal is empty. A positive correlation (the usual case: both
    arms find the easy needles) narrows the interval; the square-and-add of the two Wilson intervals keeps
    its good coverage next to 0% and 100%. Clipped to [−1, 1]."""
    n = both + base_only + arm_only + neither
    if n <= 0:
        raise ValueError("a paired interval needs at least one pair")
    p_arm, p_base = (both + arm_only) / n, (both + base_only) / n
    l1, u1 = wilson_interval(both + arm_only, n, confidence)
    l2, u2 = wilson_interval(both + base_only, n, confidence)
    marginals = (both + arm_only) * (base_only + neither) * (both + base_only) * (arm_only + neither)
    phi = 0.0
    if marginals > 0:
        cross = both * neither - base_only * arm_only
        phi = (cross - n / 2 if cross > n / 2 else 0.0 if cross >= 0 else cross) / math.sqrt(marginals)
    diff = p_arm - p_base
    down_arm, up_base = p_arm - l1, u2 - p_base
    up_arm, down_base = u1 - p_arm, p_base - l2
    lower = diff - math.sqrt(max(0.0, down_arm**2 - 2 * phi * down_arm * up_base + up_base**2))
    upper = diff + math.sqrt(max(0.0, up_arm**2 - 2 * phi * up_arm * down_base + down_base**2))
    return max(-1.0, lower), min(1.0, upper)


def mcnemar_p(base_only: int, arm_only: int) -> float:
    """The exact McNemar test's two-sided p-value: the discordant pairs against a fair coin, twice the smaller
    tail (the fair coin's distribution is symmetric: scipy's ``binomtest`` gives the same), 1.0 with none."""
    from scipy import stats as scipy_stats

    if base_only + arm_only == 0:
        return 1.0
    return min(1.0, 2 * float(scipy_stats.binom.cdf(min(base_only, arm_only), base_only + arm_only, 0.5)))


def clopper_pearson(found: int, n: int, alpha: float) -> tuple[float, float]:
    """The exact (Clopper–Pearson) interval of a proportion at ``1 − alpha``: the central one, whose exclusion of
    a value is the two-sided binomial test's (twice the smaller tail) below ``alpha``."""
    from scipy import stats as scipy_stats

    low = 0.0 if found == 0 else float(scipy_stats.beta.ppf(alpha / 2, found, n - found + 1))
    high = 1.0 if found == n else float(scipy_stats.beta.ppf(1 - alpha / 2, found + 1, n - found))
    return low, high


def exact_difference_interval(base_only: int, arm_only: int, n: int, alpha: float) -> tuple[float, float]:
    """The paired difference ``(arm_only − base_only) / n`` at ``1 − alpha``, from the exact test that decides it.

    The difference is the discordance rate ``r`` (needles found by one arm only) times ``2s − 1``, where ``s`` is
    the share of them the arm found. The exact McNemar test is the two-sided binomial test of ``s = ½``; its
    Clopper–Pearson interval for ``s`` excludes ½ exactly when that p is below ``alpha``. The interval takes
    ``2s − 1`` over that interval, scaled by the Clopper–Pearson bounds of ``r`` toward the wider side: it excludes
    0 exactly when the test rejects, and it is conservative (the two ranges are taken together). With no
    discordant needle ``s`` is unconstrained and the interval is ±the upper bound of ``r``."""
    if n <= 0:
        raise ValueError("a paired interval needs at least one pair")
    discordant = base_only + arm_only
    rate_low, rate_high = clopper_pearson(discordant, n, alpha)
    low_s, high_s = -1.0, 1.0
    if discordant:
        share_low, share_high = clopper_pearson(arm_only, discordant, alpha)
        low_s, high_s = 2 * share_low - 1, 2 * share_high - 1
    low = low_s * (rate_high if low_s < 0 else rate_low)
    high = high_s * (rate_high if high_s > 0 else rate_low)
    return max(-1.0, low), min(1.0, high)
