"""Judging a built report: the A/A noise band, the stored run, the gates — and the one exit-code rule.

Everything here takes the report, the run's frame and (already loaded) other runs; the seed is always the
run's own ``--kv-seed``, so a gate's CI and the report's CI of the same delta are the same numbers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, cast

import pandas as pd

from pytest_kvcache import stats
from pytest_kvcache.metrics import catalogue
from pytest_kvcache.model import GateResult, Report, SavedRow, SavedSection
from pytest_kvcache.report import gates as gate_grammar
from pytest_kvcache.report import judging
from pytest_kvcache.report.bands import platform_of
from pytest_kvcache.report.build import build
from pytest_kvcache.report.frame import Specs, compare
from pytest_kvcache.report.load import RunData
from pytest_kvcache.report.multiplicity import apply_holm
from pytest_kvcache.report.verdicts import judge_crossovers, report_verdicts

#: The exit codes, for pytest and ``kvcache-report`` alike.
EXIT_OK = 0
EXIT_FAILED = 1  # a gate failed (or was inconclusive under --kv-inconclusive=fail), or CONFOUNDED
EXIT_INTERRUPTED = 2
EXIT_REPORT_ERROR = 3  # the report could not be built: never a pass
EXIT_USAGE = 4  # a bad option, gate or stored run folder

Bands = dict[tuple[str, str, str], float]
COMPARED_EVIDENCE = (("engine_version", "engine version"), ("served_model", "model"))


@dataclass
class Judgement:
    """What the gates, the noise band and the stored run made of a report."""

    gate_results: list[GateResult] = field(default_factory=list)
    failed_gates: list[GateResult] = field(default_factory=list)
    messages: list[str] = field(default_factory=list)
    confounded: bool = False


def noise_bands(noise: RunData) -> Bands:
    """An A/A run's noise band per (probe, point, metric): how far from 1 its ratio CI reaches (ratio units).
    With several copies of the arm (``X, X.2, X.3``) the widest band counts."""
    bands: Bands = {}
    for d in build(noise)["deltas"]:
        lo, hi = d["ci_low"], d["ci_high"]
        if lo is None or hi is None:
            continue
        key = (d["probe"], d["point"], d["metric"])
        bands[key] = max(bands.get(key, 0.0), abs(lo - 1), abs(hi - 1))
    return bands


def apply_noise(report: Report, bands: Bands, name: str, specs: Specs) -> None:
    """Judge every within-boot delta against the A/A noise band instead of the default band: better/worse
    only when the CI clears 1 ± band. A delta over boots (3+ boots per arm) keeps its verdict: its CI covers
    boot-to-boot variation already, and a gate on it is judged on that CI too."""
    missing = 0
    for d in report["deltas"]:
        band = bands.get((d["probe"], d["point"], d["metric"]))
        d["noise_pct"] = band * 100 if band is not None else None
        if band is None:
            missing += 1
            continue
        lo, hi = d["ci_low"], d["ci_high"]
        if d.get("ci_method") == "within-boot" and lo is not None and hi is not None:
            judged = stats.verdict(d["metric"], lo - band, hi + band)
            d["verdict"] = judged
            d.pop("provisional", None)  # the A/A band is boot against boot: it covers boot-to-boot variation
            d.pop("band_pct", None)
            d.pop("judged_ci", None)
            d.pop("verdict_note", None)
            if judged == "inconclusive":
                d["verdict_note"] = f"within the A/A noise band ±{band * 100:.1f}%"
    report["noise"] = {
        "run": name,
        "bands": [{"probe": p, "point": q, "metric": m, "band_pct": b * 100} for (p, q, m), b in bands.items()],
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
        apply_noise(report, bands, noise.path.name, specs)
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
