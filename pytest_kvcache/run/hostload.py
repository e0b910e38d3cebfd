"""Host CPU busy outside the measurement: ``HostSampler``, a background thread that reads ``/proc`` a few
times a second and tells, per request window, how much of the host's CPU other work took.

Each reading has two steps. A *scan* reads ``/proc/<pid>/stat`` of every process to find the measured
ones (pid, parent, process group); it may be slow on a loaded host (hundreds of files, and the sampler
thread shares the GIL with the measuring client). Then a *tick reading* reads, back to back, the ``cpu``
line of ``/proc/stat`` (host busy and total clock ticks, all cores), the ``stat`` of each measured process
(utime + stime, all threads) and ``/proc/stat`` again; the host's ticks are the mean of the two host reads,
so host and process ticks refer to the same instant however long the scan took. (When the whole pass was
one reading, a scan stalled for seconds put the engine's ticks of those seconds into the previous interval
and left the long interval looking busy with other work.) A tick reading whose two host reads lie further
apart than a tenth of an interval (``max_span_ticks``: the sampler thread was descheduled in between,
which on a loaded 2-core host happens for seconds) is taken again, up to ``READ_ATTEMPTS`` times; an
interval whose boundary readings stay blurred beyond a tenth of its ticks counts as ``blurred`` and never
decides a maximum. Between two tick readings ``a`` and ``b`` (one *interval*, one ``hostcpu.jsonl``
line)::

    host_busy   = Δ(user + nice + system + irq + softirq + steal)
    host_total  = Δ(user + nice + system + idle + iowait + irq + softirq + steal)
    own         = Σ over the measured processes at b of Δ(utime + stime)    (a process new since a: all of it)
    other_busy_pct = 100 · clamp((host_busy − own) / host_total, 0, 1)

so 100 % is every core of the host, and one busy process on a 2-core host is about 50 %. The *measured
processes* are asked for at every reading (engines come and go) as an :class:`Owned`: the pytest
process (the measuring client runs in it, in threads), each process-launcher engine's process group,
and each docker-launcher engine's container: its main process (found once per container by the
container id in ``/proc/<pid>/cgroup``) and all its descendants. Not counted as measured, so counted as
*other*: processes of ours that live shorter than one interval (never seen by a reading), CPU time of
reaped children (``cutime``), an external engine (``--kv-launcher=external``) even when it runs on this
host, and a container whose processes this pid namespace cannot see (pytest in another container, or
Docker in a VM) — its engine then counts as other. Steal time (another VM on the same host) is busy.

``window(t0, t1)`` aggregates the intervals that overlap a request (``other_busy_pct_max``,
``other_busy_pct_mean``, ``samples``), first taking a reading of its own when the last one is older than
``t1``, so a request shorter than the interval still has one; short intervals are merged to at least
half the nominal interval before the maximum is taken (one clock tick is 1/(cores · 100) of a second's
capacity). :func:`judge` turns a window into the ``host_cpu_busy`` flag and an exclusion.

Where ``/proc`` cannot be read (not Linux) the sampler records why (``unavailable``, one
``hostcpu.jsonl`` line) and does nothing. Plain Python: no pytest, no server access.
"""

from __future__ import annotations

import bisect
import itertools
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pytest_kvcache.periodic import Looping, every

#: The flag a request gets when its window saw more of the host busy outside the measurement than allowed.
FLAG = "host_cpu_busy"
#: The reading rate the run uses.
DEFAULT_HZ = 4.0
#: How often a container whose processes were not found is looked for again.
CONTAINER_RETRY_S = 5.0
#: How many times a blurred tick reading is taken again.
READ_ATTEMPTS = 5
#: An interval is blurred when its boundary readings' spans exceed this share of its ticks.
BLUR_SHARE = 0.1

Action = Literal["flag", "exclude", "off"]
Write = Callable[[dict[str, Any]], None]


