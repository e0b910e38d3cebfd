"""The A/A acceptance suite: real A/A boots, resampled through the package's own decision code.

Three committed data sets of one configuration booted many times:

- ``quiet``: docs/results/cpu-aa (the trained default on this project's 2-core machine, nothing else running;
  ``auto`` and ``auto.2``, 5 boots each: 10 boots of one configuration), CPU bands;
- ``loaded``: tests/data/aa/cpu-loaded (the same A/A at commit 4d4bc49, on the same machine at load average
  17–24: most samples flagged ``host_cpu_busy``), CPU bands;
- ``h200``: the within-arm pairs of docs/results/h200-replicated and docs/results/h200-trained (3 boots of each
  arm: two boots of one arm are an A/A at one boot per side), GPU bands.

Each resample draws disjoint boots of that one configuration for a side ``base`` and a side ``arm`` (1, 2 or 3
per side; ``adaptive``: one per side, another while ``report.rounds.rounds_check`` — what a run asks between
rounds — finds a gate open, up to 3), relabels them, and judges them as a run would: the documented gates by
``report.gates.evaluate``, every delta by ``report.comparison.delta_rows``, ``report.spread.judge_deltas`` and
Holm (``report.multiplicity``). There is no effect, so a gate's FAIL and any better/worse is a false claim.

    python benchmarks/aa_acceptance.py [--trials 200]      # the table in docs/gates.md
"""

from __future__ import annotations

import argparse
import itertools
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pytest_kvcache.config.plan import GATE_BOOT_BUDGET
from pytest_kvcache.model.records import Record
from pytest_kvcache.report import bands, gates, spread
from pytest_kvcache.report.comparison import delta_rows
from pytest_kvcache.report.frame import frame
from pytest_kvcache.report.load import load
from pytest_kvcache.report.multiplicity import apply_holm
from pytest_kvcache.report.rounds import rounds_check

ROOT = Path(__file__).resolve().parents[1]
ARMS = ["base", "arm"]
#: The documented gates (docs/gates.md, README) on the probes these A/A runs measured; each is judged alone.
GATES = (
    "decode_tps[short]: arm >= base * 0.97",
    "decode_tps[short]: >= -10%",
    "ttft_s[short]: <= +10%",
    "ttft_s[prefill]: <= +10%",
    "prefill_tps[prefill]: >= -10%",
    "decode_tps[agentic]: arm >= base * 0.97",
    "ttft_s[agentic]: <= +10%",
)
BOOTS = (1, 2, 3)


@dataclass(frozen=True)
class Pool:
    """The boots of one configuration of one run: each boot's measured records."""

    run: str
    boots: dict[str, list[Record]]


@dataclass(frozen=True)
class DataSet:
    name: str
    platform: bands.Platform
    pools: tuple[Pool, ...]

    @property
    def probes(self) -> set[str]:
        return {str(r.get("probe")) for p in self.pools for rs in p.boots.values() for r in rs}

    def gates(self) -> list[str]:
        """The documented gates whose probe this data set measured."""
        return [g for g in GATES if g.split("[", 1)[1].split("]", 1)[0].split("@")[0] in self.probes]


def _pools(run_dir: Path, copies: bool) -> list[Pool]:
    """A run's boots by configuration: with ``copies`` the arm copies (``auto``, ``auto.2``) are one; else each
    arm is its own pool."""
    run = load(run_dir)
    by: dict[str, dict[str, list[Record]]] = {}
    for r in run.records:
        if r.get("phase") != "measured":
            continue
        arm = str(r.get("arm"))
        config = arm.split(".", 1)[0] if copies else arm
        by.setdefault(config, {}).setdefault(str(r.get("boot")), []).append(r)
    return [Pool(f"{run_dir.relative_to(ROOT)}:{config}", boots) for config, boots in by.items()]


def data_sets() -> list[DataSet]:
    quiet = _pools(ROOT / "docs/results/cpu-aa/run", copies=True)
    loaded = _pools(ROOT / "tests/data/aa/cpu-loaded/run", copies=True)
    h200 = [
        *_pools(ROOT / "docs/results/h200-replicated/run", copies=False),
        *_pools(ROOT / "docs/results/h200-trained/run", copies=False),
    ]
    return [
        DataSet("quiet", "cpu", tuple(quiet)),
        DataSet("loaded", "cpu", tuple(loaded)),
        DataSet("h200", "gpu", tuple(h200)),
    ]


def relabel(pool: Pool, base: Sequence[str], arm: Sequence[str], strip_flags: bool = False) -> list[Record]:
    """The records of boots ``base`` and ``arm`` of ``pool`` as a two-arm run: ``base.rN`` and ``arm.rN``;
    ``strip_flags`` takes their flags off (what a run that never looked at its host would judge)."""
    out: list[Record] = []
    for side, picked in (("base", base), ("arm", arm)):
        for n, boot in enumerate(picked, 1):
            for r in pool.boots[boot]:
                row: Record = {**r, "arm": side, "boot": f"{side}.r{n}", "replicate": n}  # type: ignore[typeddict-item]
                if strip_flags:
                    row["flags"] = []
                out.append(row)
    return out


