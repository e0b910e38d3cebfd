"""How often the 95% CI of a delta over boots holds the true ratio, at the small boot counts runs have.

Equal arms (true ratio 1), each boot 5% off its arm's level at random (the seed kit saw ~2.8% across boots)
with 6 requests of 1% noise each. Two tables:

- **boots**: a plain run, N boots per arm — ``stats.ratio_ci_boots`` without blocks (what the report, the
  verdicts and the gates use with 3+ boots per arm): a Welch t-interval on the log of the boot means;
- **blocks**: a pytest-xdist run, lanes 10% apart, N blocks (one boot of each arm per block) —
  ``stats.ratio_ci_boots`` with blocks (a t-interval over the blocks' log ratios), against the same boots
  resampled per arm without blocks (what pooling would give: the lanes' difference widens it).

    python benchmarks/ci_coverage.py [--trials 2000]
"""

from __future__ import annotations

import argparse

import numpy as np

from pytest_kvcache import stats


def boot(rng: np.random.Generator, mean: float, sd: float = 0.05) -> list[float]:
    level = mean * (1 + rng.normal(0, sd))
    return list(level * (1 + rng.normal(0, 0.01, 6)))


def covered(found: tuple[float | None, float | None, float | None]) -> bool:
    _, lo, hi = found
    return lo is not None and hi is not None and lo <= 1 <= hi


def boots_coverage(per_arm: int, trials: int) -> float:
    rng = np.random.default_rng(5)
    hits = 0
    for t in range(trials):
        base = [boot(rng, 100.0) for _ in range(per_arm)]
        arm = [boot(rng, 100.0) for _ in range(per_arm)]
        hits += covered(stats.ratio_ci_boots(base, arm, seed=t))
    return hits / trials


def blocks_coverage(blocks: int, lanes: int, trials: int) -> tuple[float, float]:
    rng = np.random.default_rng(11)
    paired = pooled = 0
    for t in range(trials):
        speed = {lane: 1 + 0.1 * (lane - (lanes - 1) / 2) for lane in range(lanes)}
        labels = [k % lanes for k in range(blocks)]
        base = [[v * speed[lane] for v in boot(rng, 100.0)] for lane in labels]
        arm = [[v * speed[lane] for v in boot(rng, 100.0)] for lane in labels]
        numbers = list(range(blocks))
        paired += covered(stats.ratio_ci_boots(base, arm, base_blocks=numbers, arm_blocks=numbers, seed=t))
        pooled += covered(stats.ratio_ci_boots(base, arm, seed=t))
    return paired / trials, pooled / trials


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=2000)
    args = parser.parse_args()
    print(f"Coverage of the true ratio by the nominal 95% CI ({args.trials} simulated runs per row)\n")
    print("| boots per arm (plain run) | CI over boots |")
    print("|---|---|")
    for n in (3, 4, 6, 8):
        print(f"| {n} | {boots_coverage(n, args.trials):.1%} |")
    print("\n| blocks (lanes) | block-paired | boots pooled per arm |")
    print("|---|---|---|")
    for blocks, lanes in ((3, 3), (4, 2), (6, 3), (8, 4)):
        paired, pooled = blocks_coverage(blocks, lanes, args.trials)
        print(f"| {blocks} ({lanes}) | {paired:.1%} | {pooled:.1%} |")


if __name__ == "__main__":
    main()
