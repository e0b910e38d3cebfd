"""Host CPU busy outside the measurement: the arithmetic on a fake /proc, the judge, and no /proc."""

from __future__ import annotations

import itertools
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pytest_kvcache.run.hostload import (
    FLAG,
    HostSample,
    HostSampler,
    MeasuredProcesses,
    Owned,
    Proc,
    Reading,
    container_root_pid,
    judge,
    other_busy_pct,
    owned_pids,
    parse_host_stat,
    parse_proc_stat,
    read_proc,
    read_ticks,
    summarize,
)

ME = os.getpid()


def proc(pid: int, cpu: int, *, ppid: int = 1, pgrp: int | None = None, start: int = 100) -> Proc:
    return Proc(pid=pid, ppid=ppid, pgrp=pgrp if pgrp is not None else pid, start_ticks=start, cpu_ticks=cpu)


def reading(busy: int, total: int, *procs: Proc) -> Reading:
    return Reading(busy, total, {p.pid: p for p in procs})


class FakeProc:
    """Readings handed out one at a time, at clock times 0, 1, 2, … (a fake ``/proc`` and clock)."""

    def __init__(self, *readings: Reading) -> None:
        self.readings: Iterator[Reading] = iter(readings)
        self.times = itertools.count()
        self.now = 0.0

    def read(self) -> Reading:
        return next(self.readings)

    def clock(self) -> float:
        self.now = float(next(self.times))
        return self.now


def sampler(fake: FakeProc, owned: Owned, lines: list[dict[str, Any]] | None = None) -> HostSampler:
    sink = lines.append if lines is not None else None
    return HostSampler(lambda: owned, sink, hz=1.0, read=fake.read, ticks=None, clock=fake.clock)


# ------------------------------------------------------------------------------------------ parsing


STAT = "cpu  100 5 20 800 10 1 2 3 7 0\ncpu0 50 2 10 400 5 0 1 1 3 0\nintr 1 2 3\n"


def test_host_stat_busy_is_everything_but_idle_and_iowait() -> None:
    busy, total = parse_host_stat(STAT)
    assert total == 100 + 5 + 20 + 800 + 10 + 1 + 2 + 3  # guest (7) is already in user
    assert busy == total - 800 - 10


def test_proc_stat_survives_a_command_with_spaces_and_parentheses() -> None:
    fields = ["S", "7", "42"] + ["0"] * 8 + ["30", "12"] + ["0"] * 6 + ["555"] + ["0"] * 30
    text = "123 (my (odd) cmd) " + " ".join(fields)
    assert parse_proc_stat(123, text) == Proc(pid=123, ppid=7, pgrp=42, start_ticks=555, cpu_ticks=42)


def fake_proc_tree(root: Path, procs: dict[int, tuple[int, int, int, str]]) -> None:
    """pid → (ppid, pgrp, cpu ticks, cgroup text) as /proc files under ``root``."""
    root.mkdir()
    (root / "stat").write_text(STAT)
    (root / "self").mkdir()  # not a pid: skipped
    for pid, (ppid, pgrp, cpu, cgroup) in procs.items():
        (root / str(pid)).mkdir()
        fields = ["S", str(ppid), str(pgrp)] + ["0"] * 8 + [str(cpu), "0"] + ["0"] * 6 + ["9"] + ["0"] * 30
        (root / str(pid) / "stat").write_text(f"{pid} (x) " + " ".join(fields))
        (root / str(pid) / "cgroup").write_text(cgroup)
    (root / "999").mkdir()  # a process that went away between listing and reading


def test_read_proc_reads_the_host_and_every_process(tmp_path: Path) -> None:
    fake_proc_tree(tmp_path / "proc", {10: (1, 10, 5, "0::/"), 11: (10, 10, 7, "0::/")})
    got = read_proc(tmp_path / "proc")
    assert (got.busy_ticks, got.total_ticks) == parse_host_stat(STAT)
    assert sorted(got.procs) == [10, 11]
    assert got.procs[11] == Proc(pid=11, ppid=10, pgrp=10, start_ticks=9, cpu_ticks=7)


def test_a_tick_reading_brackets_the_processes_with_two_host_reads(tmp_path: Path) -> None:
    fake_proc_tree(tmp_path / "proc", {10: (1, 10, 5, "0::/"), 11: (10, 10, 7, "0::/")})
    got = read_ticks([11, 999, 12345], tmp_path / "proc")  # 999 and 12345 are gone: skipped
    assert sorted(got.procs) == [11] and got.procs[11].cpu_ticks == 7
    assert (got.busy_ticks, got.total_ticks, got.span_ticks) == (*parse_host_stat(STAT), 0)


