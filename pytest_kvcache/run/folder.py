"""The run folder: everything a run measured, written as it happens.

Layout (``docs/records.md`` documents every field)::

    <report_dir>/<run_id>/
        run.json                 settings, boot plan, versions (rewritten as the run progresses)
        engines.json             pids of live engines and the owning pytest pid (for the reaper)
        requests.jsonl           one record per request, appended and fsync'ed before the next starts
        agreement.jsonl          greedy token ids and logprobs per short shape and boot (output agreement)
        sampling.jsonl           why each adaptive sampling loop or round of boots stopped
        selfcheck.json           the measuring client's own error and overhead on this machine
        arms/<boot_id>/engine.log
        arms/<boot_id>/evidence.json
    <report_dir>/latest -> <run_id>

Plain Python: no pytest, no server access.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import threading
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

from pytest_kvcache.jsonio import write_json
from pytest_kvcache.metrics.prometheus import spec_metrics
from pytest_kvcache.model.base import RECORD_SCHEMA_VERSION
from pytest_kvcache.model.records import Record, SampleData
from pytest_kvcache.probes.registry import ENGINE_METRICS
from pytest_kvcache.sample import Sample

SCHEMA_VERSION = RECORD_SCHEMA_VERSION


def new_run_id(now: float | None = None) -> str:
    stamp = datetime.fromtimestamp(now if now is not None else time.time(), tz=UTC).strftime("%Y%m%dT%H%M%SZ")
    return f"{stamp}-{secrets.token_hex(3)}"


def read_records(path: Path) -> list[Record]:
    """Read a requests.jsonl; a torn last line (the run was killed mid-write) is skipped (the report's
    loader, ``report.load``, also counts it)."""
    records: list[Record] = []
    if not path.exists():
        return records
    with path.open(encoding="utf-8") as fh:
        for line in fh:
            line = line.strip()
            if not line:
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return records


#: ``tap(kind, name, text)``: told of every write — ``append`` (a record's line), ``log`` (a side log's line)
#: or ``write`` (a JSON file's text) — after it is durable (a pytest-xdist worker forwards them).
Tap = Callable[[str, str, str], None]


class RunFolder:
    """One run's folder and its append-only request log.

    ``name`` (default: the run id) names the folder; a pytest-xdist worker's folder is named after its
    lane, holds the controller's run id and leaves ``latest`` alone (``link_latest=False``).
    """

    def __init__(
        self, root: Path, run_id: str | None = None, *, name: str | None = None, link_latest: bool = True
    ) -> None:
        self.root = root
        self.run_id = run_id or new_run_id()
        self.path = root / (name or self.run_id)
        self.link_latest = link_latest
        self.tap: Tap | None = None
        self._lock = threading.Lock()
        self._fh: Any = None

    def create(self) -> RunFolder:
        self.path.mkdir(parents=True, exist_ok=False)
        (self.path / "arms").mkdir()
        self._fh = (self.path / "requests.jsonl").open("a", encoding="utf-8")
        if not self.link_latest:
            return self
        latest = self.root / "latest"
        with contextlib.suppress(OSError):
            tmp = self.root / f".latest.{os.getpid()}"
            if tmp.is_symlink() or tmp.exists():
                tmp.unlink()
            tmp.symlink_to(self.run_id)
            os.replace(tmp, latest)
        return self

    @property
    def requests_path(self) -> Path:
        return self.path / "requests.jsonl"

    def arm_dir(self, boot_id: str) -> Path:
        path = self.path / "arms" / boot_id
        path.mkdir(parents=True, exist_ok=True)
        return path

    def write(self, name: str, data: Any) -> Path:
        path = self.path / name
        write_json(path, data)
        if self.tap is not None:
            self.tap("write", name, json.dumps(data, default=str))
        return path

    def add_text(self, name: str, text: str) -> None:
        """Append ``text`` to a file of the run (made if missing), durably: what a worker forwarded."""
        path = self.path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        with self._lock, path.open("a", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())

    def append(self, record: Mapping[str, Any]) -> None:
        """Append one record and make it durable before returning."""
        line = json.dumps(record, default=str, separators=(",", ":"))
        with self._lock:
            if self._fh is None:
                raise RuntimeError(f"run folder {self.path} is closed")
            self._fh.write(line + "\n")
            self._fh.flush()
            os.fsync(self._fh.fileno())
        if self.tap is not None:
            self.tap("append", "requests.jsonl", line)

    def log(self, name: str, record: Mapping[str, Any]) -> None:
        """Append one line to a side log of the run (``agreement.jsonl``, ``sampling.jsonl`` …), durably."""
        line = json.dumps(record, default=str, separators=(",", ":"))
        with self._lock, (self.path / name).open("a", encoding="utf-8") as fh:
            fh.write(line + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        if self.tap is not None:
            self.tap("log", name, line)

    def close(self) -> None:
        with self._lock:
            if self._fh is not None:
                self._fh.close()
                self._fh = None


CONTEXT_KEYS = ("probe", "shape", "depth", "turn", "session", "phase", "index")


def make_record(sample: Sample, *, run_id: str, arm: str, boot: str, replicate: int, **context: Any) -> Record:
    """One ``requests.jsonl`` line: where the request belongs, what it measured, and whether it counts.

    ``excluded_reason`` is set when the sample must not enter statistics (a failed sample: its error);
    ``voided`` names single metrics a flag removed (e.g. ``decode_tps`` of a too-short decode window).
    """
    metrics, flags, voided = sample.measures()
    extra_flags = list(context.pop("flags", []) or [])
    excluded = context.pop("excluded_reason", None)
    if not sample.ok:
        excluded = f"{sample.error_kind}: {sample.error}"
    for metric in voided:
        metrics[metric] = None
    engine = context.get("engine") or {}
    if sample.ok:  # engine-side timings and speculative acceptance (``/metrics`` deltas) become metrics
        for key in ENGINE_METRICS:
            if key in engine:
                metrics[key] = engine[key]
        metrics.update(spec_metrics(engine))
    record: dict[str, Any] = {  # context keys are the probe's own (docs/records.md): checked as Record below
        "schema_version": SCHEMA_VERSION,
        "run_id": run_id,
        "arm": arm,
        "boot": boot,
        "replicate": replicate,
    }
    for key in CONTEXT_KEYS:
        record[key] = context.pop(key, None)
    record.update(
        {
            "ok": sample.ok,
            "flags": [*flags, *extra_flags],
            "excluded_reason": excluded,
            "voided": voided,
            "error_kind": sample.error_kind,
            "error": sample.error,
            "metrics": metrics,
            "sample": cast(SampleData, sample.to_dict()),
        }
    )
    record.update(context)
    return cast(Record, record)
