"""After the probes: build the report from the run folder, evaluate gates, write files, store/compare
baselines. Used by the plugin at the end of a run, by ``--kv-rerender`` and by ``kvcache-report``."""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_kvcache import analysis, gates, render
from pytest_kvcache.records import read_records


@dataclass
class Finished:
    report: dict[str, Any]
    gate_results: list[dict[str, Any]] = field(default_factory=list)
    written: list[Path] = field(default_factory=list)
    failed_gates: list[dict[str, Any]] = field(default_factory=list)
    messages: list[str] = field(default_factory=list)


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


def finish(
    run: Path,
    gate_texts: Sequence[str],
    *,
    inconclusive: str = "warn",
    saved_run: Path | None = None,
    save_as: Path | None = None,
) -> Finished:
    report = analysis.build(run)
    arms = [a["name"] for a in report["arms"]]
    data = analysis.frame(read_records(run / "requests.jsonl"))
    seed = 0
    done = Finished(report=report)
    saved = None
    if saved_run is not None:
        report["compare"] = compare_with_saved(report, data, saved_run, seed)
        saved = analysis.frame(read_records(saved_run / "requests.jsonl"))
        done.messages += report["compare"]["warnings"]
    parsed = [gates.parse(text, arms=arms) for text in gate_texts]
    done.gate_results = gates.evaluate(parsed, data, arms, saved, seed)
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