def test_a_slow_scan_does_not_move_the_engines_ticks_into_another_interval() -> None:
    """The 2026-12-01 bug: the scan stalled for seconds while the engine ran, so the engine's ticks of the
    stall landed in the previous interval (own 960 of 48 busy) and the long one looked 83 % other. Now the
    scan only names the processes; their ticks and the host's are read together, after it."""
    owned = Owned(groups=frozenset({20}))
    scans = iter([reading(0, 0, proc(20, 0), proc(21, 0, pgrp=20))] * 3)
    # tick readings at t = 0, 1 (0.25 s later in real life), 2 (after a 4.75 s stall): the engine is busy
    ticks = iter(
        [
            Reading(0, 0, {20: proc(20, 0), 21: proc(21, 0, pgrp=20)}, span_ticks=2),
            Reading(48, 48, {20: proc(20, 8), 21: proc(21, 40, pgrp=20)}, span_ticks=1),
            Reading(999, 999, {20: proc(20, 160), 21: proc(21, 830, pgrp=20)}, span_ticks=3),
        ]
    )
    asked: list[list[int]] = []

    def tick_reading(pids: Any) -> Reading:
        asked.append(list(pids))
        return next(ticks)

    fake = FakeProc()
    lines: list[dict[str, Any]] = []
    s = HostSampler(lambda: owned, lines.append, hz=1.0, read=lambda: next(scans), ticks=tick_reading, clock=fake.clock)
    assert s.sample_once() is None
    first, second = s.sample_once(), s.sample_once()
    assert first is not None and second is not None
    assert (first.own_ticks, first.other_busy_pct) == (48, 0.0)
    assert (second.own_ticks, second.host_busy_ticks, second.other_busy_pct) == (
        942,
        951,
        pytest.approx(0.95, abs=0.01),
    )
    assert asked == [[20, 21]] * 3 and [line["read_span_ticks"] for line in lines] == [2, 3]


def test_a_blurred_tick_reading_is_taken_again_and_a_blurred_interval_decides_no_maximum() -> None:
    """A tick reading whose two host reads lie far apart (the thread was descheduled between them) is
    read again; if it stays blurred, the interval is counted but never sets ``other_busy_pct_max``."""
    scans = iter([reading(0, 0, proc(20, 0))] * 3)
    ticks = iter(
        [
            Reading(0, 0, {20: proc(20, 0)}),
            Reading(40, 100, {20: proc(20, 0)}, span_ticks=500),  # blurred: taken again
            Reading(50, 100, {20: proc(20, 50)}),
            *[Reading(90, 200, {20: proc(20, 50)}, span_ticks=500)] * 5,  # blurred every time
        ]
    )
    s = HostSampler(
        lambda: Owned(groups=frozenset({20})), hz=1.0, read=lambda: next(scans), ticks=lambda _: next(ticks)
    )
    s.max_span_ticks = 5
    s.sample_once()
    clean, blurred = s.sample_once(), s.sample_once()
    assert clean is not None and blurred is not None
    assert s.retries == 1 + 5 and not clean.blurred and blurred.blurred
    assert (clean.other_busy_pct, blurred.other_busy_pct) == (0.0, 40.0)
    got = summarize([clean, blurred])
    assert got["other_busy_pct_max"] == 0.0 and got["blurred"] == 1


def test_a_container_is_found_by_its_id_in_the_cgroup_file(tmp_path: Path) -> None:
    cid = "ab12" * 16
    fake_proc_tree(
        tmp_path / "proc",
        {
            50: (1, 50, 0, "0::/system.slice/containerd.service"),  # the shim: not in the container
            60: (50, 60, 0, f"0::/system.slice/docker-{cid}.scope"),
            61: (60, 60, 0, f"0::/system.slice/docker-{cid}.scope"),
        },
    )
    assert container_root_pid(cid, tmp_path / "proc") == 60
    assert container_root_pid("cd34" * 16, tmp_path / "proc") is None


# ------------------------------------------------------------------------------------------ the arithmetic


