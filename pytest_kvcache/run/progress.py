"""Where a long run is: the run folder at the start, each boot launching → ready (with the engine's own
phase line every ~10 s while it starts), each measured request of a probe point (``i/N`` and its figure),
and an ETA for the whole run from the boot plan and the times measured so far.

Plain Python: it writes through a :class:`Writer` (the plugin passes pytest's terminal reporter) and is
told what happens by :class:`~pytest_kvcache.run.run.Run` (``RunListener``). ``lines`` mode writes one
line per event (CI logs); ``live`` mode rewrites one line per request in place (a terminal); ``quiet``
(pytest's ``-q``) keeps the boot lines and the ETA only.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path
from typing import Literal, Protocol

from pytest_kvcache.config.plan import Boot
from pytest_kvcache.config.settings import Settings
from pytest_kvcache.metrics import catalogue
from pytest_kvcache.model.evidence import Evidence
from pytest_kvcache.model.records import FidelityRecord, Record
from pytest_kvcache.probes import registry
from pytest_kvcache.probes.registry import depth_label

Mode = Literal["lines", "live", "off"]

#: How often a booting engine's progress is reported.
BOOT_TICK_S = 10.0
#: Engine log lines that say which phase a boot is in (vLLM's own words).
PHASE = re.compile(
    r"(non-default args|Initializing a V1 LLM engine|Loading model|Loading weights|Model loading took"
    r"|torch\.compile|Compiling a graph|Capturing CUDA graphs|KV cache|init engine"
    r"|Starting vLLM server|Started server process|Application startup"
    r"|building llama-server|load_model: loading model|llama_kv_cache: size|model loaded)",
    re.IGNORECASE,
)
LOG_PREFIX = re.compile(r"^\([^)]*\)\s+(?:[A-Z]+\s+[\d-]+\s+[\d:.]+\s+\[[^\]]*\]\s+)?")


class Writer(Protocol):
    def line(self, text: str) -> None: ...

    def rewrite(self, text: str) -> None: ...


def engine_phase(log_path: Path, limit: int = 64 * 1024) -> str | None:
    """The last line of the engine log that names a startup phase, without its logger prefix."""
    try:
        with log_path.open("rb") as fh:
            fh.seek(0, 2)
            fh.seek(max(0, fh.tell() - limit))
            text = fh.read().decode("utf-8", "replace")
    except OSError:
        return None
    found = None
    for raw in text.replace("\r", "\n").splitlines():
        if PHASE.search(raw):
            found = raw
    if found is None:
        return None
    line = LOG_PREFIX.sub("", found.strip())
    return line[:117] + "…" if len(line) > 120 else line


def fmt_s(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 120:
        return f"{seconds / 60:.0f} min"
    return f"{seconds:.0f} s"


def figure(record: Record) -> str:
    """The running figure of one measured request: what its probe is about."""
    metrics = record.get("metrics") or {}
    parts = []
    ttft = metrics.get("ttft_s")
    if ttft is not None:
        short = catalogue.get("ttft_s").short
        parts.append(f"{short} {ttft:.2f} s" if ttft >= 1 else f"{short} {ttft * 1000:.0f} ms")
    for name in ("prefill_tps", "decode_tps"):
        value = metrics.get(name)
        if value is not None and (name != "prefill_tps" or record.get("probe") == "prefill"):
            parts.append(f"{value:,.0f} {catalogue.get(name).short}")
    if not record.get("ok"):
        parts.append(f"FAILED {record.get('error_kind')}")
    elif record.get("excluded_reason"):
        parts.append("excluded")
    return " ".join(parts)


@dataclass(eq=False)
class Progress:
    """A ``RunListener`` that reports progress through ``writer``."""

    writer: Writer
    settings: Settings
    _: KW_ONLY
    mode: Mode
    quiet: bool = False
    clock: Callable[[], float] = time.monotonic
    tick_s: float = BOOT_TICK_S
    tests_total: int = field(default=0, init=False)
    tests_done: int = field(default=0, init=False)
    boots_total: int = field(default=0, init=False)
    boots_done: int = field(default=0, init=False)
    #: time spent booting so far (launch to ready or failure)
    boot_s: float = field(default=0.0, init=False)

    def __post_init__(self) -> None:
        self.started = self.clock()
        # per booting engine (pytest-xdist lanes boot side by side): when it started, and its watcher
        self._boot_started: dict[str, float] = {}
        self._booting: dict[str, threading.Event] = {}
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ what the plugin tells

    def planned(self, tests_per_boot: Mapping[str, int]) -> None:
        self.tests_total = sum(tests_per_boot.values())
        self.boots_total = sum(1 for n in tests_per_boot.values() if n)

    def test_done(self, name: str) -> None:
        self.tests_done += 1
        eta = self.eta()
        if eta and not self.quiet:
            self._line(f"kvcache: {self.tests_done}/{self.tests_total} probe tests done ({name}); run ETA {eta}")

    def eta(self) -> str | None:
        """Remaining time: the boots left at the mean boot time so far, plus the tests left at the mean time
        a test took outside boots. None until one boot and one test are done (a first boot that compiles
        for minutes says nothing about the tests)."""
        if not self.boots_done or not self.tests_done or self.tests_done >= self.tests_total:
            return None
        elapsed = self.clock() - self.started
        per_boot = self.boot_s / self.boots_done
        lanes = max(1, self.settings.lanes)  # pytest-xdist lanes work side by side
        per_test = max(elapsed * lanes - self.boot_s, 0.0) / self.tests_done
        left = max(self.boots_total - self.boots_done, 0) * per_boot + (self.tests_total - self.tests_done) * per_test
        return fmt_s(left / lanes)

    # ------------------------------------------------------------------ RunListener

    def run_opened(self, path: Path) -> None:
        self._line(f"kvcache: run folder {path} (requests.jsonl grows as requests finish)")

    def boot_starting(self, boot: Boot, log_path: Path) -> None:
        position = self.boots_done + 1
        of = f" ({position}/{self.boots_total})" if self.boots_total else ""
        self._line(f"kvcache: {boot.boot_id}{of} launching …")
        stop = threading.Event()
        self._stop_watch(boot.boot_id)
        self._booting[boot.boot_id] = stop
        started = self.clock()
        self._boot_started[boot.boot_id] = started

        def watch() -> None:
            while not stop.wait(self.tick_s):
                phase = engine_phase(log_path)
                self._line(
                    f"kvcache: {boot.boot_id} starting, {fmt_s(self.clock() - started)}"
                    + (f": {phase}" if phase else " (the engine log says nothing yet)")
                )

        threading.Thread(target=watch, name=f"kvcache-boot-{boot.boot_id}", daemon=True).start()

    def _boot_ended(self, boot_id: str) -> None:
        self._stop_watch(boot_id)
        self.boots_done += 1
        started = self._boot_started.pop(boot_id, None)
        if started is not None:
            self.boot_s += self.clock() - started

    def boot_ready(self, boot: Boot, evidence: Evidence) -> None:
        self._boot_ended(boot.boot_id)
        ready = evidence.get("ready_s")
        cache = evidence.get("cache_config") or {}
        what = ", ".join(
            part
            for part in (
                f"cache_dtype={cache.get('cache_dtype')}" if cache.get("cache_dtype") else "",
                f"{int(cache['kv_cache_size_tokens']):,} KV tokens" if cache.get("kv_cache_size_tokens") else "",
            )
            if part
        )
        eta = self.eta()
        after = f" after {ready:.1f} s" if ready is not None else ""
        details = (f" ({what})" if what else "") + (f"; run ETA {eta}" if eta else "")
        self._line(f"kvcache: {boot.boot_id} ready{after}{details}")

    def boot_failed(self, boot: Boot, headline: str) -> None:
        self._boot_ended(boot.boot_id)
        self._line(f"kvcache: {boot.boot_id} FAILED: {headline.splitlines()[0]}")

    def recorded(self, record: Record, of: int | None) -> None:
        if self.quiet or record.get("phase") != "measured":
            return
        if record.get("probe") == "capacity":  # one line a trial, on its last turn: its level and verdict
            summary = (record.get("capacity") or {}).get("summary")
            if summary:
                self._line(f"kvcache: capacity@{record.get('shape')} {record.get('boot')} {summary}")
            return
        index = record.get("index")
        position = ""
        if isinstance(index, int):  # 0-based in the record, 1-based on the screen
            position = f"{index + 1}/{of}" if of else f"#{index + 1}"
        point = record.get("shape") or ""
        if record.get("probe") == "agentic":
            point = f"s{record.get('session')} turn {record.get('turn')}"
        text = f"kvcache: {record.get('probe')}@{point} {record.get('boot')} {position} {figure(record)}".rstrip()
        if self.mode == "live":
            self.writer.rewrite(text)
        else:
            self._line(text)

    def scored(self, entry: FidelityRecord) -> None:
        if self.quiet:
            return
        head = f"kvcache: fidelity@{entry.get('text')} {entry.get('boot')}"
        if not entry.get("ok"):
            text = f"{head} FAILED {entry.get('error')}"
        else:
            depths = ", ".join(depth_label(w["depth"]) for w in entry.get("windows") or [])
            text = (
                f"{head} {entry.get('prompt_tokens', 0):,} tokens scored in {float(entry.get('wall_s') or 0):.1f} s"
                f" (windows at {depths or 'no depth'})" + (" excluded" if entry.get("excluded_reason") else "")
            )
        if self.mode == "live":
            self.writer.rewrite(text)
        else:
            self._line(text)

    def left_out(self, entry: Mapping[str, object]) -> None:
        """A request not sent because it cannot fit the context: said on a line of its own (never rewritten)."""
        self._line(
            f"kvcache: {entry.get('probe')}@{entry.get('point')} {entry.get('boot')} left out: {entry.get('reason')}"
        )

    def closed(self) -> None:
        for boot_id in list(self._booting):
            self._stop_watch(boot_id)

    # ------------------------------------------------------------------ helpers

    def _stop_watch(self, boot_id: str) -> None:
        stop = self._booting.pop(boot_id, None)
        if stop is not None:
            stop.set()

    def _line(self, text: str) -> None:
        if self.mode == "off":
            return
        with self._lock:
            self.writer.line(text)


def requests_of(record: Record, settings: Settings) -> int | None:
    """How many measured requests the record's probe point plans (for ``i/N``), when its spec says
    (``ProbeSpec.planned_requests``)."""
    spec = registry.get(str(record.get("probe")))
    return spec.planned_requests(settings) if spec is not None else None
