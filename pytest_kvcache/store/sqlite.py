"""The default store: a folder holding ``store.sqlite`` (the standard library's sqlite3, WAL mode, a busy
timeout: two runners on one machine may write at once) and ``baselines/NAME/``, a full copy of each saved
run folder.

Opening the store checks the database (``PRAGMA quick_check`` and a query of each table as this version
reads it): a garbage or torn ``store.sqlite`` is a StoreError naming the file when the store is opened —
before a run that saves into it boots anything — not a ``sqlite3.DatabaseError`` later."""

from __future__ import annotations

import contextlib
import json
import sqlite3
import time
from pathlib import Path
from typing import Any

from pytest_kvcache.config.values import not_a_folder
from pytest_kvcache.store.base import BaselineEntry, Store, StoreError, copy_folder, history_row
from pytest_kvcache.store.record import RunRow, indexed_columns

DB_FILE = "store.sqlite"
SCHEMA = (
    "CREATE TABLE IF NOT EXISTS runs (run_id TEXT PRIMARY KEY, started_unix_s REAL, recorded_unix_s REAL NOT NULL,"
    " commit_sha TEXT, branch TEXT, comparability TEXT NOT NULL, row_json TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS baselines (name TEXT PRIMARY KEY, run_id TEXT, saved_unix_s REAL NOT NULL)",
)
#: each table as this version reads it: a database of another layout fails these when it is opened
PROBES = (
    "SELECT run_id, started_unix_s, recorded_unix_s, commit_sha, branch, comparability, row_json FROM runs LIMIT 1",
    "SELECT name, run_id, saved_unix_s FROM baselines LIMIT 1",
)
#: what to do about a database that cannot be read (the baselines are the folders beside it)
REMEDY = (
    "move it aside: the baselines are the folders beside it, and kvcache-report store rebuild RUN_DIR… re-creates"
    " the history"
)


def check_folder(root: Path) -> None:
    """A store folder must be a folder (or creatable): a file there is a usage error."""
    if problem := not_a_folder(root, "store folder"):
        raise StoreError(problem)
    if (root / DB_FILE).exists() and not (root / DB_FILE).is_file():
        raise StoreError(f"{root / DB_FILE} is not a file")


class SqliteStore(Store):
    def __init__(self, root: Path) -> None:
        check_folder(root)
        self.root = root
        self.location = str(root)
        self.file = root / DB_FILE
        try:
            root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"cannot open the store {root}: {exc}") from None
        try:
            self._db = sqlite3.connect(self.file, timeout=30.0, isolation_level=None)
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open the store {self.file}: {exc}") from None
        try:
            self._db.execute("PRAGMA busy_timeout = 30000")
            self._db.execute("PRAGMA journal_mode = WAL")
            for statement in SCHEMA:
                self._db.execute(statement)
            problem = self._check()
        except sqlite3.OperationalError as exc:  # locked past the busy timeout, a file it may not open …
            self._db.close()
            raise StoreError(f"cannot open the store {self.file}: {exc}") from None
        except sqlite3.Error as exc:  # garbage: "file is not a database", "database disk image is malformed"
            problem = str(exc)
        if problem is not None:
            self._db.close()
            raise StoreError(f"{self.file}: not a readable run store database ({problem}); {REMEDY}")

    def _check(self) -> str | None:
        """What is wrong with the database, or None: every page (``quick_check``), each table's columns."""
        found = [str(row[0]) for row in self._db.execute("PRAGMA quick_check").fetchall()]
        if found != ["ok"]:
            return "; ".join(found[:3]) or "quick_check found nothing"
        for probe in PROBES:
            try:
                self._db.execute(probe).fetchall()
            except sqlite3.OperationalError as exc:  # "no such column": another layout
                return str(exc)
        return None

    @property
    def baselines_dir(self) -> Path:
        return self.root / "baselines"

    def baseline(self, name: str) -> Path | None:
        path = self.baselines_dir / name
        return path if path.is_dir() else None

    def save_baseline(self, name: str, run: Path) -> Path:
        target = self.baselines_dir / name
        if target.resolve() != run.resolve():
            copy_folder(run, target)
        run_id = _run_id(target)
        self._write(
            "INSERT INTO baselines (name, run_id, saved_unix_s) VALUES (?, ?, ?) "
            "ON CONFLICT(name) DO UPDATE SET run_id = excluded.run_id, saved_unix_s = excluded.saved_unix_s",
            (name, run_id, time.time()),
        )
        return target

    def baselines(self) -> list[BaselineEntry]:
        rows = self._read("SELECT name, run_id, saved_unix_s FROM baselines ORDER BY name")
        known = {r[0]: BaselineEntry(name=r[0], run_id=r[1], saved_unix_s=r[2]) for r in rows}
        if self.baselines_dir.is_dir():  # a folder copied in by hand is a baseline too: the folders are the truth
            for child in sorted(self.baselines_dir.iterdir()):
                if child.is_dir() and not child.name.startswith(".") and child.name not in known:
                    known[child.name] = BaselineEntry(
                        name=child.name, run_id=_run_id(child), saved_unix_s=child.stat().st_mtime
                    )
        return [known[n] for n in sorted(known)]

    def add_run(self, row: RunRow) -> None:
        self._write(
            "INSERT INTO runs (run_id, started_unix_s, recorded_unix_s, commit_sha, branch, comparability, row_json) "
            "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT(run_id) DO UPDATE SET started_unix_s = excluded.started_unix_s,"
            " recorded_unix_s = excluded.recorded_unix_s, commit_sha = excluded.commit_sha, branch = excluded.branch,"
            " comparability = excluded.comparability, row_json = excluded.row_json",
            (*indexed_columns(row), json.dumps(row)),
        )

    def runs(self) -> list[RunRow]:
        rows = self._read(
            "SELECT run_id, row_json FROM runs"
            " ORDER BY COALESCE(started_unix_s, recorded_unix_s), recorded_unix_s, run_id"
        )
        return [history_row(r[1], str(self.file), r[0]) for r in rows]

    def _read(self, sql: str) -> list[tuple[Any, ...]]:
        try:
            return list(self._db.execute(sql).fetchall())
        except sqlite3.Error as exc:
            raise StoreError(f"cannot read the store {self.file}: {exc}; {REMEDY}") from None

    def _write(self, sql: str, params: tuple[object, ...]) -> None:
        try:
            self._db.execute("BEGIN IMMEDIATE")
            self._db.execute(sql, params)
            self._db.execute("COMMIT")
        except sqlite3.Error as exc:
            if self._db.in_transaction:
                with contextlib.suppress(sqlite3.Error):  # a database that went bad under us
                    self._db.execute("ROLLBACK")
            raise StoreError(f"cannot write to the store {self.file}: {exc}") from None

    def close(self) -> None:
        self._db.close()


def _run_id(folder: Path) -> str | None:
    try:
        with (folder / "run.json").open(encoding="utf-8") as fh:
            value = json.load(fh).get("run_id")
    except (OSError, ValueError, AttributeError):
        return None
    return str(value) if value else None