def test_other_busy_is_the_share_of_all_cores_not_used_by_the_measured_processes() -> None:
    assert other_busy_pct(busy_ticks := 150, 200, 50) == 50.0
    assert other_busy_pct(busy_ticks, 200, 400) == 0.0  # accounting noise never goes negative
    assert other_busy_pct(300, 200, 0) == 100.0
    assert other_busy_pct(0, 0, 0) is None


def test_measured_processes_are_pids_groups_and_trees() -> None:
    procs = {
        p.pid: p
        for p in [
            proc(1, 0, ppid=0),
            proc(ME, 0),
            proc(20, 0, pgrp=20),
            proc(21, 0, ppid=20, pgrp=20),  # the engine's group
            proc(30, 0),  # a container's main process
            proc(31, 0, ppid=30),
            proc(32, 0, ppid=31, pgrp=32),  # a grandchild in a session of its own
            proc(40, 0, ppid=ME),  # a child of pytest (a burner): not measured
        ]
    }
    owned = Owned(pids=frozenset({ME, 12345}), groups=frozenset({20}), trees=frozenset({30}))
    assert owned_pids(owned, procs) == {ME, 20, 21, 30, 31, 32}


def test_an_interval_subtracts_the_measured_processes_and_counts_a_new_one_whole() -> None:
    owned = Owned(pids=frozenset({ME}), groups=frozenset({20}))
    fake = FakeProc(
        reading(1000, 4000, proc(ME, 100), proc(20, 500), proc(90, 0)),
        # 200 ticks of 200 total busy: pytest 30, the engine 60, a new engine child 10 → 100 other
        reading(1200, 4200, proc(ME, 130), proc(20, 560), proc(21, 10, ppid=20, pgrp=20), proc(90, 100)),
        # the engine's pid was reused by an unrelated process: not ours any more (another group), all other
        reading(1400, 4400, proc(ME, 130), proc(20, 5, pgrp=77, start=999), proc(90, 300)),
    )
    lines: list[dict[str, Any]] = []
    s = sampler(fake, owned, lines)
    assert s.sample_once() is None  # the first reading is the baseline
    first = s.sample_once()
    assert first is not None
    assert (first.host_busy_ticks, first.host_total_ticks, first.own_ticks, first.own_processes) == (200, 200, 100, 3)
    assert first.other_busy_pct == 50.0
    second = s.sample_once()
    assert second is not None and (second.own_ticks, second.other_busy_pct) == (0, 100.0)
    assert [line["other_busy_pct"] for line in lines] == [50.0, 100.0]
    assert lines[0] == {**first.to_dict(), "t0_unix_s": 0.0, "t_unix_s": 1.0}
    json.dumps(lines)


def interval(t0: float, t1: float, busy: int, total: int = 100, own: int = 0) -> HostSample:
    return HostSample(t0, t1, busy, total, own, 1)


def test_summary_max_merges_short_intervals_and_mean_weights_by_ticks() -> None:
    samples = [interval(0.0, 1.0, 20), interval(1.0, 2.0, 60), interval(2.0, 2.05, 5, total=5)]  # the last: 100 %
    got = summarize(samples, min_span_s=0.5)
    assert got == {"other_busy_pct_max": 61.9, "other_busy_pct_mean": 41.46, "samples": 3, "blurred": 0}
    assert summarize(samples)["other_busy_pct_max"] == 100.0  # unmerged, one tick decides
    assert summarize([interval(0.0, 0.1, 10)], min_span_s=0.5)["other_busy_pct_max"] == 10.0
    assert summarize([]) == {"other_busy_pct_max": None, "other_busy_pct_mean": None, "samples": 0, "blurred": 0}


def test_a_window_takes_the_intervals_that_overlap_it() -> None:
    s = sampler(FakeProc(*[reading(20 * i * i, 100 * i) for i in range(6)]), Owned())
    for _ in range(5):
        s.sample_once()  # intervals [0,1] 20 %, [1,2] 60 %, [2,3] 100 %, [3,4] 100 % (clamped)
    s.close()  # no closing reading after close
    assert s.window(1.5, 2.5)["samples"] == 2
    assert s.window(1.0, 2.0)["samples"] == 1
    assert s.window(1.2, 1.4) == {"other_busy_pct_max": 60.0, "other_busy_pct_mean": 60.0, "samples": 1, "blurred": 0}
    assert s.window(10.0, 11.0)["samples"] == 0


