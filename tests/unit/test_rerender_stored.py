"""Stored runs re-render to the same report as before the report pipeline was cut along its data flow.

``tests/data/rerender/`` holds what the previous pipeline (commit cc98c7c, ``finish.finish``) wrote for the
two run folders committed under ``docs/results/`` (each arm's raw evidence left out: it is copied through
from ``evidence.json``). The new pipeline must reproduce every key of it; what it adds (``seed``,
``probes``, ``agentic``, ``spec_decode``, ``flags``, ``gates``) is checked for presence.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from pytest_kvcache.report.options import ReportOptions
from pytest_kvcache.report.pipeline import produce

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "rerender"
RUNS = ["h200-fp8-vs-int8", "h200-agreement"]
ADDED = {"seed", "probes", "agentic", "spec_decode", "flags", "gates"}


@pytest.mark.parametrize("name", RUNS)
def test_a_committed_run_folder_rerenders_to_the_same_report(name: str, tmp_path: Path) -> None:
    run = tmp_path / name
    shutil.copytree(ROOT / "docs" / "results" / name / "run", run)
    outcome = produce(run, ReportOptions())
    assert outcome.error is None and outcome.exit_code == 0
    new = json.loads((run / "report.json").read_text())
    evidence = {a["name"]: a.pop("evidence") for a in new["arms"]}
    expected = json.loads((DATA / f"{name}.report.json").read_text())
    assert set(new) == set(expected) | ADDED
    for key, value in expected.items():
        assert new[key] == value, key
    assert all(boots for boots in evidence.values())
    assert (run / "summary.csv").read_text() == (DATA / f"{name}.summary.csv").read_text()
    assert new["seed"] == 0 and {p["name"] for p in new["probes"]} >= {"short", "prefill", "agentic"}
