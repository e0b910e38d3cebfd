"""``model.shape.mismatch``: a JSON value read back from a run folder checked against its model type, and the
loader (``report.load``) and the run store using it. The CLI cases are in tests/plugin/test_faults.py."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any, Literal, TypedDict

import pytest

from pytest_kvcache import store
from pytest_kvcache.model.base import Json
from pytest_kvcache.model.evidence import Evidence, RunMeta, SettingsData
from pytest_kvcache.model.records import Record
from pytest_kvcache.model.report import Report
from pytest_kvcache.model.shape import mismatch
from pytest_kvcache.report.load import RunFolderError, load, read_meta
from pytest_kvcache.store.sqlite import SqliteStore
from tests.unit.test_store import row

RESULTS = Path(__file__).parents[2] / "docs" / "results"


class Inner(TypedDict, total=False):
    n: int
    x: float | None
    tags: list[str]


class Outer(TypedDict):
    name: str
    inner: Inner
    rows: list[Inner]
    by_name: dict[str, list[float]]
    grid: list[list[int]]
    word: Literal["a", "b"]
    free: Json
    anything: Any


GOOD: dict[str, Any] = {
    "name": "a",
    "inner": {"n": 1, "x": None, "tags": ["t"]},
    "rows": [{"n": 2, "x": 1}, {}],
    "by_name": {"k": [1, 2.5]},
    "grid": [[1, 2], []],
    "word": "c",  # a Literal is checked for its type, not its words: a newer version may add one
    "free": {"x": [1, {"y": None}]},
    "anything": object(),
    "unknown": "not looked at",
}


def test_a_value_of_its_type_has_no_mismatch() -> None:
    assert mismatch(GOOD, Outer) is None
    assert mismatch({"name": "a"}, Outer) is None  # a missing key is not a type error (an older version)
    nulls = {"name": None, "inner": {"n": None}, "rows": [None], "by_name": {"k": [1, None]}, "grid": [[None]]}
    assert mismatch(nulls, Outer) is None  # nor is null: a value left out


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"name": 3}, "'name' must be a string, got a number"),
        ({"inner": [1]}, "'inner' must be an object, got a list"),
        ({"inner": {"n": 1.5}}, "'inner.n' must be an integer, got a number"),
        ({"inner": {"n": True}}, "'inner.n' must be an integer, got true or false"),
        ({"inner": {"x": "1"}}, "'inner.x' must be a number or null, got a string"),
        ({"inner": {"tags": ["a", 2]}}, "'inner.tags[1]' must be a string, got a number"),
        ({"rows": {"n": 1}}, "'rows' must be a list, got an object"),
        ({"rows": [{}, 3]}, "'rows[1]' must be an object, got a number"),
        ({"rows": [{}, {"n": "2"}]}, "'rows[1].n' must be an integer, got a string"),
        ({"by_name": {"k": [1, "2"]}}, "'by_name.k[1]' must be a number, got a string"),
        ({"grid": [[1], [2, "3"]]}, "'grid[1][1]' must be an integer, got a string"),
        ({"grid": [[1], 2]}, "'grid[1]' must be a list, got a number"),
        ({"word": 1}, "'word' must be a string, got a number"),
    ],
)
def test_the_first_field_of_another_type_is_named(change: dict[str, Any], problem: str) -> None:
    assert mismatch({**GOOD, **change}, Outer) == problem


def test_a_file_that_is_not_an_object() -> None:
    assert mismatch([1], Outer) == "expected an object, got a list"
    assert mismatch(3, SettingsData, "settings") == "'settings' must be an object, got a number"


def test_every_committed_run_folder_has_its_types() -> None:
    """The check is no stricter than what the package writes: every run folder under docs/results passes it."""
    checked = 0
    for run in sorted(RESULTS.glob("**/run/run.json")) + sorted(RESULTS.glob("**/*-run/run.json")):
        meta = json.loads(run.read_text())
        assert mismatch(meta, RunMeta) is None
        assert mismatch(meta.get("settings") or {}, SettingsData, "settings") is None
        for file in run.parent.glob("arms/*/evidence.json"):
            assert mismatch(json.loads(file.read_text()), Evidence) is None, file
        report = run.parent / "report.json"
        if report.is_file():
            assert mismatch(json.loads(report.read_text()), Report) is None, report
        for line in (run.parent / "requests.jsonl").read_text().splitlines()[:50]:
            assert mismatch(json.loads(line), Record) is None
        checked += 1
    assert checked >= 10


# ------------------------------------------------------------------------------------------ the loader


def _folder(path: Path, **meta: object) -> Path:
    (path / "arms" / "auto").mkdir(parents=True)
    base = {"run_id": "r1", "settings": {"arms": [{"name": "auto"}], "seed": 0}, "plan": [{"boot": "auto"}]}
    (path / "run.json").write_text(json.dumps({**base, **meta}))
    record = {"arm": "auto", "boot": "auto", "probe": "short", "shape": "code", "phase": "measured", "ok": True}
    (path / "requests.jsonl").write_text(json.dumps({**record, "metrics": {"decode_tps": 1.0}}) + "\n")
    (path / "arms" / "auto" / "evidence.json").write_text('{"status": "stopped"}')
    return path


@pytest.mark.parametrize(
    ("meta", "problem"),
    [
        ({"settings": 3}, "'settings' must be an object, got a number"),
        ({"settings": {"arms": [["auto"]]}}, "'settings.arms[0]' must be an object, got a list"),
        ({"settings": {"store": 1}}, "'settings.store' must be a string or null, got a number"),
        ({"plan": [{"boot": "auto", "block": "0"}]}, "'plan[0].block' must be an integer, got a string"),
        ({"problems": "one"}, "'problems' must be a list, got a string"),
    ],
)
def test_run_json_of_another_type_is_a_run_folder_error(tmp_path: Path, meta: dict[str, Any], problem: str) -> None:
    folder = _folder(tmp_path / "run", **meta)
    for read in (load, read_meta):
        with pytest.raises(RunFolderError) as raised:
            read(folder)
        assert str(raised.value) == f"{folder / 'run.json'}: {problem}"


def test_a_plan_entry_without_its_boot_is_still_named(tmp_path: Path) -> None:
    folder = _folder(tmp_path / "run", plan=[{"arm": "auto"}])
    with pytest.raises(RunFolderError, match=r"'plan' must be a list of boots, each with a 'boot' name"):
        load(folder)


# ------------------------------------------------------------------------------------------ the run store


def _torn(root: Path) -> Path:
    with SqliteStore(root) as opened:
        for i in range(40):
            opened.add_run(row(i, 100.0))
    db = root / "store.sqlite"
    data = db.read_bytes()
    db.write_bytes(data[:4096] + b"\x00\xff" * ((len(data) - 4096) // 2))
    return db


def test_a_torn_or_garbage_store_is_found_when_it_is_opened(tmp_path: Path) -> None:
    db = _torn(tmp_path / "torn")
    with pytest.raises(store.StoreError) as raised:
        store.open_store(str(tmp_path / "torn"))
    assert str(raised.value).startswith(f"{db}: not a readable run store database (database disk image is malformed)")
    (tmp_path / "garbage").mkdir()
    (tmp_path / "garbage" / "store.sqlite").write_text("x" * 5000)
    with pytest.raises(store.StoreError, match=r"garbage/store.sqlite: not a readable .* \(file is not a database\)"):
        store.open_store(str(tmp_path / "garbage"))


def test_a_store_of_another_layout_is_found_when_it_is_opened(tmp_path: Path) -> None:
    (tmp_path / "s").mkdir()
    with sqlite3.connect(tmp_path / "s" / "store.sqlite") as db:
        db.execute("CREATE TABLE runs (id INTEGER)")
    db.close()
    with pytest.raises(store.StoreError, match=r"s/store.sqlite: not a readable .* \(no such column: run_id\)"):
        store.open_store(str(tmp_path / "s"))


def test_a_history_row_of_another_type_is_named(tmp_path: Path) -> None:
    with SqliteStore(tmp_path / "s") as opened:
        opened.add_run(row(1, 100.0))
        opened._db.execute("UPDATE runs SET row_json = ?", (json.dumps({**row(1, 1.0), "branch": ["main"]}),))
        with pytest.raises(store.StoreError, match=r"history row of run run001: 'branch' must be a string or null"):
            opened.runs()
        opened._db.execute("UPDATE runs SET row_json = '{'")
        with pytest.raises(store.StoreError, match=r"history row of run run001 is not valid JSON"):
            opened.runs()