def test_a_window_newer_than_the_last_reading_takes_one_first() -> None:
    fake = FakeProc(reading(0, 0), reading(50, 100), reading(80, 200))
    s = sampler(fake, Owned())
    s.sample_once()
    s.sample_once()  # [0, 1]
    got = s.window(1.2, 1.3)  # a request shorter than an interval, after the last reading
    assert got == {"other_busy_pct_max": 30.0, "other_busy_pct_mean": 30.0, "samples": 1, "blurred": 0}
    assert fake.now == 2.0


def test_the_thread_samples_at_its_rate_and_close_joins_it(tmp_path: Path) -> None:
    lines: list[dict[str, Any]] = []
    s = HostSampler(lambda: Owned(pids=frozenset({ME})), lines.append, hz=50.0).start()
    try:
        assert s.running
        deadline = time.monotonic() + 30
        while len(lines) < 4 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        assert s.close() == []
    assert not s.running
    assert lines[0]["kind"] == "start" and lines[0]["hz"] == 50.0
    assert all(line["own_processes"] == 1 for line in lines[1:])
    with pytest.raises(RuntimeError):
        s.start()


def test_a_failing_reading_is_counted_never_raised() -> None:
    calls = itertools.count()

    def flaky() -> Reading:
        if next(calls) == 1:
            raise PermissionError("no")
        return reading(0, 0)

    s = HostSampler(Owned, hz=1.0, read=flaky, ticks=None)
    s.sample_once()
    s.window(0.0, 1e12)  # the closing reading fails
    assert s.close() == ["host CPU sampler: 1 failed reading(s), the last: PermissionError: no"]


# ------------------------------------------------------------------------------------------ not Linux


def test_without_proc_the_sampler_says_why_and_does_nothing(tmp_path: Path) -> None:
    lines: list[dict[str, Any]] = []
    s = HostSampler(Owned, lines.append, read=lambda: read_proc(tmp_path / "no-proc")).start()
    assert not s.running
    assert s.unavailable is not None and s.unavailable.startswith("host CPU not sampled: cannot read /proc")
    assert lines == [{"kind": "unavailable", "reason": s.unavailable}]
    assert s.window(0.0, 1e12) == {"other_busy_pct_max": None, "other_busy_pct_mean": None, "samples": 0, "blurred": 0}
    assert s.close() == [s.unavailable]
    assert judge(s.window(0.0, 1.0), 50.0, "exclude") == ([], None)


def test_measured_processes_of_a_run(tmp_path: Path) -> None:
    class ProcessLike:
        pid = 4242

    class ContainerLike:
        pid = None
        container_id = "ef56" * 16
        ready_s: float | None = None

    container = ContainerLike()
    fake_proc_tree(tmp_path / "proc", {70: (1, 70, 0, f"0::/docker/{container.container_id}")})
    now = [0.0]
    measured = MeasuredProcesses(lambda: [ProcessLike(), container, object()], tmp_path / "proc", lambda: now[0])
    assert measured() == Owned(pids=frozenset({ME}), groups=frozenset({4242}))  # the container is not up yet
    container.ready_s = 1.0
    assert measured().trees == frozenset({70})
    container.container_id = "0000" * 16  # not visible here: looked for again only after a while
    assert measured().trees == frozenset()
    fake_proc_tree(tmp_path / "proc2", {71: (1, 71, 0, f"0::/docker/{container.container_id}")})
    measured.root = tmp_path / "proc2"
    assert measured().trees == frozenset()
    now[0] = 10.0
    assert measured().trees == frozenset({71})


# ------------------------------------------------------------------------------------------ the judge


@pytest.mark.parametrize(
    ("peak", "max_pct", "action", "expected"),
    [
        (63.4, 50.0, "flag", ([FLAG], None)),
        (63.4, 50.0, "exclude", ([FLAG], "host CPU 63% busy outside the engine and client (> 50%)")),
        (50.0, 50.0, "exclude", ([], None)),  # at the limit is not over it
        (99.0, 12.5, "exclude", ([FLAG], "host CPU 99% busy outside the engine and client (> 12.5%)")),
        (99.0, None, "exclude", ([], None)),
        (99.0, 50.0, "off", ([], None)),
        (None, 50.0, "exclude", ([], None)),  # no interval in the window
    ],
)
def test_judge(peak: float | None, max_pct: float | None, action: Any, expected: tuple[list[str], str | None]) -> None:
    window = {"other_busy_pct_max": peak, "other_busy_pct_mean": peak, "samples": 0 if peak is None else 1}
    assert judge(window, max_pct, action) == expected
    assert judge(None, 50.0, "flag") == ([], None)