@dataclass(frozen=True)
class Outcome:
    """One resampled run: which gates failed, whether any delta read better/worse, the boots it used."""

    failed: frozenset[str]
    directional: bool
    boots: int


def judge(records: list[Record], gate_texts: Sequence[str], platform: bands.Platform, boots: int) -> Outcome:
    specs = _specs()
    data = frame(records, specs)
    data["unit"], data["block"] = data["boot"], 0
    parsed = [gates.parse(text, arms=ARMS) for text in gate_texts]
    results = gates.evaluate(parsed, data, ARMS, seed=0, specs=specs, platform=platform)
    failed = {r["gate"] for r in results if r["outcome"] == "fail"}
    deltas = delta_rows(data, ARMS, specs, 0)
    spread.judge_deltas(deltas, platform)
    apply_holm(deltas)
    directional = any(d.get("verdict") in ("better", "worse") for d in deltas)
    return Outcome(frozenset(failed), directional, boots)


def _specs() -> Any:
    from pytest_kvcache.probes import registry

    return registry.resolve()


def draws(pool: Pool, per_side: int, trials: int, rng: np.random.Generator) -> Iterator[tuple[list[str], list[str]]]:
    """Disjoint (base, arm) boot draws of ``pool``: every ordered pair at one boot per side when there are few,
    else ``trials`` random draws."""
    names = sorted(pool.boots)
    if len(names) < 2 * per_side:
        return
    if per_side == 1 and len(names) * (len(names) - 1) <= trials:
        for a, b in itertools.permutations(names, 2):
            yield [a], [b]
        return
    for _ in range(trials):
        picked = [str(x) for x in rng.choice(names, size=2 * per_side, replace=False)]
        yield picked[:per_side], picked[per_side:]


def adaptive(
    pool: Pool, gate_texts: Sequence[str], platform: bands.Platform, rng: np.random.Generator, strip_flags: bool = False
) -> Outcome:
    """One boot per side, another round while ``rounds_check`` finds a gate open, up to the boot budget."""
    specs = _specs()
    names = sorted(pool.boots)
    budget = min(GATE_BOOT_BUDGET, len(names) // 2)
    picked = [str(x) for x in rng.choice(names, size=2 * budget, replace=False)]
    for n in range(1, budget + 1):
        records = relabel(pool, picked[:n], picked[budget : budget + n], strip_flags)
        done, _ = rounds_check(records, ARMS, specs, None, 0, list(gate_texts), platform=platform)
        if done or n == budget:
            return judge(records, gate_texts, platform, n)
    raise AssertionError("unreachable")


@dataclass(frozen=True)
class Cell:
    """One data set at one boot count: runs, false FAILs per gate, runs with any better/worse."""

    data: str
    boots: str
    runs: int
    fails: dict[str, int]
    directional: int
    mean_boots: float

    def fail_rate(self, gate: str) -> float:
        return self.fails.get(gate, 0) / self.runs if self.runs else 0.0

    @property
    def directional_rate(self) -> float:
        return self.directional / self.runs if self.runs else 0.0


def cell(data: DataSet, boots: int | str, trials: int, seed: int = 0, strip_flags: bool = False) -> Cell:
    """Resample ``data`` at ``boots`` per side (or ``"adaptive"``), ``trials`` draws per pool (all pairs at 1
    where they are no more); ``strip_flags``: judged as if no sample had seen the host busy."""
    rng = np.random.default_rng(seed)
    gate_texts = data.gates()
    outcomes: list[Outcome] = []
    for pool in data.pools:
        if boots == "adaptive":
            if len(pool.boots) >= 4:  # at least 2 boots a side: else it is the one-boot cell
                outcomes += [adaptive(pool, gate_texts, data.platform, rng, strip_flags) for _ in range(trials)]
            continue
        per_side = int(boots)
        for base, arm in draws(pool, per_side, trials, rng):
            outcomes.append(judge(relabel(pool, base, arm, strip_flags), gate_texts, data.platform, per_side))
    fails = {g: sum(g in o.failed for o in outcomes) for g in gate_texts}
    mean = float(np.mean([o.boots for o in outcomes])) if outcomes else 0.0
    return Cell(data.name, str(boots), len(outcomes), fails, sum(o.directional for o in outcomes), mean)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=200, help="random draws per pool and cell (all pairs at 1)")
    args = parser.parse_args()
    started = time.perf_counter()
    print("| data | boots per side | runs | false FAIL per gate (worst gate) | runs with any better/worse |")
    print("|---|---|---|---|---|")
    for data in data_sets():
        for boots in (*BOOTS, "adaptive"):
            found = cell(data, boots, args.trials)
            if not found.runs:
                continue
            worst = max(found.fails, key=found.fail_rate) if found.fails else None
            rates = ", ".join(f"`{g}` {found.fail_rate(g):.1%}" for g in found.fails)
            label = f"adaptive (mean {found.mean_boots:.2f})" if boots == "adaptive" else str(boots)
            worst_text = f" — worst `{worst}`" if worst else ""
            print(f"| {data.name} | {label} | {found.runs} | {rates}{worst_text} | {found.directional_rate:.1%} |")
    print(f"\n({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
