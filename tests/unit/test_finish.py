"""The finish step after the report: the baseline save and the history row, outside the report pipeline."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from pytest_kvcache.finish import finish
from pytest_kvcache.model.options import ReportOptions
from pytest_kvcache.report.pipeline import Outcome, produce
from pytest_kvcache.store.sqlite import SqliteStore

ROOT = Path(__file__).resolve().parents[2]


def a_run(tmp_path: Path, store: Path | None = None) -> Path:
    run = tmp_path / "run"
    shutil.copytree(ROOT / "docs" / "results" / "h200-agreement" / "run", run)
    if store is not None:
        meta = json.loads((run / "run.json").read_text())
        meta["settings"]["store"] = str(store)
        (run / "run.json").write_text(json.dumps(meta))
    return run


def test_the_report_writes_no_history_and_finish_adds_the_row_and_the_baseline(tmp_path: Path) -> None:
    store = tmp_path / "store"
    run = a_run(tmp_path, store)
    options = ReportOptions(save_as=tmp_path / "baselines" / "nightly")
    outcome = produce(run, options)
    assert outcome.error is None and outcome.report is not None
    assert not store.exists() and not (run / "vcs.json").exists()  # the report step touches no store
    finish(outcome, options)
    assert outcome.error is None, outcome.error
    assert any(m.startswith("stored this run as baseline nightly") for m in outcome.messages)
    assert (run / "vcs.json").is_file()
    with SqliteStore(store) as opened:
        assert opened.baseline("nightly") is not None
        assert [r["run_id"] for r in opened.runs()] == [outcome.report["run_id"]]


def test_a_rerender_saves_a_baseline_without_a_store_and_adds_no_row(tmp_path: Path) -> None:
    run = a_run(tmp_path)
    options = ReportOptions(save_as=tmp_path / "baselines" / "b")
    outcome = finish(produce(run, options), options, record=False)
    assert outcome.error is None and (tmp_path / "baselines" / "b" / "run.json").is_file()
    assert not (run / "vcs.json").exists()


def test_a_failed_report_finishes_nothing(tmp_path: Path) -> None:
    options = ReportOptions(save_as=tmp_path / "baselines" / "b")
    outcome = finish(Outcome(run=tmp_path, error="ValueError: boom"), options)
    assert outcome.error == "ValueError: boom" and not (tmp_path / "baselines").exists()
