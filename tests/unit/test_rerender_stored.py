"""Stored runs re-render to the same report as before the report pipeline was cut along its data flow.

``tests/data/rerender/`` holds what the previous pipeline (commit cc98c7c, ``finish.finish``) wrote for the
two run folders committed under ``docs/results/`` (each arm's raw evidence left out: it is copied through
from ``evidence.json``). The new pipeline must reproduce every key of it; what it adds (``seed``,
``probes``, ``agentic``, ``spec_decode``, ``flags``, ``gates``, ``fidelity``) is checked for presence. Since then a
better/worse verdict on a within-boot CI is marked provisional (issue 22): that mark is checked where it
must be and taken off before the comparison, as is each arm's resolved speculative setup (issue 16) and
each boot's compile facts (issue 20) and each crossover's CI method (issue 15).
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from pytest_kvcache.report.options import ReportOptions
from pytest_kvcache.report.pipeline import produce

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "rerender"
RUNS = ["h200-fp8-vs-int8", "h200-agreement"]
ADDED = {
    "seed",
    "probes",
    "agentic",
    "spec_decode",
    "flags",
    "gates",
    "fidelity",
    "compile_cache",
    "client_load",
    "greedy",
    "left_out",
}


@pytest.mark.parametrize("name", RUNS)
def test_a_committed_run_folder_rerenders_to_the_same_report(name: str, tmp_path: Path) -> None:
    run = tmp_path / name
    shutil.copytree(ROOT / "docs" / "results" / name / "run", run)
    outcome = produce(run, ReportOptions())
    assert outcome.error is None and outcome.exit_code == 0
    new = json.loads((run / "report.json").read_text())
    evidence = {a["name"]: a.pop("evidence") for a in new["arms"]}
    assert {a["resolved"].pop("speculative") for a in new["arms"]} == {"none"}  # added with issue 16
    expected = json.loads((DATA / f"{name}.report.json").read_text())
    compiled = [(b.pop("compile_cache"), b.pop("compile_s"), b.pop("init_engine_s")) for b in new["boots"]]
    assert set(compiled) == {(None, None, None)}  # their evidence.json was parsed before these facts existed
    for d in new["deltas"]:
        marked = d["ci_method"] == "within-boot" and d["verdict"] != "inconclusive"
        assert d.pop("provisional", None) == ("1 boot per arm: within-boot CI only" if marked else None)
    assert any(" — provisional (1 boot per arm: within-boot CI only)." in v for v in new["verdicts"])
    # added with issue 15: the crossover CI's resampling unit (these runs have one boot per arm), and the
    # GPU driver among the compared evidence paths (one more path, equal in every boot: still clean)
    assert {c.pop("ci_method") for c in new["crossovers"]} <= {"within-boot"}
    assert new["confounds"]["compared"] == expected["confounds"]["compared"] + 1
    new["confounds"]["compared"] -= 1
    new["verdicts"] = [re.sub(r" — provisional \([^)]*\)\.$", ".", v) for v in new["verdicts"]]
    assert set(new) == set(expected) | ADDED
    for key, value in expected.items():
        assert new[key] == value, key
    assert all(boots for boots in evidence.values())
    assert (run / "summary.csv").read_text() == (DATA / f"{name}.summary.csv").read_text()
    assert new["seed"] == 0 and {p["name"] for p in new["probes"]} >= {"short", "prefill", "agentic"}
