"""The many-stream client against the calibrated stream: the single-stream client's timing model and failure
kinds, the client's load per trial, and the saturation flag firing when the client cannot keep up."""

from __future__ import annotations

import itertools
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from pytest_kvcache.client import Client
from pytest_kvcache.config.settings import Settings
from pytest_kvcache.fanout import Fanout, FanoutError, default_processes
from pytest_kvcache.fanout_plan import Saturation
from pytest_kvcache.probes.concurrency import fanout as probe_fanout
from pytest_kvcache.sample import Sample
from pytest_kvcache.selfcheck.check import chat_payload, compare, match_records
from pytest_kvcache.selfcheck.schedule import Schedule
from pytest_kvcache.selfcheck.stream import StreamServer
from pytest_kvcache.testing.stream_faults import Fault


@pytest.fixture(scope="module")
def server() -> Iterator[StreamServer]:
    with StreamServer(Schedule()) as s:
        yield s


@pytest.fixture(scope="module")
def fanout(server: StreamServer) -> Iterator[Fanout]:
    with Fanout(server.url, processes=2, stall_timeout_s=0.4, request_timeout_s=5.0) as f:
        yield f


def trial(server: StreamServer, fanout: Fanout, schedule: Schedule, streams: int, tokens: int = 8) -> list[Sample]:
    server.set_schedule(schedule)
    server.clear_requests()
    return fanout.trial([chat_payload(tokens, f"s{k}") for k in range(streams)]).samples


def test_every_stream_is_timed_like_the_single_stream_client(server: StreamServer, fanout: Fanout) -> None:
    schedule = Schedule(ttft_s=0.05, itl_s=0.004, completion_tokens=8, prompt_tokens=20, cached_tokens=4)
    samples = trial(server, fanout, schedule, 6)
    with Client(server.url) as client:
        single = client.stream_chat(chat_payload(8, "single"))
    records = match_records(server.wait_finished(7))
    for k, sample in enumerate(samples):
        assert sample.ok and sample.token_clock == single.token_clock == "usage"
        for name in ("completion_tokens", "prompt_tokens", "cached_tokens", "token_chunks", "finish_reason", "chunks"):
            assert getattr(sample, name) == getattr(single, name), name
        assert sample.first_token_s is not None and sample.last_token_s is not None and sample.end_s is not None
        assert 0.05 <= sample.first_token_s < sample.last_token_s <= sample.end_s
        timing = compare(
            records[f"s{k}"],
            send_perf_s=sample.send_perf_s,
            first_perf_s=sample.send_perf_s + sample.first_token_s,
            last_perf_s=sample.send_perf_s + sample.last_token_s,
            completion_tokens=8,
        )
        assert 0 <= timing.ttft_error_s < 0.02  # stamped when the bytes arrived: after the server sent them
    sends = [s.send_unix_s for s in samples]
    assert max(sends) - min(sends) < 0.05  # sent together


@pytest.mark.parametrize(
    "fault",
    [
        Fault("drop", 3),
        Fault("drop", 3, reset=False),
        Fault("malformed", 2),
        Fault("stream_error", 2),
        Fault("http_error", status=400),
        Fault("http_error", status=503, message="overloaded"),
        Fault("no_usage"),
        Fault("zero_tokens"),
        Fault("stall", 2, stall_s=1.0),
        Fault("hang", stall_s=1.0),
    ],
    ids=lambda f: f"{f.kind}-{f.status or f.after_chunks}-{'rst' if f.reset else 'fin'}",
)
def test_every_failure_is_the_single_stream_clients_failure(server: StreamServer, fanout: Fanout, fault: Fault) -> None:
    schedule = Schedule(itl_s=0.001, completion_tokens=6, fault=fault)
    (sample,) = trial(server, fanout, schedule, 1, tokens=6)
    with Client(server.url, stall_timeout_s=0.4, request_timeout_s=5.0) as client:
        single = client.stream_chat(chat_payload(6, "single"))
    assert not sample.ok and sample.error_kind == single.error_kind, (sample.error, single.error)
    assert (sample.error or "").split(":")[0] == (single.error or "").split(":")[0]


