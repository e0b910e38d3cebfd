"""Judging a built report: the A/A noise band, the stored run, the gates — and the one exit-code rule.

Everything here takes the report, the run's frame and (already loaded) other runs; the seed is always the
run's own ``--kv-seed``, so a gate's CI and the report's CI of the same delta are the same numbers.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, cast

import pandas as pd

from pytest_kvcache import stats
from pytest_kvcache.metrics import catalogue
from pytest_kvcache.model.report import GateResult, Report, SavedRow, SavedSection
from pytest_kvcache.report import gates as gate_grammar
from pytest_kvcache.report import judging, spread
from pytest_kvcache.report.bands import Platform, platform_of, unlike_source
from pytest_kvcache.report.build import build
from pytest_kvcache.report.frame import by_boot, compare, values
from pytest_kvcache.report.load import RunData
from pytest_kvcache.report.multiplicity import apply_holm
from pytest_kvcache.report.points import Specs, spec_of
from pytest_kvcache.report.verdicts import judge_crossovers, report_verdicts

#: The exit codes, for pytest and ``kvcache-report`` alike.
EXIT_OK = 0
EXIT_FAILED = 1  # a gate failed (or was inconclusive under --kv-inconclusive=fail), or CONFOUNDED
EXIT_INTERRUPTED = 2
EXIT_REPORT_ERROR = 3  # the report could not be built: never a pass
EXIT_USAGE = 4  # a bad option, gate or stored run folder

Bands = dict[tuple[str, str, str], "spread.Spread"]
COMPARED_EVIDENCE = (("engine_version", "engine version"), ("served_model", "model"))


@dataclass
class Judgement:
    """What the gates, the noise band and the stored run made of a report."""

    gate_results: list[GateResult] = field(default_factory=list)
    failed_gates: list[GateResult] = field(default_factory=list)
    messages: list[str] = field(default_factory=list)
    confounded: bool = False


def noise_bands(noise: RunData) -> Bands:
    """A stored A/A run's spread per (probe, point, metric): σ̂, the SD of its log boot means pooled within each
    arm (copies of an arm, ``X, X.2``, are one arm: the same configuration), and its degrees of freedom
    (``report.spread``); a point needs 2 boots of one arm."""
    found: Bands = {}
    data = noise.frame
    if data.empty:
        return found
    data = data.assign(config=[re.sub(r"\.\d+$", "", str(a)) for a in data["arm"]])
    name = noise.path.name
    for (probe, point), group in data.groupby(["probe", "point"], sort=False):
        for metric in spec_of(str(probe), noise.specs).metrics:
            if not values(group, metric):
                continue
            sides = [by_boot(g, metric) for _, g in group.groupby("config", sort=False)]
            pooled = stats.pooled_log_sd(*sides)
            if pooled is not None:
                found[(str(probe), str(point), metric)] = spread.from_aa(pooled[0], pooled[1], name)
    return found


def apply_noise(report: Report, bands: Bands, name: str, specs: Specs, platform: Platform = "cpu") -> None:
    """Judge every within-boot delta with the A/A noise run's spread where it has one (``report.spread``: its
    σ̂ scaled by this run's boots, Student's t on its df) instead of the default band. A delta over boots (3+
    boots per arm) keeps its verdict: its CI covers boot-to-boot variation already, and a gate on it is
    judged on that CI too."""
    missing = 0
    for d in report["deltas"]:
        found = bands.get((d["probe"], d["point"], d["metric"]))
        d["noise_pct"] = found.sd * 100 if found is not None else None
        missing += found is None
    busy = (report.get("bands") or {}).get("host_busy")
    unlike = (report.get("bands") or {}).get("unlike")
    used = spread.judge_deltas(report["deltas"], platform, noise=bands, run_busy=busy, unlike=unlike)
    report["bands"] = {
        "platform": platform,
        "families": used["families"],
        "spreads": used["spreads"],
        "host_busy": busy or 0,
        **({"unlike": unlike} if unlike else {}),
    }
    report["noise"] = {
        "run": name,
        "bands": [
            {"probe": p, "point": q, "metric": m, "band_pct": b.sd * 100, "df": b.df} for (p, q, m), b in bands.items()
        ],
        "missing": missing,
    }
    apply_holm(report["deltas"])  # the verdicts are set anew: Holm again, before crossovers and sentences
    judge_crossovers(report["crossovers"], report["deltas"])
    report["verdicts"] = report_verdicts(report, specs)


def compare_with_saved(
    report: Report, data: pd.DataFrame, saved: RunData, seed: int, specs: Specs | None = None
) -> SavedSection:
    """Current arms against a stored run, by probe, point, metric and arm; warns where the setup differs.
    Probes whose metrics are differences from the baseline already (fidelity) are not divided."""
    saved_report = build(saved)
    old_data = saved.frame
    rows: list[SavedRow] = []
    keys = sorted({(s["probe"], s["point"], s["metric"], s["arm"]) for s in report["summary"]})
    for probe, point, metric, arm in keys:
        spec = (specs or {}).get(probe)
        if not catalogue.compared(metric) or old_data.empty or (spec is not None and spec.own_section):
            continue
        old = old_data[(old_data["probe"] == probe) & (old_data["point"] == point) & (old_data["arm"] == arm)]
        new = data[(data["probe"] == probe) & (data["point"] == point) & (data["arm"] == arm)]
        if old.empty or new.empty:
            continue
        found = compare(old, new, metric, seed=seed)
        row = cast(SavedRow, {"probe": probe, "point": point, "metric": metric, "arm": arm, **found})
        rows.append(row)
    warnings = []
    old_arms = {a["name"]: a["resolved"] for a in saved_report["arms"]}
    for entry in report["arms"]:
        before = old_arms.get(entry["name"])
        if before is None:
            continue
        for key, label in COMPARED_EVIDENCE:
            was, now = before.get(key), entry["resolved"].get(key)
            if was != now:
                warnings.append(f"{entry['name']}: {label} differs from the stored run: {was} → {now}")
    return {"baseline_run": saved_report.get("run_id"), "path": str(saved.path), "rows": rows, "warnings": warnings}


def judge(
    report: Report,
    run: RunData,
    gate_texts: Sequence[str],
    *,
    inconclusive: Literal["warn", "fail"] = "warn",
    saved: RunData | None = None,
    noise: RunData | None = None,
) -> Judgement:
    """Apply the noise band and the stored run to ``report`` (in place) and evaluate the gates.

    Raises :class:`~pytest_kvcache.report.gates.GateError` for a gate that names an unknown probe, metric
    or arm of this run.
    """
    seed = run.seed
    specs = run.specs
    arms = run.arms
    data = run.frame
    done = Judgement()
    parsed = [gate_grammar.parse(text, arms=arms, specs=specs) for text in gate_texts]
    bands: Bands = {}
    if noise is not None:
        bands = noise_bands(noise)
        apply_noise(report, bands, noise.path.name, specs, platform_of(run.evidence))
    check = report.get("self_check") or {}
    done.messages += [f"warning: {w}" for w in check.get("warnings") or []]
    if check.get("error"):
        done.messages.append(f"warning: the measuring-client self-check failed: {check.get('error')}")
    found = report["confounds"]
    if found.get("status") == "CONFOUNDED":
        done.confounded = True
        done.messages.append(
            f"CONFOUNDED: the boots differ in {len(found.get('confounds') or [])} way(s) the arms do not declare "
            "(allow one with --kv-allow-diff=PATH):"
        )
        done.messages += [f"  {line}" for line in found.get("lines") or []]
    old = None
    if saved is not None:
        report["compare"] = compare_with_saved(report, data, saved, seed, specs)
        old = saved.frame
        done.messages += report["compare"]["warnings"]
    done.gate_results = gate_grammar.evaluate(
        parsed,
        data,
        arms,
        seed=seed,
        saved=old,
        noise=bands,
        specs=specs,
        platform=platform_of(run.evidence),
        unjudgeable=judging.reason(report.get("baseline_check")),
        unlike=unlike_source(platform_of(run.evidence), run.meta),
        ceiling=float(run.settings.get("retrieval_ceiling") or 0.8),
    )
    bad = {"fail", "error"} | ({"inconclusive"} if inconclusive == "fail" else set())
    done.failed_gates = [g for g in done.gate_results if g["outcome"] in bad]
    report["gates"] = done.gate_results
    return done


def exit_code(judgement: Judgement | None, error: str | None = None) -> int:
    """The one rule: a report that could not be built is ``EXIT_REPORT_ERROR``, never a pass; failed gates
    or a CONFOUNDED A/B are ``EXIT_FAILED``; else ``EXIT_OK``."""
    if error is not None or judgement is None:
        return EXIT_REPORT_ERROR
    if judgement.failed_gates or judgement.confounded:
        return EXIT_FAILED
    return EXIT_OK


def combine(pytest_status: int, report_status: int) -> int:
    """pytest's own exit status and the report's, as one: an interrupt or a usage error stays what it is; a
    report error wins over everything else, and failed gates turn a pass (or "no tests ran") into a failure."""
    if pytest_status in (EXIT_INTERRUPTED, EXIT_USAGE):
        return pytest_status
    if report_status == EXIT_REPORT_ERROR:
        return EXIT_REPORT_ERROR
    if report_status == EXIT_FAILED and pytest_status in (EXIT_OK, 5):
        return EXIT_FAILED
    return pytest_status
