"""The run store (SQLite backend), its history and ``kvcache-report history`` on synthetic histories."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pytest_kvcache import cli, store
from pytest_kvcache.config import locations
from pytest_kvcache.config.constants import SettingsError
from pytest_kvcache.jsonio import write_json
from pytest_kvcache.store import history
from pytest_kvcache.store.record import Comparability, PointRow, RunRow, comparability, vcs_of
from pytest_kvcache.store.sqlite import SqliteStore
from pytest_kvcache.stored import report_options
from tests.factories import make_settings, open_run


def point(mean: float, arm: str = "fp8", metric: str = "decode_tps") -> PointRow:
    return {
        "probe": "short",
        "point": "code",
        "metric": metric,
        "arm": arm,
        "n": 5,
        "mean": mean,
        "ci_low": mean * 0.99,
        "ci_high": mean * 1.01,
        "ci_method": "within-boot",
        "boots": 1,
        "ratio": None,
        "ratio_ci_low": None,
        "ratio_ci_high": None,
        "verdict": None,
    }


def row(i: int, mean: float, *, engine: str = "0.25.1", extra: tuple[PointRow, ...] = ()) -> RunRow:
    parts: Comparability = {
        "model": "m",
        "engine_versions": [engine],
        "gpus": ["NVIDIA H200"],
        "arms": [{"name": "fp8"}],
    }
    return {
        "row_version": 1,
        "run_id": f"run{i:03d}",
        "started_unix_s": 1000.0 + i,
        "recorded_unix_s": 2000.0 + i,
        "commit": f"{i:08x}" + "f" * 32,
        "branch": "main",
        "status": "finished",
        "arms": ["fp8"],
        "baseline_arm": "fp8",
        "comparability": f"hash-{engine}",
        "comparable_on": parts,
        "points": [point(mean), *extra],
    }


def history_rows(means: np.ndarray, **kwargs: Any) -> list[RunRow]:
    return [row(i, float(m), **kwargs) for i, m in enumerate(means)]


def noisy(seed: int, n: int = 30) -> np.ndarray:
    return 100.0 * (1.0 + 0.01 * np.random.default_rng(seed).standard_normal(n))


# ------------------------------------------------------------------------------------------ the store


def test_sqlite_store_keeps_runs_by_id_oldest_first(tmp_path: Path) -> None:
    with SqliteStore(tmp_path / "store") as s:
        s.add_run(row(2, 90.0))
        s.add_run(row(1, 100.0))
        s.add_run(row(2, 95.0))  # the same run again (a rebuild): replaced, not added
        assert [(r["run_id"], r["points"][0]["mean"]) for r in s.runs()] == [("run001", 100.0), ("run002", 95.0)]
    assert (tmp_path / "store" / "store.sqlite").is_file()
    with SqliteStore(tmp_path / "store") as again:
        assert len(again.runs()) == 2
        journal = again._db.execute("PRAGMA journal_mode").fetchone()[0]
    assert journal == "wal"


def test_a_baseline_is_a_full_copy_that_outlives_its_run_folder(tmp_path: Path) -> None:
    run = tmp_path / "ws" / "kv-runs" / "r1"
    write_json(run / "run.json", {"run_id": "r1"})
    (run / "arms" / "fp8").mkdir(parents=True)
    (run / "arms" / "fp8" / "evidence.json").write_text("{}")
    with SqliteStore(tmp_path / "store") as s:
        saved = s.save_baseline("main", run)
        write_json(run / "run.json", {"run_id": "r2"})
        s.save_baseline("main", run)  # replaced whole
        subprocess.run(["rm", "-rf", str(tmp_path / "ws")], check=True)
        assert s.baseline("main") == saved and (saved / "arms" / "fp8" / "evidence.json").is_file()
        assert json.loads((saved / "run.json").read_text())["run_id"] == "r2"
        assert [(b["name"], b["run_id"]) for b in s.baselines()] == [("main", "r2")]
        assert s.baseline("nope") is None
    assert sorted(p.name for p in (tmp_path / "store" / "baselines").iterdir()) == ["main"]  # no staging left


def test_a_store_path_that_is_a_file_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(store.StoreError, match="is a file, not a store folder"):
        store.check(str(tmp_path / "file"))
    with pytest.raises(store.StoreError, match="which is a file"):
        store.check(str(tmp_path / "file" / "store"))


WRITER = """
import sys
from pytest_kvcache.store.sqlite import SqliteStore
from tests.unit.test_store import row
with SqliteStore(__import__("pathlib").Path(sys.argv[1])) as s:
    for i in range(int(sys.argv[2]), int(sys.argv[2]) + 150):
        s.add_run(row(i, 100.0))
