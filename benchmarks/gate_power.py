"""Measure the gate itself: simulated runs with known true effects, judged by the package's own code.

Two arms, the second slower than the first by a known effect (0%, 2%, 5%, 10%, 50%, ×5), judged by the gate
``decode_tps[short]: arm >= base * 0.97``. Each boot's level is its arm's level times exp(N(0, σ_b)), with
σ_b, the boot-to-boot spread, taken from the committed runs (``pytest_kvcache/data/noise_bands.json``, decode
rate family: the band itself, a 90% quantile, the median point, and 1.5×, 2× and 3× the band: a host noisier
than the one the band was measured on); each boot measures ``--requests``
requests with a within-boot CV of ``--within-cv``. The records go through the report's frame and
``report.gates.evaluate`` — the code the report runs, not a copy — at 1, 2 and 3 boots per arm, and with the
default adaptive rounds (1 boot per arm, a round added while ``report.build.rounds_check`` finds the gate
undecided, up to the budget of 3). It prints the share of PASS / FAIL / INCONCLUSIVE per cell: for a true
0% a FAIL is a false alarm, for the others the FAIL share is the power.

    python benchmarks/gate_power.py [--trials 400] [--platform cpu|gpu]
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np

from pytest_kvcache.config.plan import GATE_BOOT_BUDGET
from pytest_kvcache.model.records import Record
from pytest_kvcache.probes import registry
from pytest_kvcache.report import bands, gates
from pytest_kvcache.report.frame import frame
from pytest_kvcache.report.rounds import rounds_check

GATE = "decode_tps[short]: arm >= base * 0.97"
ARMS = ["base", "arm"]
EFFECTS = (("0%", 1.0), ("2%", 0.98), ("5%", 0.95), ("10%", 0.90), ("50%", 0.50), ("×5", 0.20))
SPECS = registry.resolve()


def records(rng: np.random.Generator, ratio: float, boots: int, sd: float, requests: int, cv: float) -> list[Record]:
    """One simulated run's measured records: ``boots`` boots of each arm, in ABBA order, ``requests`` each."""
    out: list[Record] = []
    for r in range(1, boots + 1):
        for arm, level in (("base", 100.0), ("arm", 100.0 * ratio)):
            boot_level = level * float(np.exp(rng.normal(0.0, sd)))
            for i, value in enumerate(boot_level * (1 + rng.normal(0.0, cv, requests))):
                record: dict[str, Any] = {
                    "arm": arm,
                    "boot": f"{arm}.r{r}",
                    "replicate": r,
                    "probe": "short",
                    "shape": "code",
                    "phase": "measured",
                    "index": i,
                    "ok": True,
                    "excluded_reason": None,
                    "metrics": {"decode_tps": float(value)},
                    "sample": {},
                }
                out.append(record)  # type: ignore[arg-type]
    return out


def judged(recs: list[Record], platform: bands.Platform, seed: int) -> str:
    data = frame(recs, SPECS)
    data["unit"], data["block"] = data["boot"], 0
    (result,) = gates.evaluate([gates.parse(GATE, arms=ARMS)], data, ARMS, seed=seed, platform=platform)
    return str(result["outcome"])


def adaptive(
    rng: np.random.Generator, ratio: float, sd: float, requests: int, cv: float, platform: bands.Platform, seed: int
) -> tuple[str, int]:
    """The default: one boot per arm, another round while the round decision finds the gate undecided."""
    full = records(rng, ratio, GATE_BOOT_BUDGET, sd, requests, cv)
    for boots in range(1, GATE_BOOT_BUDGET + 1):
        mine = [r for r in full if int(r.get("replicate") or 1) <= boots]
        done, _ = rounds_check(mine, ARMS, SPECS, None, seed, [GATE], platform=platform)
        if done or boots == GATE_BOOT_BUDGET:
            return judged(mine, platform, seed), boots
    raise AssertionError("unreachable")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=400)
    parser.add_argument("--platform", choices=("cpu", "gpu"), default="cpu")
    parser.add_argument("--requests", type=int, default=5, help="measured requests per boot (default 5)")
    parser.add_argument("--within-cv", type=float, default=0.03, help="within-boot CV of one request (default 0.03)")
    args = parser.parse_args()
    platform: bands.Platform = args.platform
    family = bands.table()["platforms"][platform]["decode rate"]
    band = float(family["boot_sd"])
    # the band itself, the median point, and hosts noisier than the band by 1.5×, 2× and 3× (a shared runner)
    spreads = (
        ("band (90% quantile)", band),
        ("median point", float(family["median"])),
        *((f"{k:g}× the band", k * band) for k in (1.5, 2.0, 3.0)),
    )
    started = time.perf_counter()
    print(f"Gate `{GATE}`, {platform.upper()} bands, {args.trials} simulated runs per cell, {args.requests} requests")
    print(f"per boot at {args.within_cv:.0%} within-boot CV; PASS / FAIL / INCONCLUSIVE shares.\n")
    print(
        "| boot-to-boot σ_b | true effect | 1 boot per arm | 2 boots | 3 boots "
        "| default (adaptive 1→3): outcome, mean boots |"
    )
    print("|---|---|---|---|---|---|")
    for label, sd in spreads:
        for name, ratio in EFFECTS:
            cells = []
            for boots in (1, 2, 3):
                rng = np.random.default_rng(1000 + boots)
                found = [
                    judged(records(rng, ratio, boots, sd, args.requests, args.within_cv), platform, t)
                    for t in range(args.trials)
                ]
                cells.append(share(found))
            rng = np.random.default_rng(7)
            runs = [adaptive(rng, ratio, sd, args.requests, args.within_cv, platform, t) for t in range(args.trials)]
            mean_boots = float(np.mean([b for _, b in runs]))
            cells.append(f"{share([o for o, _ in runs])}, {mean_boots:.2f}")
            print(f"| {label}: {sd * 100:.1f}% | {name} | " + " | ".join(cells) + " |")
    print(f"\n({time.perf_counter() - started:.0f} s)")


def share(outcomes: list[str]) -> str:
    n = len(outcomes)
    return " / ".join(f"{100 * outcomes.count(k) / n:.0f}%" for k in ("pass", "fail", "inconclusive"))


if __name__ == "__main__":
    main()
