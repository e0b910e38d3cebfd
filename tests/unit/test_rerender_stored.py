"""Stored runs re-render to the same report as before the report pipeline was cut along its data flow.

``tests/data/rerender/`` holds what the previous pipeline (commit cc98c7c, ``finish.finish``) wrote for the
two run folders committed under ``docs/results/`` (each arm's raw evidence left out: it is copied through
from ``evidence.json``). The new pipeline must reproduce every key of it; what it adds (``seed``,
``probes``, ``agentic``, ``spec_decode``, ``flags``, ``gates``, ``fidelity``) is checked for presence. Since then a
better/worse verdict on a within-boot CI is judged on it widened by the default boot-to-boot band, and a
crossover is stated only when significant (issue 32): the verdicts are checked against the widened CI and
taken off before the comparison, as is each arm's resolved speculative setup (issue 16) and each boot's
compile facts (issue 20) and each crossover's CI method (issue 15).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from pytest_kvcache import stats
from pytest_kvcache.model.options import ReportOptions
from pytest_kvcache.report.pipeline import produce

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "rerender"
RUNS = ["h200-fp8-vs-int8", "h200-agreement"]
ADDED = {
    *("seed", "probes", "agentic", "spec_decode", "flags", "gates", "fidelity", "compile_cache", "client_load"),
    *("cost", "energy"),  # issue 37: what the verdict cost; energy per token (none: no energy.jsonl then)
    *("bands", "failures"),  # issue 32: the default bands judged with; failures and exclusions
    *("greedy", "left_out"),  # issue 33: greedy texts where arms part; what could not fit the context
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
    # added with issue 37: energy per token — these runs predate the energy meter, so it comes from their
    # power samples (gpu.jsonl), and its rows join the summary and the deltas
    assert {c["source"] for c in new["energy"]["how"]["cards"]} <= {"power"}
    energy_rows = [r for r in new["summary"] if r["metric"].startswith("energy_")]
    assert all(r["probe"] in ("short", "prefill", "agentic") for r in energy_rows)
    new["summary"] = [r for r in new["summary"] if not r["metric"].startswith("energy_")]
    new["deltas"] = [d for d in new["deltas"] if not d["metric"].startswith("energy_")]
    # issue 32: a within-boot verdict is judged on its CI widened by the default GPU band (judged_ci); the
    # CI itself is as before
    assert new["bands"]["platform"] == "gpu" and new["failures"]["failed"] == 0
    for d, was in zip(new["deltas"], expected["deltas"], strict=True):
        d.pop("provisional", None)
        d.pop("verdict_note", None)
        d.pop("band_pct", None)
        # issue 41: the spread each within-boot delta was judged with (one boot, no busy host: the default band)
        assert d.pop("spread")["kind"] == "default band" and d.pop("host_busy") == 0
        lo, hi = d.pop("judged_ci")
        assert lo < d["ci_low"] <= d["ci_high"] < hi
        # issue 41: report.json stores the interval that decided, and what it is
        assert d.pop("decided_ci") == [lo, hi] and d.pop("ci_basis").startswith("within-boot widened by the default")
        # issue 41: Holm within each (arm, probe, metric) family may leave a better/worse of that CI inconclusive
        p, p_holm, _ = d.pop("p_value"), d.pop("p_holm"), d.pop("family_size")
        raw = stats.verdict(d["metric"], lo, hi)
        assert (p < 0.05) == (raw != "inconclusive")
        assert d.pop("verdict") == (raw if p_holm < 0.05 else "inconclusive")
        was.pop("verdict")
    # added with issue 15: the crossover CI's resampling unit (these runs have one boot per arm), and the
    # GPU driver among the compared evidence paths (one more path, equal in every boot: still clean); with
    # issue 32 each resampled curve also moves by a boot effect, and a crossing is stated only when significant
    assert {c.pop("ci_method") for c in new["crossovers"]} <= {"within-boot"}
    for c, was in zip(new["crossovers"], expected["crossovers"], strict=True):
        assert c["estimate"] == was["estimate"]
        for key in ("ci_low", "ci_high", "share", "statement"):
            c.pop(key, None)
            was.pop(key, None)
        for key in ("significant", "evidence", "point_names", "boot_sd_pct", "sessions"):
            c.pop(key, None)
    new.pop("verdicts")
    expected.pop("verdicts")
    new["ci"].pop("text")
    expected["ci"].pop("text")
    assert new["confounds"]["compared"] == expected["confounds"]["compared"] + 1
    new["confounds"]["compared"] -= 1
    assert set(new) == set(expected) | ADDED
    for key, value in expected.items():
        assert new[key] == value, key
    assert all(boots for boots in evidence.values())
    summary = [line for line in (run / "summary.csv").read_text().splitlines(True) if ",energy_" not in line]
    assert "".join(summary) == (DATA / f"{name}.summary.csv").read_text()
    assert new["cost"]["unit"] == "GPU-s" and new["cost"]["cards"] == 1
    assert new["cost"]["boots"] == len(new["boots"]) and new["cost"]["booting"] > 0
    assert new["seed"] == 0 and {p["name"] for p in new["probes"]} >= {"short", "prefill", "agentic"}
