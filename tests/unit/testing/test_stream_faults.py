"""The public home of the stream faults (`pytest_kvcache.testing.stream_faults`): the names it exports and
the one-request header, against a real `StreamServer`."""

from __future__ import annotations

from typing import get_args

from pytest_kvcache.client import Client
from pytest_kvcache.selfcheck import stream
from pytest_kvcache.selfcheck.schedule import Schedule
from pytest_kvcache.selfcheck.stream import StreamServer
from pytest_kvcache.testing import stream_faults
from pytest_kvcache.testing.stream_faults import FAULT_KINDS, Fault, fault_header, with_fault

PAYLOAD = {"model": "stream-test", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "stream": True}


def test_exports_are_the_servers_own() -> None:
    assert Fault is stream.Fault and stream_faults.FaultKind is stream.FaultKind
    assert get_args(stream.FaultKind) == FAULT_KINDS and "drop" in FAULT_KINDS
    assert set(stream_faults.__all__) == {"FAULT_KINDS", "Fault", "FaultKind", "fault_header", "with_fault"}


def test_with_fault_and_header_round_trip() -> None:
    base = Schedule(ttft_s=0.1, completion_tokens=5)
    fault = Fault("stall", 2, stall_s=0.3)
    assert with_fault(base, fault) == Schedule(ttft_s=0.1, completion_tokens=5, fault=fault)
    assert with_fault(with_fault(base, fault), None) == base
    header = fault_header(fault, base)
    assert Schedule.from_json(header[stream.SCHEDULE_HEADER]) == with_fault(base, fault)
    assert Schedule.from_json(fault_header(fault)[stream.SCHEDULE_HEADER]) == Schedule(fault=fault)


def test_a_fault_header_hits_one_request_only() -> None:
    with StreamServer(Schedule(ttft_s=0.0, itl_s=0.001)) as server:
        with Client(server.url, headers=fault_header(Fault("drop", after_chunks=3))) as client:
            dropped = client.stream_chat(PAYLOAD)
        with Client(server.url) as client:
            healthy = client.stream_chat(PAYLOAD)
        assert [r.outcome for r in server.wait_finished(2)] == ["dropped", "ok"]
    assert not dropped.ok and dropped.error_kind == "dropped"
    assert healthy.ok and healthy.completion_tokens == 8
