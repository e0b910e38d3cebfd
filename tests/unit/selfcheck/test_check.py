"""The measuring client's self-check (`pytest_kvcache.selfcheck.check`): error arithmetic, live check, warning.

Live parts run on loopback against a calibrated `StreamServer` (about 2 s in all). Tolerances are loose on
purpose (a loaded 2-core CI machine): the live assertions check structure and relations — an accurate
stream measures near zero, an injected client stall measures as what it is.
"""

from __future__ import annotations

import http.client
import time
from typing import Any

import pytest

from pytest_kvcache.client import Client
from pytest_kvcache.sample import Sample
from pytest_kvcache.selfcheck.check import (
    ServerProcess,
    chat_payload,
    compare,
    compare_sample,
    match_records,
    overhead_warning,
    run_self_check,
    summarize,
)
from pytest_kvcache.selfcheck.schedule import Schedule, ServedRequest
from pytest_kvcache.selfcheck.stream import StreamServer
from pytest_kvcache.testing.stream_faults import Fault


def served(arrival: float, sent: list[float], deadlines: list[float] | None = None) -> ServedRequest:
    """A record whose token chunks left at ``sent`` (role chunk first, as vLLM does)."""
    record = ServedRequest("POST", "/v1/chat/completions", {}, 1, arrival_s=arrival)
    record.chunk_times_s = [sent[0], *sent]
    record.token_chunk_indices = list(range(1, len(sent) + 1))
    record.token_deadlines_s = deadlines if deadlines is not None else list(sent)
    return record


def test_compare_is_exact_arithmetic() -> None:
    # Sent at 100.0; arrived 1 ms later; 11 tokens every 2 ms from 100.151; the client saw each 0.5 ms late,
    # the last one 2.5 ms late (a client that fell behind at the end).
    sent = [100.151 + 0.002 * i for i in range(11)]
    record = served(100.001, sent, deadlines=[t - 0.0001 for t in sent])
    timing = compare(
        record,
        send_perf_s=100.0,
        first_perf_s=sent[0] + 0.0005,
        last_perf_s=sent[-1] + 0.0025,
        completion_tokens=11,
        client_cpu_s=0.0013,
        client_chunks=13,
    )
    assert timing.ttft_true_s == pytest.approx(0.150)
    assert timing.ttft_measured_s == pytest.approx(0.1515)
    assert timing.ttft_error_s == pytest.approx(0.0015)
    assert timing.ttft_error_pct == pytest.approx(1.0)
    assert timing.send_lag_s == pytest.approx(0.001)
    assert timing.first_lag_s == pytest.approx(0.0005)
    assert timing.last_lag_s == pytest.approx(0.0025)
    assert timing.decode_tps_true == pytest.approx(10 / 0.020)
    assert timing.decode_tps_measured == pytest.approx(10 / 0.022)
    assert timing.decode_tps_error_pct == pytest.approx(100 * (0.020 / 0.022 - 1))
    assert timing.itl_error_s == pytest.approx(0.0002)
    assert timing.server_lateness_s == pytest.approx(0.0001)
    assert timing.cpu_per_chunk_s == pytest.approx(0.0001)
    assert timing.to_dict()["decode_tps_error_pct"] == timing.decode_tps_error_pct


def test_compare_without_a_decode_window_and_without_tokens() -> None:
    one = compare(served(0.0, [0.1]), send_perf_s=0.0, first_perf_s=0.1, last_perf_s=0.1, completion_tokens=1)
    assert one.decode_tps_error_pct is None and one.itl_error_s is None and one.cpu_per_chunk_s is None
    with pytest.raises(ValueError, match="no token chunk"):
        empty = ServedRequest("POST", "/v1/chat/completions", {}, 1, arrival_s=0.0)
        compare(empty, send_perf_s=0.0, first_perf_s=0.0, last_perf_s=0.0, completion_tokens=0)


def test_summarize() -> None:
    stats = summarize([1.0, -3.0, 2.0, None, float("nan")])
    assert stats["n"] == 3 and stats["median"] == 1.0
    assert stats["p95"] is not None and stats["p95_abs"] is not None and stats["p95_abs"] > stats["p95"]
    assert summarize([]) == {"n": 0, "median": None, "p95": None, "p95_abs": None}