def test_a_request_longer_than_the_request_timeout(server: StreamServer) -> None:
    server.set_schedule(Schedule(itl_s=0.02, completion_tokens=50, honor_max_tokens=False))
    with Fanout(server.url, request_timeout_s=0.3, stall_timeout_s=5) as short:
        (sample,) = short.trial([chat_payload(50, "long")]).samples
    assert sample.error_kind == "timeout" and "longer than 0.3 s" in (sample.error or "")


def test_a_role_chunk_at_once_does_not_start_the_stall_timeout_of_a_stream() -> None:
    """The many-stream client applies the same rule: the first token (0.6 s) comes after the stall timeout
    (0.2 s) but within the first-token limit (0.3 + 1000/1000 = 1.3 s); the role chunk came at once."""
    schedule = Schedule(ttft_s=0.6, itl_s=0.002, completion_tokens=4, prompt_tokens=1000, role_chunk="early")
    with (
        StreamServer(schedule) as server,
        Fanout(server.url, stall_timeout_s=0.2, first_token_floor_s=0.3, min_prefill_tps=1000) as f,
    ):
        (sample,) = f.trial([chat_payload(4, "role-first")], prompt_tokens=[1000]).samples
    assert sample.ok, sample.error
    assert sample.first_token_s is not None and sample.first_token_s >= 0.6


def test_a_first_token_later_than_its_limit() -> None:
    schedule = Schedule(ttft_s=1.0, completion_tokens=4, prompt_tokens=200)
    with (
        StreamServer(schedule) as slow,
        Fanout(slow.url, stall_timeout_s=0.2, first_token_floor_s=0.3, min_prefill_tps=1000) as f,
    ):
        (sample,) = f.trial([chat_payload(4, "late")], prompt_tokens=[200]).samples
    assert sample.error_kind == "first_token_timeout"
    assert "first-token limit of 0.5 s" in (sample.error or "")


def test_a_hung_server_fails_after_the_stall_timeout_as_the_single_stream_client_says() -> None:
    """No response headers within the stall timeout: hung, not a slow prefill (the first-token limit is 30 s)."""
    limits = {"stall_timeout_s": 0.3, "first_token_floor_s": 30.0}
    with StreamServer(Schedule(fault=Fault("hang", stall_s=10.0))) as hung, Fanout(hung.url, **limits) as f:
        started = time.monotonic()
        samples = f.trial([chat_payload(4, "a"), chat_payload(4, "b")]).samples
        took = time.monotonic() - started
        with Client(hung.url, **limits) as client:
            single = client.stream_chat(chat_payload(4, "single"))
    assert took < 10, took  # the first-token limit is 30 s
    assert [s.error_kind for s in samples] == ["no_response", "no_response"] and single.error_kind == "no_response"
    assert samples[0].error == single.error


def test_nothing_listening_fails_every_stream_as_a_connection_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with Fanout(f"http://127.0.0.1:{port}", connect_timeout_s=2) as f:
        samples = f.trial([chat_payload(4, "a"), chat_payload(4, "b")]).samples
    assert [s.error_kind for s in samples] == ["connection_error", "connection_error"]
    assert (samples[0].error or "").startswith(f"cannot connect to http://127.0.0.1:{port}")


def test_offsets_are_kept_and_the_schedule_delay_is_measured(server: StreamServer, fanout: Fanout) -> None:
    server.set_schedule(Schedule(completion_tokens=4))
    result = fanout.trial([chat_payload(4, f"o{k}") for k in range(4)], offsets_s=[0.0, 0.1, 0.2, 0.3])
    sends = sorted(s.send_perf_s for s in result.samples)
    gaps = [b - a for a, b in itertools.pairwise(sends)]
    assert all(0.09 < g < 0.12 for g in gaps), gaps
    load = result.load
    assert load.processes == 2 and load.streams == 4 and load.chunks == sum(s.chunks for s in result.samples)
    assert 0 <= load.schedule_delay_p50_s <= load.schedule_delay_max_s < 0.02
    assert load.cpu_per_chunk_us is not None and load.cpu_share_max < 1.0 and not load.saturated


def test_a_dead_worker_is_an_error_not_a_hang(server: StreamServer) -> None:
    with Fanout(server.url) as f:
        for process in f.processes_alive():
            process.kill()
            process.join(5)
        with pytest.raises(FanoutError, match="worker process"):
            f.trial([chat_payload(4, "x")])
    assert not f.processes_alive()


