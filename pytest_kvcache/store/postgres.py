"""A store in PostgreSQL, for a fleet of runners sharing one history (``--kv-store=postgresql://…``),
through psycopg 3 (``pip install pytest-kvcache[postgres]``).

The history is one table of rows (JSONB); a baseline is a table row per file of its run folder. A run that
compares with a baseline unpacks it into a local cache folder (``$XDG_CACHE_HOME/pytest-kvcache/<store>/``),
which the report then reads like any run folder.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pytest_kvcache.config.locations import cache_dir, redact
from pytest_kvcache.store.base import BaselineEntry, Store, StoreError, copy_folder, history_row
from pytest_kvcache.store.record import RunRow, indexed_columns

SCHEMA = (
    "CREATE TABLE IF NOT EXISTS kvcache_runs (run_id TEXT PRIMARY KEY, started_unix_s DOUBLE PRECISION,"
    " recorded_unix_s DOUBLE PRECISION NOT NULL, commit_sha TEXT, branch TEXT, comparability TEXT NOT NULL,"
    " row_json JSONB NOT NULL)",
    "CREATE TABLE IF NOT EXISTS kvcache_baselines (name TEXT PRIMARY KEY, run_id TEXT,"
    " saved_unix_s DOUBLE PRECISION NOT NULL)",
    "CREATE TABLE IF NOT EXISTS kvcache_baseline_files (name TEXT NOT NULL REFERENCES kvcache_baselines(name)"
    " ON DELETE CASCADE, path TEXT NOT NULL, content BYTEA NOT NULL, PRIMARY KEY (name, path))",
)
#: each table as this version reads it: tables of another layout (of that name) fail these when it is opened
PROBES = (
    "SELECT run_id, started_unix_s, recorded_unix_s, commit_sha, branch, comparability, row_json FROM kvcache_runs"
    " LIMIT 0",
    "SELECT name, run_id, saved_unix_s FROM kvcache_baselines LIMIT 0",
    "SELECT name, path, content FROM kvcache_baseline_files LIMIT 0",
)


class PostgresStore(Store):
    def __init__(self, url: str, env: Mapping[str, str] | None = None) -> None:
        self.location = url
        self._where = redact(url)
        self._cache = cache_dir(url, env if env is not None else os.environ)
        try:
            import psycopg
        except ImportError:
            raise StoreError(
                f"{self._where}: a PostgreSQL store needs psycopg: pip install 'pytest-kvcache[postgres]'"
            ) from None
        self._errors: tuple[type[BaseException], ...] = (psycopg.Error,)
        try:
            self._db: Any = psycopg.connect(url, connect_timeout=10, autocommit=True)
            with self._db.transaction():
                self._db.execute("SELECT pg_advisory_xact_lock(2023)")  # two runners creating the tables at once
                for statement in SCHEMA:
                    self._db.execute(statement)
            for probe in PROBES:
                self._db.execute(probe)
        except psycopg.Error as exc:
            text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise StoreError(f"cannot open the store {self._where}: {text}") from None

    @property
    def baselines_dir(self) -> Path:
        return self._cache

    def baseline(self, name: str) -> Path | None:
        rows = self._query("SELECT path, content FROM kvcache_baseline_files WHERE name = %s ORDER BY path", (name,))
        if not rows:
            return None
        staging = self._cache / f".{name}.download"
        copy_from = staging / "run"
        for rel, content in rows:
            target = copy_from / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(bytes(content))
        try:
            copy_folder(copy_from, self._cache / name)
        finally:
            import shutil

            shutil.rmtree(staging, ignore_errors=True)
        return self._cache / name

    def save_baseline(self, name: str, run: Path) -> Path:
        files = [p for p in sorted(run.rglob("*")) if p.is_file() and not p.is_symlink()]
        run_id = None
        with contextlib.suppress(OSError, ValueError, AttributeError):
            run_id = json.loads((run / "run.json").read_text(encoding="utf-8")).get("run_id")
        try:
            with self._db.transaction():
                self._db.execute("DELETE FROM kvcache_baselines WHERE name = %s", (name,))
                self._db.execute(
                    "INSERT INTO kvcache_baselines (name, run_id, saved_unix_s) VALUES (%s, %s, %s)",
                    (name, run_id, time.time()),
                )
                with self._db.cursor() as cur:
                    cur.executemany(
                        "INSERT INTO kvcache_baseline_files (name, path, content) VALUES (%s, %s, %s)",
                        [(name, str(p.relative_to(run)), p.read_bytes()) for p in files],
                    )
        except self._errors as exc:
            raise StoreError(f"cannot write to the store {self._where}: {exc}") from None
        if run.resolve() != (self._cache / name).resolve():
            copy_folder(run, self._cache / name)
        return self._cache / name

    def baselines(self) -> list[BaselineEntry]:
        rows = self._query("SELECT name, run_id, saved_unix_s FROM kvcache_baselines ORDER BY name", ())
        return [BaselineEntry(name=r[0], run_id=r[1], saved_unix_s=r[2]) for r in rows]

    def add_run(self, row: RunRow) -> None:
        from psycopg.types.json import Jsonb

        sql = (
            "INSERT INTO kvcache_runs (run_id, started_unix_s, recorded_unix_s, commit_sha, branch, comparability,"
            " row_json) VALUES (%s, %s, %s, %s, %s, %s, %s) ON CONFLICT (run_id) DO UPDATE SET"
            " started_unix_s = EXCLUDED.started_unix_s, recorded_unix_s = EXCLUDED.recorded_unix_s,"
            " commit_sha = EXCLUDED.commit_sha, branch = EXCLUDED.branch, comparability = EXCLUDED.comparability,"
            " row_json = EXCLUDED.row_json"
        )
        params = (*indexed_columns(row), Jsonb(dict(row)))
        try:
            self._db.execute(sql, params)
        except self._errors as exc:
            raise StoreError(f"cannot write to the store {self._where}: {exc}") from None

    def runs(self) -> list[RunRow]:
        rows = self._query(
            "SELECT run_id, row_json FROM kvcache_runs ORDER BY COALESCE(started_unix_s, recorded_unix_s),"
            " recorded_unix_s, run_id",
            (),
        )
        return [history_row(r[1], self._where, r[0]) for r in rows]

    def _query(self, sql: str, params: tuple[object, ...]) -> list[tuple[Any, ...]]:
        try:
            return list(self._db.execute(sql, params).fetchall())
        except self._errors as exc:
            raise StoreError(f"cannot read the store {self._where}: {exc}") from None

    def close(self) -> None:
        self._db.close()
