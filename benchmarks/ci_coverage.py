"""How often the 95% CI of a delta holds the true ratio when boots vary and lanes differ (pytest-xdist).

Equal arms (true ratio 1), each boot 5% off its arm's level at random (the seed kit saw ~2.8% across boots),
lanes 10% apart, for several lanes × blocks: the block-paired CI (``stats.ratio_ci_boots`` with blocks,
what a ``-n`` run reports) against the same boots resampled per arm without blocks (what pooling would give).

    python benchmarks/ci_coverage.py [--trials 200]
"""

from __future__ import annotations

import argparse

import numpy as np

from pytest_kvcache import stats


def boot(rng: np.random.Generator, mean: float, sd: float = 0.05) -> list[float]:
    level = mean * (1 + rng.normal(0, sd))
    return list(level * (1 + rng.normal(0, 0.01, 6)))


def coverage(lanes: int, per_lane: int, trials: int) -> tuple[float, float]:
    rng = np.random.default_rng(11)
    paired = pooled = 0
    for t in range(trials):
        speed = {lane: 1 + 0.1 * (lane - (lanes - 1) / 2) for lane in range(lanes)}
        labels = [lane for lane in range(lanes) for _ in range(per_lane)]
        base = [[v * speed[lane] for v in boot(rng, 100.0)] for lane in labels]
        arm = [[v * speed[lane] for v in boot(rng, 100.0)] for lane in labels]
        blocks = list(range(len(labels)))
        _, lo, hi = stats.ratio_ci_boots(base, arm, base_blocks=blocks, arm_blocks=blocks, n_boot=1000, seed=t)
        paired += lo is not None and hi is not None and lo <= 1 <= hi
        _, lo, hi = stats.ratio_ci_boots(base, arm, n_boot=1000, seed=t)
        pooled += lo is not None and hi is not None and lo <= 1 <= hi
    return paired / trials, pooled / trials


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=200)
    args = parser.parse_args()
    print("| lanes × blocks each | block-paired | boots pooled per arm |")
    print("|---|---|---|")
    for lanes, per_lane in ((3, 1), (2, 2), (3, 2), (4, 2)):
        paired, pooled = coverage(lanes, per_lane, args.trials)
        print(f"| {lanes} × {per_lane} | {paired:.0%} | {pooled:.0%} |")


if __name__ == "__main__":
    main()