def test_self_check_on_a_calibrated_stream_measures_near_zero() -> None:
    schedule = Schedule(ttft_s=0.02, itl_s=0.001, completion_tokens=60)
    result = run_self_check(schedule=schedule, requests=3)
    assert result["n"] == 3 and result["failed"] == []
    assert result["schedule"]["itl_s"] == 0.001
    assert set(result["machine"]) >= {"cpu_count", "load_avg"}
    assert 0 < result["duration_s"] < 30
    metrics = result["metrics"]
    for name in ("ttft_error_ms", "ttft_error_pct", "decode_tps_error_pct", "itl_error_us", "cpu_per_chunk_us"):
        assert metrics[name]["n"] == 3 and metrics[name]["median"] is not None, name
    # the client cannot see a token before the server sent it, and sees it soon after on loopback
    # The server stamps a chunk after its write returns: a fast client can read it a little before that.
    assert -1_000 <= metrics["first_lag_us"]["median"] < 50_000
    assert 0 < metrics["ttft_error_ms"]["median"] < 50
    assert abs(metrics["decode_tps_error_pct"]["median"]) < 25
    assert result["overhead_per_chunk_s"] == pytest.approx(metrics["cpu_per_chunk_us"]["median"] / 1e6)
    assert 0 < result["overhead_per_chunk_s"] < 0.05
    assert result["measured_itl_s"] == pytest.approx(0.001, rel=0.5)


class StallingClient(Client):
    """Our client, except that it stops reading for ``stall_s`` before the first line: a client stall."""

    stall_s = 0.08

    def _read_stream(
        self,
        response: http.client.HTTPResponse,
        sample: Sample,
        t0: float,
        keep_text: bool,
        first_token: list[bool],
        first_limit_s: float,
    ) -> None:
        time.sleep(self.stall_s)
        super()._read_stream(response, sample, t0, keep_text, first_token, first_limit_s)


def test_an_injected_client_stall_is_measured_as_error() -> None:
    schedule = Schedule(ttft_s=0.01, itl_s=0.002, completion_tokens=100)  # decode window 0.198 s
    with StreamServer(schedule) as server, StallingClient(server.url) as client:
        sample = client.stream_chat(chat_payload(100, "stalled"))
        record = match_records(server.wait_finished(1))["stalled"]
    timing = compare_sample(sample, record)
    # The first token waited ~70 ms in the socket: TTFT over by about that much, the window ~35% short.
    assert timing.ttft_error_s > 0.04
    assert timing.first_lag_s > 0.04
    assert timing.decode_tps_error_pct is not None and timing.decode_tps_error_pct > 15


def test_a_server_stall_is_truth_not_error() -> None:
    # The server's own stall is in its send times: the client measures it, so the error stays small.
    schedule = Schedule(ttft_s=0.01, itl_s=0.001, completion_tokens=60, fault=Fault("stall", 30, stall_s=0.1))
    with StreamServer(schedule) as server, Client(server.url) as client:
        sample = client.stream_chat(chat_payload(60, "s"))
        record = match_records(server.wait_finished(1))["s"]
    timing = compare_sample(sample, record)
    assert timing.decode_tps_true is not None and timing.decode_tps_true < 400  # the stall slowed the stream
    assert timing.decode_tps_error_pct is not None and abs(timing.decode_tps_error_pct) < 10


def test_server_process_records_share_the_clock() -> None:
    with ServerProcess(Schedule(ttft_s=0.005, itl_s=0.001, completion_tokens=10)) as server:
        with Client(server.url) as client:
            sample = client.stream_chat(chat_payload(10, "remote"))
        assert server.cpu_s() > 0
        record = match_records(server.records(1))["remote"]
    assert sample.ok and sample.end_s is not None
    # the child's perf_counter readings fall inside the parent's send .. end interval
    assert sample.send_perf_s < record.arrival_s < record.token_times_s[-1] < sample.send_perf_s + sample.end_s
    assert abs(compare_sample(sample, record).decode_tps_error_pct or 0) < 50


@pytest.mark.parametrize(
    ("check", "itl_s", "warns"),
    [
        ({"overhead_per_chunk_s": 30e-6}, 0.001, True),
        ({"overhead_per_chunk_s": 30e-6}, 0.002, False),
        ({"overhead_per_chunk_s": None}, 0.001, False),
        ({}, 0.001, False),
        ({"overhead_per_chunk_s": 30e-6}, 0.0, False),
    ],
)
def test_overhead_warning(check: dict[str, Any], itl_s: float, warns: bool) -> None:
    warning = overhead_warning(check, itl_s)
    assert (warning is not None) == warns
    if warning is not None:
        assert "30 µs" in warning and "3.0%" in warning
