"""One run folder from many workers: what a pytest-xdist worker's run writes travels to the controller's.

A worker measures into a run folder of its own, on its own host (``<report_dir>/workers/<run>-lane<N>``),
and its :class:`Outbox` collects every write as it becomes durable — each record, each side-log line,
each evidence file, the new part of its engine logs and GPU trace. The plugin drains the outbox into
every test report (setup, call and teardown), which pytest-xdist carries to the controller as the test
ends; there :func:`apply` writes them into the run's one folder. What a worker measured therefore reaches
the controller test by test, over the same channel for a local worker and an ssh gateway, and survives
the worker's death (only the test in flight is lost, and the worker's own folder keeps even that).

Events are ``(kind, name, text)`` triples of strings, so any channel can carry them:

- ``append``  ``requests.jsonl`` and one record's JSON line;
- ``log``     a side log (``agreement.jsonl``, ``sampling.jsonl`` …) and one JSON line;
- ``write``   a JSON file of the run (``arms/<boot>/evidence.json``, ``run.json`` …) and its text;
- ``chunk``   a text file (``arms/<boot>/engine.log``, ``gpu.jsonl``) and its new bytes;
- ``listener`` a :class:`~pytest_kvcache.run.run.RunListener` method and its JSON arguments.

On the controller, per-boot files keep their paths (boot ids are unique in a run); the records and the
shared side logs are merged; the worker's own run-level files land under ``lanes/<N>/``.

Plain Python: no pytest, no xdist.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, cast

from pytest_kvcache.config.plan import Boot
from pytest_kvcache.model.evidence import Evidence
from pytest_kvcache.model.records import Record
from pytest_kvcache.run.folder import RunFolder

Event = tuple[str, str, str]

#: Side logs whose lines name their boot: merged into the controller's file of the same name.
SHARED_LOGS = frozenset({"agreement.jsonl", "sampling.jsonl", "fidelity.jsonl", "retrieval.jsonl"})
#: At most this much of a file is forwarded at once (an engine log can be large; the worker keeps it all).
CHUNK_LIMIT = 4 * 1024 * 1024


class Outbox:
    """A worker's writes, queued for the controller until the plugin drains them into a test report."""

    def __init__(self) -> None:
        self._events: list[Event] = []
        self._offsets: dict[Path, int] = {}
        self._lock = threading.Lock()

    def tap(self, kind: str, name: str, text: str) -> None:
        with self._lock:
            self._events.append((kind, name, text))

    def sync(self, name: str, path: Path) -> None:
        """Queue what ``path`` gained since the last sync (as ``name`` on the controller)."""
        try:
            size = path.stat().st_size
        except OSError:
            return
        start = self._offsets.get(path, 0)
        if size <= start:
            return
        with path.open("rb") as fh:
            fh.seek(max(start, size - CHUNK_LIMIT))
            data = fh.read(size - start)
        self._offsets[path] = size
        skipped = max(0, size - CHUNK_LIMIT - start)
        text = data.decode("utf-8", "replace")
        if skipped:
            text = f"# pytest-kvcache: {skipped} bytes left out here (the worker's own copy has them)\n{text}"
        self.tap("chunk", name, text)

    def listener(self, method: str, **arguments: object) -> None:
        self.tap("listener", method, json.dumps(arguments, default=str))

    def drain(self) -> list[Event]:
        with self._lock:
            events, self._events = self._events, []
        return events


class ForwardingListener:
    """A worker's :class:`~pytest_kvcache.run.run.RunListener`: boots starting, ready and failed go to the
    controller's progress (records and scores travel as the writes they are)."""

    def __init__(self, outbox: Outbox) -> None:
        self.outbox = outbox

    def run_opened(self, path: Path) -> None:
        self.outbox.listener("run_opened", path=str(path))

    def boot_starting(self, boot: Boot, log_path: Path) -> None:
        self.outbox.listener("boot_starting", boot=boot.boot_id, log_path=str(log_path))

    def boot_ready(self, boot: Boot, evidence: Evidence) -> None:
        # what the ready line shows: the evidence file itself is written (and travels) just after
        shown = {k: v for k, v in evidence.items() if k in ("ready_s", "cache_config")}
        self.outbox.listener("boot_ready", boot=boot.boot_id, evidence=shown)

    def boot_failed(self, boot: Boot, headline: str) -> None:
        self.outbox.listener("boot_failed", boot=boot.boot_id, headline=headline)

    def recorded(self, record: Any, of: int | None) -> None:
        return None

    def scored(self, entry: Any) -> None:
        return None

    def closed(self) -> None:
        return None


def target(name: str, lane: int) -> str:
    """Where a worker's file goes in the controller's folder: per-boot files and shared logs keep their
    path; the worker's run-level files go under ``lanes/<lane>/``."""
    if name.startswith("arms/") or name in SHARED_LOGS:
        return name
    return f"lanes/{lane}/{name}"


class Collector(Protocol):
    """What :func:`apply` needs of the controller's run (``run.run.Run``)."""

    evidence: dict[str, Evidence]
    lane_meta: dict[int, dict[str, Any]]
    listeners: list[Any]

    def open(self) -> RunFolder: ...

    def ingest(self, rec: Record) -> None: ...

    def write_meta(self, status: str) -> None: ...

    def replay(self, method: str, arguments: Mapping[str, Any]) -> None: ...


def apply(run: Collector, lane: int, events: Iterable[Sequence[str]]) -> None:
    """Write a worker's events into the controller's run (its folder, records, evidence and listeners)."""
    folder = run.open()
    for kind, name, text in events:
        if kind == "append":
            run.ingest(json.loads(text))
        elif kind == "log":
            folder.add_text(target(name, lane), text + "\n")
            if name == "fidelity.jsonl":
                for listener in run.listeners:
                    listener.scored(json.loads(text))
        elif kind == "write":
            data = json.loads(text)
            folder.write(target(name, lane), data)
            if name.startswith("arms/") and name.endswith("/evidence.json") and isinstance(data, dict):
                run.evidence[name.split("/")[1]] = cast(Evidence, data)
                run.write_meta(status="running")
            elif name == "run.json" and isinstance(data, dict):
                run.lane_meta[lane] = data
        elif kind == "chunk":
            folder.add_text(target(name, lane), text)
        elif kind == "listener":
            run.replay(name, json.loads(text))