@dataclass(frozen=True, slots=True)
class Owned:
    """The processes that belong to the measurement, as named by the run at one reading."""

    pids: frozenset[int] = frozenset()  # these processes (with all their threads)
    groups: frozenset[int] = frozenset()  # every process of these process groups
    trees: frozenset[int] = frozenset()  # these processes and all their descendants


@dataclass(frozen=True, slots=True)
class Proc:
    """What one ``/proc/<pid>/stat`` says that the sampler needs."""

    pid: int
    ppid: int
    pgrp: int
    start_ticks: int  # since boot: tells a process from a later one with the same pid
    cpu_ticks: int  # utime + stime of all its threads


@dataclass(frozen=True, slots=True)
class Reading:
    """One pass over ``/proc``: the host's cumulative ticks and every process."""

    busy_ticks: int
    total_ticks: int
    procs: Mapping[int, Proc]
    span_ticks: int = 0  # host ticks between the two ``/proc/stat`` reads of a tick reading (its blur)


@dataclass(frozen=True, slots=True)
class HostSample:
    """One interval between two readings (one ``hostcpu.jsonl`` line)."""

    t0_unix_s: float
    t_unix_s: float
    host_busy_ticks: int
    host_total_ticks: int
    own_ticks: int
    own_processes: int
    read_span_ticks: int = 0  # the larger span of its two boundary readings

    @property
    def blurred(self) -> bool:
        return self.read_span_ticks > BLUR_SHARE * max(1, self.host_total_ticks)

    @property
    def other_busy_pct(self) -> float | None:
        return other_busy_pct(self.host_busy_ticks, self.host_total_ticks, self.own_ticks)

    def to_dict(self) -> dict[str, Any]:
        pct = self.other_busy_pct
        return {
            "t0_unix_s": self.t0_unix_s,
            "t_unix_s": self.t_unix_s,
            "host_busy_ticks": self.host_busy_ticks,
            "host_total_ticks": self.host_total_ticks,
            "own_ticks": self.own_ticks,
            "own_processes": self.own_processes,
            "read_span_ticks": self.read_span_ticks,
            "other_busy_pct": None if pct is None else round(pct, 2),
        }


# ------------------------------------------------------------------------------------------ reading /proc


def parse_host_stat(text: str) -> tuple[int, int]:
    """(busy, total) ticks of all cores from ``/proc/stat``'s first ``cpu`` line (guest time is already in
    user and nice)."""
    for line in text.splitlines():
        parts = line.split()
        if parts and parts[0] == "cpu":
            values = [int(v) for v in parts[1:9]] + [0] * max(0, 9 - len(parts))
            user, nice, system, idle, iowait, irq, softirq, steal = values[:8]
            total = user + nice + system + idle + iowait + irq + softirq + steal
            return total - idle - iowait, total
    raise ValueError("no 'cpu' line in /proc/stat")


def parse_proc_stat(pid: int, text: str) -> Proc:
    """One ``/proc/<pid>/stat`` (the command may hold spaces and parentheses: split after the last ``)``)."""
    fields = text.rsplit(")", 1)[1].split()
    # fields[0] is field 3 (state) of proc(5): field N is fields[N - 3]
    return Proc(
        pid=pid,
        ppid=int(fields[1]),
        pgrp=int(fields[2]),
        start_ticks=int(fields[19]),
        cpu_ticks=int(fields[11]) + int(fields[12]),
    )


def read_proc(root: Path = Path("/proc")) -> Reading:
    """One reading of a ``/proc`` tree; raises ``OSError`` when there is none (not Linux)."""
    busy, total = parse_host_stat((root / "stat").read_text())
    procs: dict[int, Proc] = {}
    for entry in root.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            procs[int(entry.name)] = parse_proc_stat(int(entry.name), (entry / "stat").read_text())
        except (OSError, ValueError, IndexError):  # gone while we looked
            continue
    return Reading(busy, total, procs)


