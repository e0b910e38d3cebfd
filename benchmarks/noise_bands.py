"""Derive the default boot-to-boot bands (``pytest_kvcache/data/noise_bands.json``) from committed run folders.

For every run folder: its platform (GPU when a boot's evidence saw a GPU), and for every arm, probe, point
and metric with 2 or more boots, the spread of the boots' means on the log scale with the part the samples
within each boot explain taken out (method of moments: var(log boot mean) − mean(within CV² / n), at least 0)
— the boot-to-boot standard deviation σ_b of that point. Copies of one arm in an A/A run (``auto``,
``auto.2``) are one arm: their boots are boots of the same configuration. Samples the run flagged
``host_cpu_busy`` (the host busy outside the engine and the client, docs/host-cpu.md) are left out: they
measure the other work on the host, not the boot.

A family's band is the ``--quantile`` (default 0.9) of its points' σ_b on one platform: most points of every
committed workload sit inside it, so a gate judged with it at one or two boots per arm keeps its false alarms
low (``benchmarks/gate_power.py`` measures them), and an undecided gate gets more boots, where the band no
longer matters (3+ boots: the CI is over boots). A family without points on a platform takes the other
platform's band.

The capacity family is a search's knee, one whole number of sessions per boot with no within-boot samples to
take out: per configuration and depth of a capacity A/A (``CAPACITY_RUNS``, and any run given with one), the
SD of log(knee) between the boots, floored at one search step at the smallest knee k, log((k + 1) / k) — two
boots that agree on a knee of 6 show no spread, but one session's step there is 15%.

    python benchmarks/noise_bands.py                      # the committed runs, written to the package
    python benchmarks/noise_bands.py RUN_DIR ... --out FILE --print
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path

import numpy as np

from pytest_kvcache.metrics import catalogue
from pytest_kvcache.report import bands
from pytest_kvcache.report.load import load
from pytest_kvcache.report.points import spec_of

ROOT = Path(__file__).resolve().parents[1]
#: The committed multi-boot runs (and A/A pairs) the default bands come from. Left out:
#: h200-scale-out-one-card (two lanes sharing one card at once: boots disturb each other by design) and
#: single-boot runs without a copy of an arm (no boot-to-boot spread to see).
DEFAULT_RUNS = (
    "docs/results/cpu-aa/run",
    "docs/results/h200-replicated/run",
    "docs/results/h200-agreement/run",
    "docs/results/h200-fidelity/run",
    "docs/results/h200-trained/run",
)
#: A/A runs on a loaded host, for the widest spread only (``widest`` in the file, ``report.spread``): the CPU
#: A/A of commit 4d4bc49, on this project's 2-core machine at load average 17–24 (tests/data/aa/cpu-loaded).
WIDE_RUNS = ("tests/data/aa/cpu-loaded/run",)
OUT = ROOT / "pytest_kvcache" / "data" / bands.FILE
#: Committed runs with a capacity A/A (two or more boots of one configuration: ``auto`` and ``auto.2``), for the
#: capacity family only (:func:`capacity_points`): the CPU capacity run of docs/results/cpu-capacity.
CAPACITY_RUNS = ("docs/results/cpu-capacity/run",)
CAPACITY = "capacity"
#: The estimated parameter count of each committed run's model, for runs made before ``run.json`` recorded
#: ``model_size`` (``config.model_files.parameters`` on each model's config): the SmolLM2-135M of the embedded
#: default and of h200-trained, the seeded-random embedded tiny Qwen3 (4,194,304 without norms), and the
#: 8B-shaped dummy model fixtures/qwen3-8b-shape (its vocabulary cut to 4,096).
LEGACY_PARAMETERS = {
    "docs/results/cpu-aa/run": 134_479_872,
    "docs/results/h200-replicated/run": 6_979_321_856,
    "docs/results/h200-agreement/run": 4_194_304,
    "docs/results/h200-fidelity/run": 4_194_304,
    "docs/results/h200-trained/run": 134_479_872,
}


def model_class(run_dir: Path) -> str | None:
    """The size class (``report.bands.size_class``) of a run's model: from its ``run.json``'s ``model_size``,
    else :data:`LEGACY_PARAMETERS`; None: not known."""
    size = json.loads((run_dir / "run.json").read_text(encoding="utf-8")).get("model_size") or {}
    found = size.get("parameters") if isinstance(size, dict) else None
    found = found if isinstance(found, int) else LEGACY_PARAMETERS.get(_rel(run_dir))
    return bands.size_class(found) if found is not None else None


def arm_of(name: str) -> str:
    """``auto.2`` → ``auto``: a copy of an arm is the same configuration."""
    return re.sub(r"\.\d+$", "", name)


def _busy(busy: set[tuple[object, ...]], key: tuple[object, object, object, object]) -> bool:
    boot, probe, point, index = key
    return any(b[0] == boot and b[1] == probe and b[5] == index and point in {b[2], _label(b)} for b in busy)


def _label(b: tuple[object, ...]) -> str:
    depth, turn = b[3], b[4]
    if turn is not None:
        return f"turn{turn}"
    if isinstance(depth, int):
        return f"{depth // 1000}k" if depth % 1000 == 0 else str(depth)
    return str(b[2])


def points(run_dir: Path, keep_busy: bool = False) -> tuple[str, list[dict[str, object]]]:
    """The run's platform and one entry per arm, probe, point and metric with 2+ boots: σ_b and its df;
    samples that saw the host busy are left out unless ``keep_busy`` (the widest spread keeps them)."""
    run = load(run_dir)
    platform = bands.platform_of(run.evidence)
    data = run.frame
    if data.empty:
        return platform, []
    data = data[data["valid"]].copy()
    if "flagged" in data and run.records and not keep_busy:  # a busy-host sample measured the other work
        busy = {
            (r.get("boot"), r.get("probe"), r.get("shape"), r.get("depth"), r.get("turn"), r.get("index"))
            for r in run.records
            if "host_cpu_busy" in (r.get("flags") or [])
        }
        keys = zip(data["boot"], data["probe"], data["point"], data["index"], strict=True)
        data = data[[not _busy(busy, k) for k in keys]]
    data["config"] = [arm_of(str(a)) for a in data["arm"]]
    found: list[dict[str, object]] = []
    for (config, probe, point), group in data.groupby(["config", "probe", "point"]):
        measured = spec_of(str(probe), run.specs).metrics  # the probe's metrics, not the frame's other columns
        for metric in group.columns:
            name = catalogue.family(str(metric))
            if name is None or name == CAPACITY or metric not in measured:  # a knee: capacity_points
                continue
            per_boot = group.groupby("boot")[metric].agg(lambda v: [float(x) for x in v if x is not None and x == x])
            stats = [(np.mean(v), np.var(v, ddof=1) / len(v)) for v in per_boot if len(v) >= 2]
            stats = [(m, w) for m, w in stats if m > 0]
            if len(stats) < 2:
                continue
            logs = np.log([m for m, _ in stats])
            within = float(np.mean([w / m**2 for m, w in stats]))
            sigma = math.sqrt(max(float(np.var(logs, ddof=1)) - within, 0.0))
            found.append(
                {
                    "run": _rel(run_dir),
                    "config": config,
                    "probe": probe,
                    "point": point,
                    "metric": metric,
                    "family": name,
                    "boots": len(stats),
                    "boot_sd": sigma,
                }
            )
    return platform, found


def capacity_points(run_dir: Path) -> tuple[str, list[dict[str, object]]]:
    """The run's platform and one entry per configuration and depth of the capacity probe with 2+ boots: σ of
    log(knee) between the boots, at least one search step at the knee, log((k + 1) / k) with k the smallest knee
    — a knee is a whole number of sessions, so two boots that agree show no spread a step could not hide (the
    ``floor`` the entry says it took)."""
    run = load(run_dir)
    platform = bands.platform_of(run.evidence)
    data = run.frame
    if data.empty or "probe" not in data:
        return platform, []
    data = data[(data["probe"] == CAPACITY) & data["valid"]].copy()
    data["config"] = [arm_of(str(a)) for a in data["arm"]]
    found: list[dict[str, object]] = []
    for (config, point), group in data.groupby(["config", "point"]):
        knees = [float(k) for k in group[CAPACITY] if k is not None and k == k and k > 0]
        if len(knees) < 2:
            continue
        sd = float(np.std(np.log(knees), ddof=1))
        step = math.log((min(knees) + 1) / min(knees))
        found.append(
            {
                "run": _rel(run_dir),
                "config": config,
                "probe": CAPACITY,
                "point": point,
                "metric": CAPACITY,
                "family": CAPACITY,
                "boots": len(knees),
                "knees": knees,
                "sd": sd,
                "floor": sd < step,
                "boot_sd": max(sd, step),
            }
        )
    return platform, found


def _capacity_source(found: list[dict[str, object]], quantile: float) -> str:
    runs = ", ".join(dict.fromkeys(str(p["run"]) for p in found))
    said = "; ".join(
        f"{p['config']} capacity@{p['point']}: knees {', '.join(f'{float(k):.0f}' for k in p['knees'])}"  # type: ignore[attr-defined]
        + (
            f", SD of log knee {float(str(p['sd'])) * 100:.1f}% under one session's step at the knee "
            f"(log({min(p['knees']) + 1:.0f}/{min(p['knees']):.0f}) = {float(str(p['boot_sd'])) * 100:.1f}%)"  # type: ignore[call-overload]
            if p["floor"]
            else f", SD of log knee {float(str(p['sd'])) * 100:.1f}%"
        )
        for p in found
    )
    share = "" if len(found) == 1 else f"{quantile:.0%} quantile over {len(found)} points: "
    return f"{share}the capacity A/A of {runs} ({said})"


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def _class_order(name: str) -> int:
    return [c for _, c in bands.SIZE_CLASSES].index(name)


def derive(
    runs: list[Path], quantile: float, wide: list[Path] | None = None, capacity: list[Path] | None = None
) -> dict[str, object]:
    wide = [ROOT / w for w in WIDE_RUNS] if wide is None else wide
    by: dict[str, dict[str, list[dict[str, object]]]] = {}
    used: dict[str, list[str]] = {}
    for run_dir in runs:
        platform, found = points(run_dir)
        for p in found:
            by.setdefault(platform, {}).setdefault(str(p["family"]), []).append(p)
        if found:
            used.setdefault(platform, []).append(
                str(run_dir.relative_to(ROOT) if run_dir.is_relative_to(ROOT) else run_dir)
            )
    classes = {
        platform: sorted({c for r in mine if (c := model_class(ROOT / r)) is not None}, key=_class_order)
        for platform, mine in used.items()
    }
    platforms: dict[str, dict[str, object]] = {}
    for platform, families in by.items():
        out: dict[str, object] = {}
        for name, found in sorted(families.items()):
            sds = np.asarray([float(str(p["boot_sd"])) for p in found])
            worst = max(found, key=lambda p: float(str(p["boot_sd"])))
            value = float(np.quantile(sds, quantile))
            out[name] = {
                "boot_sd": round(value, 4),
                "points": len(found),
                "median": round(float(np.median(sds)), 4),
                "max": round(float(sds.max()), 4),
                "max_at": f"{worst['config']} {worst['probe']}@{worst['point']} {worst['metric']} ({worst['run']})",
                "source": f"{quantile:.0%} quantile of σ_b over {len(found)} points of {', '.join(used[platform])}",
            }
        platforms[platform] = out
    knees: dict[str, list[dict[str, object]]] = {}
    for run_dir in dict.fromkeys([*runs, *(capacity or [ROOT / r for r in CAPACITY_RUNS])]):
        platform, found = capacity_points(run_dir)
        knees.setdefault(platform, []).extend(found)
    for platform, found in knees.items():
        if not found:
            continue
        sds = np.asarray([float(str(p["boot_sd"])) for p in found])
        worst = max(found, key=lambda p: float(str(p["boot_sd"])))
        platforms.setdefault(platform, {})[CAPACITY] = {
            "boot_sd": round(float(np.quantile(sds, quantile)), 4),
            "points": len(found),
            "median": round(float(np.median(sds)), 4),
            "max": round(float(sds.max()), 4),
            "max_at": f"{worst['config']} capacity@{worst['point']} capacity ({worst['run']})",
            "source": _capacity_source(found, quantile),
        }
    for platform, other in (("cpu", "gpu"), ("gpu", "cpu")):
        mine = platforms.setdefault(platform, {})
        for name, entry in (platforms.get(other) or {}).items():
            if name not in mine and isinstance(entry, dict):
                mine[name] = {
                    **entry,
                    "source": f"no {platform.upper()} points: the {other.upper()} band ({entry['source']})",
                }
    widest: dict[str, dict[str, object]] = {}
    for run_dir in [*runs, *wide]:
        for p in points(run_dir, keep_busy=True)[1]:
            name, sd = str(p["family"]), float(str(p["boot_sd"]))
            if sd > float(str(widest.get(name, {}).get("boot_sd", -1.0))):
                at = f"{p['config']} {p['probe']}@{p['point']} {p['metric']} ({p['run']})"
                widest[name] = {"boot_sd": round(sd, 4), "at": at}
    for found in knees.values():  # a knee's spread: its search excluded and re-tried the trials of a busy host
        for p in found:
            if float(str(p["boot_sd"])) > float(str(widest.get(CAPACITY, {}).get("boot_sd", -1.0))):
                widest[CAPACITY] = {
                    "boot_sd": round(float(str(p["boot_sd"])), 4),
                    "at": f"{p['config']} capacity@{p['point']} capacity ({p['run']})",
                }
    return {
        "version": 1,
        "widest_what": "per family: the largest σ_b of any point of any run listed or in wide_runs, busy-host samples "
        "kept: the widest boot-to-boot spread measured on any host (report.spread judges a one-boot comparison "
        "with it when a compared sample saw the host busy)",
        "wide_runs": [_rel(r) for r in wide],
        "widest": dict(sorted(widest.items())),
        "what": "per platform and metric family: boot_sd, the standard deviation of log(one boot's mean) around "
        "its arm's level (boot-to-boot, within-boot noise taken out)",
        "command": "python benchmarks/noise_bands.py " + " ".join(str(r) for r in runs if str(r) not in DEFAULT_RUNS),
        "quantile": quantile,
        "runs": [_rel(r) for r in runs],
        "capacity_runs": [_rel(r) for r in (capacity or [ROOT / r for r in CAPACITY_RUNS])],
        "capacity_what": "the capacity family: per configuration and depth of a capacity A/A, the SD of log(knee) "
        "between its boots, at least log((k + 1) / k) at the smallest knee k (one search step: a whole number of "
        "sessions cannot show less); from capacity_runs and any listed run with a capacity A/A",
        "families": {name: list(metrics) for name, metrics in bands.FAMILIES.items()},
        "platforms": platforms,
        "model_classes_what": "per platform: the size classes (report.bands.SIZE_CLASSES) of the models its bands "
        "were measured on; report.spread judges a one-boot comparison with the default band only on a model of one",
        "model_classes": classes,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="*", type=Path, help="run folders (default: the committed ones)")
    parser.add_argument("--quantile", type=float, default=0.9)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--print", action="store_true", help="print every point's σ_b")
    args = parser.parse_args()
    runs = [r if r.is_absolute() else ROOT / r for r in (args.runs or [Path(r) for r in DEFAULT_RUNS])]
    missing = [str(r) for r in runs if not (r / "run.json").is_file()]
    if missing:
        print(f"noise_bands: not run folders: {', '.join(missing)}", file=sys.stderr)
        return 4
    if args.print:
        for run_dir in runs:
            platform, found = points(run_dir)
            for p in found:
                print(
                    f"{platform} {p['family']:>12} {float(str(p['boot_sd'])) * 100:6.2f}%  {p['boots']} boots  "
                    f"{p['config']} {p['probe']}@{p['point']} {p['metric']}  ({run_dir.name})"
                )
        for run_dir in dict.fromkeys([*runs, *(ROOT / r for r in CAPACITY_RUNS)]):
            platform, found = capacity_points(run_dir)
            for p in found:
                print(
                    f"{platform} {CAPACITY:>12} {float(str(p['boot_sd'])) * 100:6.2f}%  {p['boots']} boots  "
                    f"{p['config']} capacity@{p['point']} knees {p['knees']}{' (floor)' if p['floor'] else ''}  "
                    f"({run_dir.name})"
                )
    table = derive(runs, args.quantile)
    table["command"] = "python benchmarks/noise_bands.py" + (
        " " + " ".join(str(r) for r in args.runs) if args.runs else ""
    )
    args.out.write_text(json.dumps(table, indent=2) + "\n", encoding="utf-8")
    print("| platform | family | boot-to-boot SD | points | median | max |")
    print("|---|---|---|---|---|---|")
    for platform, families in table["platforms"].items():  # type: ignore[attr-defined]
        for name, e in families.items():
            figures = f"{e['boot_sd'] * 100:.1f}% | {e['points']} | {e['median'] * 100:.1f}% | {e['max'] * 100:.1f}%"
            print(f"| {platform.upper()} | {name} | {figures} |")
    print(f"written: {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
