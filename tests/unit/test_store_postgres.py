"""The PostgreSQL store against a real server: ``KV_TEST_POSTGRES_URL`` (``.ci/run`` starts Debian's
postgresql and sets it). Without one the tests skip — on CI (``CI=true``) they fail instead."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_kvcache import store
from pytest_kvcache.config.constants import SettingsError
from pytest_kvcache.jsonio import write_json
from pytest_kvcache.store.postgres import PostgresStore
from tests.factories import make_settings
from tests.unit.test_store import row


@pytest.fixture
def url() -> Iterator[str]:
    given = os.environ.get("KV_TEST_POSTGRES_URL", "")
    if not given:
        if os.environ.get("CI") == "true":
            pytest.fail("KV_TEST_POSTGRES_URL is not set: .ci/run starts PostgreSQL and sets it")
        pytest.skip("no PostgreSQL server (set KV_TEST_POSTGRES_URL)")
    yield given
    import psycopg

    with psycopg.connect(given, autocommit=True) as db:  # leave the next run a clean database
        for table in ("kvcache_baseline_files", "kvcache_baselines", "kvcache_runs"):
            db.execute(f"DROP TABLE IF EXISTS {table}")


def test_history_and_baselines_round_trip(url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    run = tmp_path / "ws" / "r1"
    write_json(run / "run.json", {"run_id": "r1"})
    (run / "arms" / "fp8").mkdir(parents=True)
    (run / "arms" / "fp8" / "evidence.json").write_text('{"status": "stopped"}')
    with PostgresStore(url) as s:
        s.add_run(row(2, 90.0))
        s.add_run(row(1, 100.0))
        s.add_run(row(2, 95.0))
        s.save_baseline("main", run)
    (tmp_path / "cache").rename(tmp_path / "gone")  # another runner: nothing cached locally
    with PostgresStore(url) as other:
        assert [(r["run_id"], r["points"][0]["mean"]) for r in other.runs()] == [("run001", 100.0), ("run002", 95.0)]
        folder = other.baseline("main")
        assert folder is not None and folder.is_relative_to(tmp_path / "cache")
        assert json.loads((folder / "run.json").read_text()) == {"run_id": "r1"}
        assert (folder / "arms" / "fp8" / "evidence.json").read_text() == '{"status": "stopped"}'
        assert [(b["name"], b["run_id"]) for b in other.baselines()] == [("main", "r1")]
        assert other.baseline("nope") is None


def test_an_unreachable_server_is_a_named_usage_error(tmp_path: Path) -> None:
    bad = f"postgresql://kv:secret@127.0.0.1:1/{uuid.uuid4().hex}"
    with pytest.raises(store.StoreError, match=r"cannot open the store postgresql://kv:\*\*\*@127.0.0.1:1/"):
        PostgresStore(bad)
    with pytest.raises(SettingsError, match=r"^--kv-store: cannot open the store postgresql://kv:\*\*\*@"):
        make_settings(tmp_path, {"arms": "auto", "store": bad})