"""


def test_two_writers_at_once_lose_nothing(tmp_path: Path) -> None:
    root = Path(__file__).parents[2]
    procs = [
        subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path / "store"), str(start)], cwd=root)
        for start in (0, 1000)
    ]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    with SqliteStore(tmp_path / "store") as s:
        ids = {r["run_id"] for r in s.runs()}
    assert ids == {f"run{i:03d}" for i in [*range(150), *range(1000, 1150)]}


def test_default_store_is_under_the_users_data_directory(tmp_path: Path) -> None:
    assert locations.default_location({"XDG_DATA_HOME": str(tmp_path)}) == str(tmp_path / "pytest-kvcache")
    assert locations.default_location({}) == str(Path.home() / ".local" / "share" / "pytest-kvcache")
    assert locations.redact("postgresql://kv:secret@db:5432/kv") == "postgresql://kv:***@db:5432/kv"


def test_commit_and_branch_from_git_else_the_ci_environment(tmp_path: Path) -> None:
    env = {"GITHUB_SHA": "abc123", "GITHUB_REF_NAME": "main"}
    assert vcs_of(tmp_path, env) == {"commit": "abc123", "branch": "main", "source": "env"}
    assert vcs_of(tmp_path, {}) == {"commit": None, "branch": None, "source": "none"}
    git = ["git", "-c", "user.email=a@b", "-c", "user.name=a"]
    subprocess.run([*git, "init", "-q", "-b", "trunk", str(tmp_path)], check=True)
    subprocess.run([*git, "-C", str(tmp_path), "commit", "-q", "--allow-empty", "-m", "x"], check=True)
    found = vcs_of(tmp_path, env)
    assert found["source"] == "git" and found["branch"] == "trunk" and found["commit"] and len(found["commit"]) == 40


def test_comparability_covers_model_engine_gpu_and_arms() -> None:
    report: Any = {
        "model": "m",
        "arms": [
            {
                "name": "fp8",
                "declared": {"kv_cache_dtype": "fp8_e4m3", "args": [], "env": {}, "image": None},
                "resolved": {"engine_version": "0.25.1"},
                "gpu": {"cards": [{"name": "NVIDIA H200"}]},
            }
        ],
    }
    digest, parts = comparability(report)
    assert parts["engine_versions"] == ["0.25.1"] and parts["gpus"] == ["NVIDIA H200"]
    assert comparability(report, ["--max-model-len", "65536"])[0] != digest  # the shared --kv-engine-args
    for change in ("model", "engine", "gpu", "args"):
        other = json.loads(json.dumps(report))
        if change == "model":
            other["model"] = "m2"
        elif change == "engine":
            other["arms"][0]["resolved"]["engine_version"] = "0.26.0"
        elif change == "gpu":
            other["arms"][0]["gpu"]["cards"][0]["name"] = "NVIDIA H100"
        else:
            other["arms"][0]["declared"]["args"] = ["--enforce-eager"]
        assert comparability(other)[0] != digest, change


# ------------------------------------------------------------------------------------------ old baselines


def _legacy_run(folder: Path) -> None:
    arms = [{"name": "auto", "typed_as": "auto"}, {"name": "float16", "typed_as": "float16"}]
    write_json(folder / "run.json", {"run_id": "old1", "settings": {"arms": arms}})
    (folder / "requests.jsonl").write_text("")


def test_an_old_workspace_baseline_is_imported_once(tmp_path: Path) -> None:
    _legacy_run(tmp_path / ".kvcache" / "baselines" / "main")
    cli_values = {"arms": "auto,float16", "compare": "main", "store": str(tmp_path / "store")}
    first, stored = open_run(tmp_path, cli_values)
    assert stored is not None
    (note,) = stored.notes
    assert note.startswith("imported baseline 'main' from ") and str(tmp_path / "store") in note
    assert (tmp_path / "store" / "baselines" / "main" / "run.json").is_file()
    assert first.report_options().compare == tmp_path / "store" / "baselines" / "main"
    second = open_run(tmp_path, cli_values)[1]
    assert second is not None and second.notes == ()


def test_a_rerender_imports_an_old_workspace_baseline_and_says_so(tmp_path: Path) -> None:
    _legacy_run(tmp_path / ".kvcache" / "baselines" / "main")
    cli_values = {"compare": "main", "store": str(tmp_path / "store")}
    options, (note,) = report_options(cli_values, {}, {}, tmp_path)
    assert note.startswith("imported baseline 'main' from ") and str(tmp_path / "store") in note
    assert options.compare == tmp_path / "store" / "baselines" / "main"
    assert report_options(cli_values, {}, {}, tmp_path)[1] == ()


def test_store_errors_are_named(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("x")
    with pytest.raises(SettingsError, match=r"^--kv-store: .*afile is a file, not a store folder"):
        make_settings(tmp_path, {"arms": "auto", "store": str(tmp_path / "afile")})
    with pytest.raises(SettingsError, match=r"^--kv-compare: no stored baseline 'nope' in .*store.baselines"):
        make_settings(tmp_path, {"arms": "auto", "compare": "nope", "store": str(tmp_path / "store")})


# ------------------------------------------------------------------------------------------ history


def test_thirty_runs_with_a_6_percent_drop_at_run_20() -> None:
    means = noisy(0)
    means[20:] *= 0.94
    (series,) = history.trends(history_rows(means))
    (change,) = series.changes
    assert change.point.index == 20 and change.direction == "worse"
    assert (change.before.run_id, change.after.run_id) == ("run019", "run020")
    (line,) = history.change_lines([series])
    assert line.startswith(f"change point: decode_tps[short@code] fp8 at run 21 (commits {19:08x}...{20:08x}")
    assert line.endswith(", worse") and change.point.shift_pct is not None and -7 < change.point.shift_pct < -5


def test_noise_only_history_has_no_change_point() -> None:
    (series,) = history.trends(history_rows(noisy(1)))
    assert series.changes == [] and history.change_lines([series]) == []


def test_a_change_of_engine_is_a_break_not_a_change_point() -> None:
    means = noisy(2)
    rows = [
        row(i, float(m) * (0.94 if i >= 20 else 1.0), engine="0.26.0" if i >= 20 else "0.25.1")
        for i, m in enumerate(means)
    ]
    (series,) = history.trends(rows)
    assert [b.index for b in series.breaks] == [20] and series.breaks[0].changed == ("engine version",)
    assert series.changes == []
    assert history.change_lines([series])[0].startswith("break: decode_tps[short@code] fp8 between ")
    assert history.table([series])["decode_tps[short@code] fp8"].iloc[20].startswith("| ")


def test_the_gate_fails_only_when_the_newest_run_regresses() -> None:
    base = noisy(3, n=20)
    regressed = history.gate(history.trends(history_rows(np.append(base, 94.0))))
    assert [g.outcome for g in regressed] == ["fail"]
    shift = regressed[0].shift
    assert shift is not None and shift.shift_pct is not None and shift.shift_pct < -5
    assert regressed[0].reason.startswith(f"newest run {20:08x}: 94 against ")
    improved = history.gate(history.trends(history_rows(np.append(base, 106.0))))
    assert [g.outcome for g in improved] == ["pass"]
    steady = history.gate(history.trends(history_rows(noisy(4, n=21))))
    assert [g.outcome for g in steady] == ["pass"]
    too_few = history.gate(history.trends(history_rows(np.array([100.0, 101.0, 94.0]))))
    assert [g.outcome for g in too_few] == ["not judged"]


def test_history_filters_by_metric_probe_and_arm() -> None:
    rows = [row(i, 100.0, extra=(point(0.05, metric="ttft_s"), point(90.0, arm="int8"))) for i in range(8)]
    assert {s.label for s in history.trends(rows)} == {
        "decode_tps[short@code] fp8",
        "ttft_s[short@code] fp8",
        "decode_tps[short@code] int8",
    }
    assert [s.label for s in history.trends(rows, metrics=["ttft_s"])] == ["ttft_s[short@code] fp8"]
    assert [s.label for s in history.trends(rows, probes=["short@code"], arms=["int8"])] == [
        "decode_tps[short@code] int8"
    ]
    assert history.trends(rows, probes=["prefill"]) == []


def test_kvcache_report_history_table_page_and_gate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    means = noisy(5)
    means[20:] *= 0.94
    with SqliteStore(tmp_path / "store") as s:
        for r in history_rows(means):
            s.add_run(r)
    page = tmp_path / "history.html"
    args = ["history", f"--store={tmp_path / 'store'}", f"--html={page}"]
    assert cli.main(args) == 0
    out = capsys.readouterr().out
    assert "decode_tps[short@code] fp8" in out and "change point: decode_tps[short@code] fp8 at run 21" in out
    html = page.read_text()
    assert "data:image/png;base64," in html and "change point: decode_tps[short@code] fp8 at run 21" in html
    with SqliteStore(tmp_path / "store") as s:
        s.add_run(row(30, float(means[20:].mean()) * 0.9))
    assert cli.main([*args, "--gate"]) == 1
    assert "history gate FAIL: decode_tps[short@code] fp8 — newest run " in capsys.readouterr().out
    assert cli.main([*args, "--gate", "--metric=ttft_s"]) == 1  # nothing to judge is no pass
    (tmp_path / "afile").write_text("x")
    assert cli.main(["history", f"--store={tmp_path / 'afile'}"]) == cli.EXIT_USAGE
    assert "ERROR: pytest-kvcache: --store: " in capsys.readouterr().out