KILLED_PARENT = """
import os, sys, threading, time
from pytest_kvcache.fanout import Fanout
from pytest_kvcache.selfcheck.check import chat_payload
if __name__ == "__main__":
    fanout = Fanout(sys.argv[1]).start()
    (worker,) = fanout.processes_alive()
    threading.Thread(target=fanout.trial, args=([chat_payload(400, "long")],), daemon=True).start()
    print(worker.pid, flush=True)
    time.sleep(0.5)
    os._exit(0)  # the parent dies mid-trial, cleaning up nothing
"""


def test_a_worker_whose_parent_died_mid_trial_exits(tmp_path: Path) -> None:
    script = tmp_path / "parent.py"
    script.write_text(KILLED_PARENT)
    with StreamServer(Schedule(itl_s=0.02, completion_tokens=400)) as server:  # an 8 s stream, served from here
        parent = subprocess.run(
            [sys.executable, str(script), server.url], capture_output=True, text=True, timeout=60, check=True
        )
        pid = int(parent.stdout.split()[0])
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and _alive(pid):
            time.sleep(0.05)
        assert not _alive(pid), "the worker outlived its parent"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def test_default_processes() -> None:
    assert default_processes(4, cores=16) == 1
    assert default_processes(64, cores=16) == 1
    assert default_processes(256, cores=16) == 4
    assert default_processes(1024, cores=16) == 8
    assert default_processes(256, cores=2) == 1


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs Linux CPU affinity")
def test_a_client_that_cannot_keep_up_is_flagged_saturated() -> None:
    """Overload on purpose: the worker process is pinned to one core with a busy process and reniced, so it
    gets a sliver of that core while 32 streams send a chunk every half millisecond each (64,000 chunks/s
    asked of a 2 s trial). Its loop falls behind — the backlog it finds on each wake-up takes longer than the
    lag bound to read — and the trial is flagged; an unloaded trial of 16 streams at 1 ms is not. (With 16
    streams at 1 ms the starved client kept up often enough that only its late start was judged, so the
    overload here asks four times as much.)"""
    calm_streams = [chat_payload(300, f"c{k}") for k in range(16)]
    heavy_streams = [chat_payload(1000, f"o{k}") for k in range(32)]
    with StreamServer(Schedule(ttft_s=0.02, itl_s=0.001)) as server, Fanout(server.url, processes=1) as f:
        calm = f.trial(calm_streams).load
        server.set_schedule(Schedule(ttft_s=0.02, itl_s=0.0005))
        (worker,) = f.processes_alive()
        core = min(os.sched_getaffinity(0))
        hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        try:
            os.sched_setaffinity(hog.pid, {core})
            os.sched_setaffinity(worker.pid, {core})
            os.setpriority(os.PRIO_PROCESS, worker.pid, 19)
            time.sleep(0.2)
            starved = f.trial(heavy_streams)
        finally:
            hog.kill()
            hog.wait()
    assert not calm.saturated, calm.reasons
    load = starved.load
    assert load.saturated and any("lag" in r for r in load.reasons), load
    assert load.loop_lag_p99_s > Saturation().max_loop_lag_s


def test_the_probes_many_stream_client_takes_the_engines_way_with_headers_and_the_settings_bounds() -> None:
    """Capacity and concurrency build their client in one place: an engine that sends its headers only with the
    first token (llama.cpp) is not timed as one that sends them at once, and capacity's schedule bound is added to
    the settings' CPU and loop-lag bounds (None: not judged)."""
    for at_once in (True, False):
        server = SimpleNamespace(url="http://127.0.0.1:9/", profile=SimpleNamespace(headers_at_once=at_once))
        st = Settings(arms=(), client_max_cpu_pct=50.0, client_max_lag_ms=None)
        client = probe_fanout(server, st, 8, max_schedule_delay_s=0.5)
        assert client.limits.headers_at_once is at_once
        assert client.saturation == Saturation(max_cpu_share=0.5, max_loop_lag_s=float("inf"), max_schedule_delay_s=0.5)
        assert client.processes == default_processes(8)