def read_ticks(pids: Iterable[int], root: Path = Path("/proc")) -> Reading:
    """A tick reading: ``/proc/stat``, the ``stat`` of each of ``pids`` (those still there), ``/proc/stat``
    again; the host's ticks are the mean of the two host reads and ``span_ticks`` how far apart they were."""
    busy1, total1 = parse_host_stat((root / "stat").read_text())
    procs: dict[int, Proc] = {}
    for pid in pids:
        try:
            procs[pid] = parse_proc_stat(pid, (root / str(pid) / "stat").read_text())
        except (OSError, ValueError, IndexError):  # gone since the scan
            continue
    busy2, total2 = parse_host_stat((root / "stat").read_text())
    return Reading((busy1 + busy2) // 2, (total1 + total2) // 2, procs, span_ticks=total2 - total1)


def owned_pids(owned: Owned, procs: Mapping[int, Proc]) -> set[int]:
    """The pids of ``procs`` that ``owned`` names (a process tree is followed through ``ppid``)."""
    found = {pid for pid in owned.pids if pid in procs}
    found |= {p.pid for p in procs.values() if p.pgrp in owned.groups}
    if owned.trees:
        children: dict[int, list[int]] = {}
        for p in procs.values():
            children.setdefault(p.ppid, []).append(p.pid)
        tree: set[int] = set()
        todo = [pid for pid in owned.trees if pid in procs]
        while todo:
            pid = todo.pop()
            if pid not in tree:
                tree.add(pid)
                todo += children.get(pid, [])
        found |= tree
    return found


def own_ticks(before: Reading, after: Reading, pids: Iterable[int]) -> int:
    """CPU ticks the processes ``pids`` (present at ``after``) used between the two readings."""
    ticks = 0
    for pid in pids:
        now = after.procs[pid]
        then = before.procs.get(pid)
        if then is not None and then.start_ticks == now.start_ticks:
            ticks += max(0, now.cpu_ticks - then.cpu_ticks)
        else:  # started since the last reading: all of its time is in this interval
            ticks += now.cpu_ticks
    return ticks


def other_busy_pct(host_busy_ticks: int, host_total_ticks: int, own_ticks: int) -> float | None:
    """The share (0–100 % of all cores) of an interval busy outside the measured processes."""
    if host_total_ticks <= 0:
        return None
    return 100.0 * min(1.0, max(0.0, (host_busy_ticks - own_ticks) / host_total_ticks))


def container_root_pid(container_id: str, root: Path = Path("/proc")) -> int | None:
    """The topmost process of a container visible here: one whose ``/proc/<pid>/cgroup`` names the
    container id and whose parent's does not. None when this pid namespace sees none of it."""
    members: dict[int, int] = {}
    for entry in root.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if container_id not in (entry / "cgroup").read_text():
                continue
            members[int(entry.name)] = parse_proc_stat(int(entry.name), (entry / "stat").read_text()).ppid
        except (OSError, ValueError, IndexError):
            continue
    roots = sorted(pid for pid, ppid in members.items() if ppid not in members)
    return roots[0] if roots else None


@dataclass(eq=False)
class MeasuredProcesses:
    """The run's ``own`` callable: the pytest process, plus per engine (duck-typed, as the run holds them)
    the process group of an engine with a ``pid`` (the process launcher starts each engine in a new
    session, so its pid is its group) or the process tree of a started container (``container_id`` and
    ``ready_s`` set: the docker launcher)."""

    engines: Callable[[], Sequence[object]]
    root: Path = Path("/proc")
    clock: Callable[[], float] = time.monotonic
    _containers: dict[str, int | float] = field(default_factory=dict)  # id → pid, or (float) when to retry

    def __call__(self) -> Owned:
        groups, trees = set(), set()
        for engine in self.engines():
            pid = getattr(engine, "pid", None)
            container = getattr(engine, "container_id", None)
            if isinstance(pid, int):
                groups.add(pid)
            elif isinstance(container, str) and getattr(engine, "ready_s", None) is not None:
                found = self._container_pid(container)
                if found is not None:
                    trees.add(found)
        return Owned(pids=frozenset({os.getpid()}), groups=frozenset(groups), trees=frozenset(trees))

    def _container_pid(self, container_id: str) -> int | None:
        known = self._containers.get(container_id)
        if isinstance(known, int):
            return known
        if isinstance(known, float) and self.clock() < known:
            return None
        pid = container_root_pid(container_id, self.root)
        self._containers[container_id] = pid if pid is not None else self.clock() + CONTAINER_RETRY_S
        return pid


# ------------------------------------------------------------------------------------------ windows


def summarize(samples: Sequence[HostSample], min_span_s: float = 0.0) -> dict[str, Any]:
    """``other_busy_pct_max`` (over runs of consecutive intervals merged to at least ``min_span_s``),
    ``other_busy_pct_mean`` (tick-weighted over all) and ``samples`` (intervals)."""
    chunks: list[list[HostSample]] = []
    current: list[HostSample] = []
    for s in samples:
        current.append(s)
        if current[-1].t_unix_s - current[0].t0_unix_s >= min_span_s:
            chunks.append(current)
            current = []
    if current:
        if chunks:
            chunks[-1] += current
        else:
            chunks.append(current)

    def pct(group: Sequence[HostSample]) -> float | None:
        busy = sum(s.host_busy_ticks for s in group)
        return other_busy_pct(busy, sum(s.host_total_ticks for s in group), sum(s.own_ticks for s in group))

    peaks = [p for c in chunks if not any(s.blurred for s in c) and (p := pct(c)) is not None]
    mean = pct(samples)
    return {
        "other_busy_pct_max": round(max(peaks), 2) if peaks else None,
        "other_busy_pct_mean": None if mean is None else round(mean, 2),
        "samples": len(samples),
        "blurred": sum(1 for s in samples if s.blurred),
    }


def judge(window: Mapping[str, Any] | None, max_pct: float | None, action: Action) -> tuple[list[str], str | None]:
    """(flags, excluded_reason) of one request's window: ``host_cpu_busy`` when more than ``max_pct`` of the
    host was busy outside the engine and client in some interval of it; excluded only for ``exclude``."""
    peak = (window or {}).get("other_busy_pct_max")
    if max_pct is None or action == "off" or not isinstance(peak, int | float) or peak <= max_pct:
        return [], None
    if action != "exclude":
        return [FLAG], None
    return [FLAG], f"host CPU {peak:.0f}% busy outside the engine and client (> {max_pct:g}%)"


# ------------------------------------------------------------------------------------------ the sampler


class HostSampler(Looping):
    """A background thread taking a reading ``hz`` times a second; each interval goes to ``write`` (one
    ``hostcpu.jsonl`` line) and into memory (about 100 bytes) for ``window()``.

    ``own`` names the measured processes and is called at every reading. ``read`` is the scan (every
    process) and ``ticks`` the tick reading of the measured pids; with ``ticks=None`` the scan's own values
    are the tick reading (fakes in tests hand out whole readings). ``start()`` takes the first reading on
    the caller's thread; where it cannot (no ``/proc``), ``unavailable`` says why, one line says so, and
    nothing runs. ``close()`` stops and
    joins the thread (idempotent) and returns problems worth a note in the report.
    """

    def __init__(
        self,
        own: Callable[[], Owned],
        write: Write | None = None,
        *,
        hz: float = DEFAULT_HZ,
        read: Callable[[], Reading] = read_proc,
        ticks: Callable[[Iterable[int]], Reading] | None = read_ticks,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if hz <= 0:
            raise ValueError(f"sampler rate must be positive, got {hz!r} Hz")
        self.own = own
        self.write = write
        self.hz = hz
        self.read = read
        self.ticks = ticks
        self.clock = clock
        self.unavailable: str | None = None
        self.max_span_ticks = max(2, round(BLUR_SHARE * (os.cpu_count() or 1) * os.sysconf("SC_CLK_TCK") / hz))
        self.retries = 0  # blurred tick readings (each one read again, up to READ_ATTEMPTS in all)
        self.errors = 0
        self.last_error: str | None = None
        self._prev: tuple[float, Reading] | None = None
        self._samples: list[HostSample] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> HostSampler:
        if self._thread is not None or self._stop.is_set():
            raise RuntimeError("host CPU sampler already started")
        try:
            with self._lock:
                self._prev = self._reading()
        except OSError as exc:
            self.unavailable = f"host CPU not sampled: cannot read /proc ({type(exc).__name__}: {exc})"
            self._emit({"kind": "unavailable", "reason": self.unavailable})
            return self
        self._emit({"kind": "start", "hz": self.hz, "cores": os.cpu_count(), "t_unix_s": self._prev[0]})
        self._thread = threading.Thread(target=self._run, name="kvcache-host-sampler", daemon=True)
        self._thread.start()
        return self

    def close(self) -> list[str]:
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join()
        problems = [self.unavailable] if self.unavailable else []
        if self.errors:
            problems.append(f"host CPU sampler: {self.errors} failed reading(s), the last: {self.last_error}")
        return problems

    def __enter__(self) -> HostSampler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _emit(self, record: dict[str, Any]) -> None:
        if self.write is not None:
            self.write(record)

    def _run(self) -> None:  # the first reading was taken by start()
        every(1.0 / self.hz, self._stop, self.sample_once, self._failed, first_after_s=1.0 / self.hz)

    def sample_once(self) -> HostSample | None:
        """Take a reading; keep and write the interval since the last one (None for the first reading)."""
        with self._lock:
            t, reading = self._reading()
            prev, self._prev = self._prev, (t, reading)
            if prev is None:
                return None
            t0, before = prev
            pids = set(reading.procs) if self.ticks is not None else owned_pids(self.own(), reading.procs)
            sample = HostSample(
                t0_unix_s=t0,
                t_unix_s=t,
                host_busy_ticks=reading.busy_ticks - before.busy_ticks,
                host_total_ticks=reading.total_ticks - before.total_ticks,
                own_ticks=own_ticks(before, reading, pids),
                own_processes=len(pids),
                read_span_ticks=max(before.span_ticks, reading.span_ticks),
            )
            self._samples.append(sample)
            self._emit(sample.to_dict())
        return sample

    def _reading(self) -> tuple[float, Reading]:
        """(time, tick reading): the scan finds the measured processes, then their ticks are read at once
        (with ``ticks=None`` the scan is the reading and every process is in it)."""
        scan = self.read()
        if self.ticks is None:
            return self.clock(), scan
        pids = sorted(owned_pids(self.own(), scan.procs))
        for _ in range(READ_ATTEMPTS):
            t = self.clock()
            reading = self.ticks(pids)
            if reading.span_ticks <= self.max_span_ticks:
                break
            self.retries += 1
        return t, reading

    def samples(self) -> list[HostSample]:
        with self._lock:
            return list(self._samples)

    def window(self, t0_unix_s: float, t1_unix_s: float) -> dict[str, Any]:
        """The intervals overlapping ``[t0, t1]``, summarized (:func:`summarize`). While sampling, a reading
        is taken first when the last one is older than ``t1``."""
        prev = self._prev
        if self.unavailable is None and not self._stop.is_set() and prev is not None and prev[0] < t1_unix_s:
            try:
                self.sample_once()
            except Exception as exc:
                self.errors += 1
                self.last_error = f"{type(exc).__name__}: {exc}"
        with self._lock:  # intervals are kept in time order: skip those that ended before t0
            first = bisect.bisect_right(self._samples, t0_unix_s, key=lambda s: s.t_unix_s)
            inside = list(itertools.takewhile(lambda s: s.t0_unix_s < t1_unix_s, self._samples[first:]))
        return summarize(inside, min_span_s=0.5 / self.hz)
