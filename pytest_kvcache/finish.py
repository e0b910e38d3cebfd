"""After the probes: build the report from the run folder, evaluate gates, write files, store/compare
baselines. Used by the plugin at the end of a run, by ``--kv-rerender`` and by ``kvcache-report``."""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_kvcache import analysis, gates, render, stats
from pytest_kvcache.records import read_records


@dataclass
class Finished:
    report: dict[str, Any]
    gate_results: list[dict[str, Any]] = field(default_factory=list)
    written: list[Path] = field(default_factory=list)
    failed_gates: list[dict[str, Any]] = field(default_factory=list)
    messages: list[str] = field(default_factory=list)

    @property
    def confounded(self) -> bool:
        return (self.report.get("confounds") or {}).get("status") == "CONFOUNDED"


COMPARED_EVIDENCE = (("engine_version", "engine version"), ("served_model", "model"))


def compare_with_saved(report: dict[str, Any], data: Any, saved_run: Path, seed: int = 0) -> dict[str, Any]:
    """Current arms against a stored run, by probe, point, metric and arm; warns where the setup differs."""
    saved_report = analysis.build(saved_run)
    saved = analysis.frame(read_records(saved_run / "requests.jsonl"))
    rows = []
    for probe, point, metric, arm in sorted(
        {(s["probe"], s["point"], s["metric"], s["arm"]) for s in report["summary"]}
    ):
        if metric in ("prompt_tokens", "cached_tokens") or saved.empty:
            continue
        old = saved[(saved["probe"] == probe) & (saved["point"] == point) & (saved["arm"] == arm)]
        new = data[(data["probe"] == probe) & (data["point"] == point) & (data["arm"] == arm)]
        if old.empty or new.empty:
            continue
        rows.append(
            {
                "probe": probe,
                "point": point,
                "metric": metric,
                "arm": arm,
                **analysis.compare(old, new, metric, seed=seed),
            }
        )
    warnings = []
    old_arms = {a["name"]: a["resolved"] for a in saved_report["arms"]}
    for arm in report["arms"]:
        before = old_arms.get(arm["name"])
        if before is None:
            continue
        for field_name, label in COMPARED_EVIDENCE:
            if before.get(field_name) != arm["resolved"].get(field_name):
                warnings.append(
                    f"{arm['name']}: {label} differs from the stored run: "
                    f"{before.get(field_name)} → {arm['resolved'].get(field_name)}"
                )
    return {"baseline_run": saved_report.get("run_id"), "path": str(saved_run), "rows": rows, "warnings": warnings}


def noise_bands(noise_run: Path) -> dict[tuple[str, str, str], float]:
    """An A/A run's noise band per (probe, point, metric): how far from 1 its ratio CI reaches (ratio units).
    With several copies of the arm (``X, X.2, X.3``) the widest band counts."""
    bands: dict[tuple[str, str, str], float] = {}
    for d in analysis.build(noise_run)["deltas"]:
        if d["ci_low"] is None or d["ci_high"] is None:
            continue
        key = (d["probe"], d["point"], d["metric"])
        band = max(abs(d["ci_low"] - 1), abs(d["ci_high"] - 1))
        bands[key] = max(bands.get(key, 0.0), band)
    return bands


def apply_noise(report: dict[str, Any], bands: dict[tuple[str, str, str], float], name: str) -> None:
    """Judge every delta against the A/A noise band: better/worse only when the CI clears 1 ± band."""
    missing = 0
    for d in report["deltas"]:
        band = bands.get((d["probe"], d["point"], d["metric"]))
        d["noise_pct"] = band * 100 if band is not None else None
        if band is None:
            missing += 1
            continue
        if d["verdict"] != "inconclusive":
            lo, hi = d["ci_low"] - band, d["ci_high"] + band
            d["verdict"] = stats.verdict(d["metric"], lo, hi)
            if d["verdict"] == "inconclusive":
                d["verdict_note"] = f"within the A/A noise band ±{band * 100:.1f}%"
    report["noise"] = {
        "run": name,
        "bands": [{"probe": p, "point": q, "metric": m, "band_pct": b * 100} for (p, q, m), b in bands.items()],
        "missing": missing,
    }


def finish(
    run: Path,
    gate_texts: Sequence[str],
    *,
    inconclusive: str = "warn",
    saved_run: Path | None = None,
    save_as: Path | None = None,
    noise_run: Path | None = None,
    allow_diff: Sequence[str] = (),
) -> Finished:
    report = analysis.build(run, allow_diff)
    arms = [a["name"] for a in report["arms"]]
    data = analysis.frame(read_records(run / "requests.jsonl"))
    seed = 0
    done = Finished(report=report)
    bands: dict[tuple[str, str, str], float] = {}
    if noise_run is not None:
        bands = noise_bands(noise_run)
        apply_noise(report, bands, noise_run.name)
        report["verdicts"] = analysis.verdict_sentences(
            report["deltas"], report["crossovers"], arms
        ) + analysis.agreement_sentences(report["agreement"]["rows"], arms)
    check = report.get("self_check") or {}
    done.messages += [f"warning: {w}" for w in check.get("warnings") or []]
    if check.get("error"):
        done.messages.append(f"warning: the measuring-client self-check failed: {check['error']}")
    confounded = report["confounds"]
    if confounded.get("status") == "CONFOUNDED":
        done.messages.append(
            f"CONFOUNDED: the boots differ in {len(confounded['confounds'])} way(s) the arms do not declare "
            "(allow one with --kv-allow-diff=PATH):"
        )
        done.messages += [f"  {line}" for line in confounded["lines"]]
    saved = None
    if saved_run is not None:
        report["compare"] = compare_with_saved(report, data, saved_run, seed)
        saved = analysis.frame(read_records(saved_run / "requests.jsonl"))
        done.messages += report["compare"]["warnings"]
    parsed = [gates.parse(text, arms=arms) for text in gate_texts]
    done.gate_results = gates.evaluate(parsed, data, arms, saved, seed, noise=bands)
    bad = {"fail"} | ({"inconclusive"} if inconclusive == "fail" else set())
    done.failed_gates = [g for g in done.gate_results if g["outcome"] in bad]
    done.written = render.write_all(run, report, done.gate_results)
    report["gates"] = done.gate_results
    report["run_folder"] = str(run)
    if save_as is not None:
        if save_as.exists():
            shutil.rmtree(save_as)
        save_as.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(run, save_as, symlinks=True)
        done.messages.append(f"stored this run as baseline {save_as.name} ({save_as})")
    return done


def summary_lines(done: Finished) -> list[str]:
    lines = render.terminal_lines(done.report)
    compare = done.report.get("compare")
    if compare:
        lines.append(f"against stored run {compare['baseline_run']}:")
        for row in compare["rows"]:
            lines.append(f"  {row['arm']} {row['probe']}@{row['point']} {row['metric']}: {render.fmt_delta(row)}")
    for g in done.gate_results:
        ci = f" CI {g['ci_text']}" if g["ci_low"] is not None else ""
        why = f" — {g['reason']}" if g["reason"] else ""
        lines.append(
            f"gate {g['outcome'].upper()}: {g['name']} — value {g['value_text']}{ci}, needs {g['threshold_text']}{why}"
        )
    return lines
