"""The measuring client against the calibrated stream: what it measures, and every failure as a sample."""

from __future__ import annotations

import socket
import time

import pytest

from pytest_kvcache.client import Client, count_problem, token_bounds
from pytest_kvcache.sample import Sample
from pytest_kvcache.selfcheck.schedule import Schedule
from pytest_kvcache.selfcheck.stream import StreamServer
from pytest_kvcache.testing.stream_faults import Fault


def payload(tokens: int = 8) -> dict:
    return {
        "model": "stream-test",
        "messages": [{"role": "user", "content": "hi"}],
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        "max_tokens": tokens,
    }


def stream(schedule: Schedule, *, stall_timeout_s: float = 5.0, request_timeout_s: float = 30.0, **kw: object):
    with (
        StreamServer(schedule) as server,
        Client(server.url, stall_timeout_s=stall_timeout_s, request_timeout_s=request_timeout_s) as client,
    ):
        return client.stream_chat(payload(), **kw)  # type: ignore[arg-type]


def test_a_clean_stream_is_timed_by_the_usage_clock() -> None:
    sample = stream(Schedule(ttft_s=0.05, itl_s=0.004, completion_tokens=8, prompt_tokens=20, cached_tokens=4))
    assert sample.ok and sample.token_clock == "usage"
    assert sample.completion_tokens == 8 and sample.prompt_tokens == 20 and sample.cached_tokens == 4
    assert sample.token_chunks == 8 and sample.finish_reason == "length"
    assert sample.first_token_s is not None and sample.last_token_s is not None and sample.end_s is not None
    assert 0.05 <= sample.first_token_s < sample.last_token_s <= sample.end_s
    assert sample.last_token_s - sample.first_token_s >= 6 * 0.004
    assert sample.send_perf_s > 0 and sample.http_status == 200


def test_multi_token_chunks_of_speculative_decoding_keep_decode_tps_and_ttft_right() -> None:
    """With speculative decoding a chunk carries every token a step accepted, the first chunk included:
    TTFT is the first chunk, and the decode rate counts only the tokens that came after it."""
    schedule = Schedule(ttft_s=0.05, itl_s=0.02, completion_tokens=40, tokens_per_chunk=4)
    with StreamServer(schedule) as server, Client(server.url, stall_timeout_s=5.0, request_timeout_s=30.0) as client:
        sample = client.stream_chat(payload(40))
    assert sample.ok and sample.token_chunks == 10 and sample.first_chunk_tokens == 4
    assert sample.first_token_s is not None and sample.last_token_s is not None
    assert sample.first_token_s >= 0.05  # the server sends nothing before its TTFT
    metrics, flags, _ = sample.measures()
    window = sample.last_token_s - sample.first_token_s
    # how long the 9 later chunks took depends on the host's load (a delayed first chunk shortens the window),
    # so the test checks the arithmetic, not the clock: the 36 tokens after the first chunk over that window
    assert window > 0
    assert metrics["decode_tps"] == pytest.approx(36 / window)  # not 39 / window
    assert flags == []


def test_without_per_chunk_usage_the_content_clock_is_used_and_flagged() -> None:
    sample = stream(Schedule(completion_tokens=5, per_chunk_usage=False))
    assert sample.ok and sample.token_clock == "content"
    assert "content_clock" in sample.measures()[1]


def test_role_chunk_sent_early_does_not_start_the_clock() -> None:
    sample = stream(Schedule(ttft_s=0.1, completion_tokens=3, role_chunk="early"))
    assert sample.ok and sample.first_token_s is not None and sample.first_token_s >= 0.1


def test_keep_text_collects_content() -> None:
    sample = stream(Schedule(completion_tokens=4), keep_text=True)
    assert sample.ok and sample.text and sample.content_chars == len(sample.text)


@pytest.mark.parametrize(
    ("fault", "kind", "message"),
    [
        (Fault("drop", 3), "dropped", "after"),
        (Fault("drop", 3, reset=False), "dropped", "after"),
        (Fault("malformed", 2), "malformed_json", "is not JSON"),
        (Fault("stream_error", 2), "server_error", "server sent an error event"),
        (Fault("http_error", status=400), "http_error", "HTTP 400: "),
        (Fault("http_error", status=503, message="overloaded"), "http_error", "HTTP 503: overloaded"),
        (Fault("no_usage"), "missing_usage", "no usage"),
        (Fault("zero_tokens"), "zero_tokens", "0 completion tokens"),
    ],
)
def test_every_failure_is_a_failed_sample(fault: Fault, kind: str, message: str) -> None:
    sample = stream(Schedule(itl_s=0.001, completion_tokens=6, fault=fault))
    assert not sample.ok and sample.error_kind == kind, sample.error
    assert message in (sample.error or "")


def test_a_stall_longer_than_the_stall_timeout() -> None:
    sample = stream(
        Schedule(itl_s=0.001, completion_tokens=6, fault=Fault("stall", 2, stall_s=1.0)), stall_timeout_s=0.3
    )
    assert sample.error_kind == "stall" and sample.error == "no chunk for 0.3 s (--kv-stall-timeout)"


def test_a_request_longer_than_the_request_timeout() -> None:
    schedule = Schedule(itl_s=0.02, completion_tokens=50, honor_max_tokens=False)
    sample = stream(schedule, request_timeout_s=0.3, stall_timeout_s=5)
    assert sample.error_kind == "timeout" and "longer than 0.3 s" in (sample.error or "")


def test_nothing_listening_is_a_connection_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with Client(f"http://127.0.0.1:{port}") as client:
        sample = client.stream_chat(payload())
    assert sample.error_kind == "connection_error"
    assert (sample.error or "").startswith(f"cannot connect to http://127.0.0.1:{port}")


def test_one_connection_carries_consecutive_requests_and_recovers_after_a_drop() -> None:
    with StreamServer(Schedule(completion_tokens=4)) as server, Client(server.url) as client:
        first = client.stream_chat(payload())
        second = client.stream_chat(payload())
        assert first.ok and second.ok
        served = server.wait_finished(2)
        assert served[0].client_port == served[1].client_port  # kept alive
        server.set_schedule(Schedule(completion_tokens=4, fault=Fault("drop", 1)))
        assert client.stream_chat(payload()).error_kind == "dropped"
        server.set_schedule(Schedule(completion_tokens=4))
        again = client.stream_chat(payload())
        assert again.ok  # a fresh connection after the dropped one
        assert server.wait_finished(4)[-1].client_port != served[0].client_port


# ------------------------------------------------------------------------------ first token vs stall


def first_token(
    ttft_s: float, *, prompt_tokens: int = 200, floor_s: float = 0.5, tps: float = 200.0, role_chunk: str = "with_first"
):
    """A ``prompt_tokens`` prompt whose first token comes after ``ttft_s``: the stall timeout is 0.3 s; the
    first-token limit is ``floor_s + prompt_tokens / tps`` (0.5 + 200/200 = 1.5 s by default). ``role_chunk``
    "early": the server sends a role chunk (no token) as soon as the request arrives."""
    schedule = Schedule(
        ttft_s=ttft_s, itl_s=0.002, completion_tokens=6, prompt_tokens=prompt_tokens, role_chunk=role_chunk
    )
    with (
        StreamServer(schedule) as server,
        Client(
            server.url, stall_timeout_s=0.3, request_timeout_s=30.0, first_token_floor_s=floor_s, min_prefill_tps=tps
        ) as client,
    ):
        return client.stream_chat(payload(), prompt_tokens=prompt_tokens)


def test_a_first_byte_later_than_the_stall_timeout_but_within_the_first_token_limit_is_measured() -> None:
    sample = first_token(0.9)
    assert sample.ok, sample.error
    assert sample.first_token_s is not None and sample.first_token_s >= 0.9


def test_a_role_chunk_at_once_does_not_start_the_stall_timeout() -> None:
    """A server that sends an empty role chunk at once and its first token after a slow prefill (0.9 s, past
    the 0.3 s stall timeout, within the 1.5 s first-token limit): measured, not failed as a stall."""
    sample = first_token(0.9, role_chunk="early")
    assert sample.ok, sample.error
    assert sample.first_token_s is not None and sample.first_token_s >= 0.9


def test_a_role_chunk_at_once_then_no_token_within_the_first_token_limit_fails_naming_it() -> None:
    sample = first_token(2.5, role_chunk="early")
    assert not sample.ok and sample.error_kind == "first_token_timeout", sample.error
    assert sample.error is not None and sample.error.startswith("no first token within the first-token limit of 1.5 s")


def test_a_first_byte_past_the_first_token_limit_fails_naming_it() -> None:
    sample = first_token(2.5)
    assert not sample.ok and sample.error_kind == "first_token_timeout"
    assert sample.error == (
        "no first token within the first-token limit of 1.5 s (--kv-first-token-floor 0.5 s + 200 prompt tokens / "
        "--kv-min-prefill-tps 200); raise either for deeper or slower prefills"
    )


def test_after_the_first_byte_the_stall_timeout_applies() -> None:
    schedule = Schedule(itl_s=0.001, completion_tokens=6, fault=Fault("stall", 2, stall_s=1.0))
    with (
        StreamServer(schedule) as server,
        Client(server.url, stall_timeout_s=0.3, first_token_floor_s=5.0) as client,
    ):
        sample = client.stream_chat(payload())
    assert sample.error_kind == "stall" and sample.error == "no chunk for 0.3 s (--kv-stall-timeout)"


def test_a_server_that_sends_no_headers_is_hung_after_the_stall_timeout_not_the_first_token_limit() -> None:
    """vLLM answers a request with its headers at once: none within the stall timeout is a hung server, however
    long the first-token limit (here 30 s) would let a slow prefill take."""
    schedule = Schedule(fault=Fault("hang", stall_s=10.0))
    with StreamServer(schedule) as server, Client(server.url, stall_timeout_s=0.3, first_token_floor_s=30.0) as client:
        started = time.monotonic()
        sample = client.stream_chat(payload())
        took = time.monotonic() - started
        again = client.stream_chat(payload())  # the client goes on: a fresh connection
    assert sample.error_kind == "no_response" and took < 10, (sample.error, took)  # the first-token limit: 30 s
    assert sample.error == (
        "no response headers within 0.3 s (--kv-stall-timeout): the server took the request and sent nothing"
    )
    assert again.error_kind == "no_response"  # the server still hangs: failed as promptly


def test_a_server_that_may_hold_its_headers_back_is_waited_for_up_to_the_first_token_limit() -> None:
    """llama-server sends no headers while a request waits for a slot (``headers_at_once=False``): no headers is
    waited for up to the first-token limit."""
    with (
        StreamServer(Schedule(fault=Fault("hang", stall_s=5.0))) as server,
        Client(server.url, stall_timeout_s=0.3, first_token_floor_s=1.0, headers_at_once=False) as client,
    ):
        sample = client.stream_chat(payload(), prompt_tokens=0)
    assert sample.error_kind == "first_token_timeout", sample.error
    assert (sample.error or "").startswith("no first token within the first-token limit of 1 s")


def test_the_first_token_limit_grows_with_the_prompt_within_the_request_timeout() -> None:
    client = Client("http://127.0.0.1:9", stall_timeout_s=120, request_timeout_s=600, first_token_floor_s=120)
    assert client.first_token_limit_s(0) == 120
    assert client.first_token_limit_s(90_000) == 120 + 90_000 / 500  # the seed's deepest prefill: 300 s
    assert client.first_token_limit_s(10_000_000) == 600
    assert Client("http://127.0.0.1:9", stall_timeout_s=7).first_token_limit_s(90_000) == 7  # off by default


def test_llama_server_timings_are_a_token_clock() -> None:
    """llama-server (``timings_per_token``) counts generated tokens in each chunk's ``timings.predicted_n``; a
    token whose text is held back (mid-UTF-8 character) still moves the count: chunks as it sends them."""
    import json
    import threading
    import time
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    chunks = [{"choices": [{"index": 0, "delta": {"role": "assistant", "content": None}}]}]
    for n, text in enumerate(["a", "", "b", "c"], start=1):
        chunks.append({"choices": [{"index": 0, "delta": {"content": text}}], "timings": {"predicted_n": n}})
    usage = {"completion_tokens": 4, "prompt_tokens": 9, "prompt_tokens_details": {"cached_tokens": 0}}
    chunks.append({"choices": [], "usage": usage, "timings": {"predicted_n": 4}})

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            for chunk in chunks:
                time.sleep(0.01)
                self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                self.wfile.flush()
            self.wfile.write(b"data: [DONE]\n\n")
            self.close_connection = True

        def log_message(self, *args: object) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with Client(f"http://127.0.0.1:{server.server_address[1]}", stall_timeout_s=5.0) as client:
            sample = client.stream_chat(payload(4))
    finally:
        server.shutdown()
        server.server_close()
    assert sample.ok and sample.token_clock == "usage" and sample.token_chunks == 4
    assert sample.completion_tokens == 4 and sample.first_chunk_tokens == 1
    assert "content_clock" not in sample.measures()[1]


# ------------------------------------------------------------------------------ token counts


def forced(tokens: int) -> dict:
    """The probes' greedy shape: exactly ``tokens`` (``ignore_eos``, ``min_tokens``)."""
    return {**payload(tokens), "temperature": 0.0, "ignore_eos": True, "min_tokens": tokens}


def counted(payload_: dict, schedule: Schedule) -> Sample:
    with StreamServer(schedule) as server, Client(server.url, stall_timeout_s=5.0, request_timeout_s=30.0) as client:
        return client.stream_chat(payload_)


def test_token_bounds_read_what_the_request_allows_and_forces() -> None:
    assert token_bounds(forced(16)) == (16, 16)
    assert token_bounds({"max_tokens": 16, "ignore_eos": True}) == (16, 16)  # llama-server: no min_tokens
    assert token_bounds({"max_tokens": 16, "min_tokens": 4}) == (16, 4)
    assert token_bounds({"max_tokens": 16}) == (16, None)
    assert token_bounds({"max_completion_tokens": 8, "max_tokens": 16}) == (8, None)
    assert token_bounds({"max_tokens": True}) == (None, None) and token_bounds({}) == (None, None)


def done(clock: str, requested: int | None, promised: int | None, streamed: int, reported: int) -> Sample:
    return Sample(
        ok=True,
        token_clock=clock,  # type: ignore[arg-type]
        requested_tokens=requested,
        promised_tokens=promised,
        streamed_tokens=streamed,
        completion_tokens=reported,
    )


@pytest.mark.parametrize(
    ("sample", "problem"),
    [
        (
            done("usage", 16, 16, 8, 8),
            "requested 16 (forced), streamed 8, reported 8: the server stopped at 8 of the 16",
        ),
        (done("usage", 48, None, 16, 48), "requested up to 48, streamed 16, reported 48: the final usage reports 32"),
        (done("usage", 48, 48, 16, 48), "requested 48 (forced), streamed 16, reported 48: the final usage reports 32"),
        (done("usage", 48, None, 48, 64), "reported 64: the server reports 64 tokens, more than the max_tokens 48"),
        (done("usage", 16, None, 16, 8), "streamed 16, reported 8: the stream counted 8 more token(s) than"),
        (done("usage", 16, 4, 3, 3), "requested up to 16, at least 4, streamed 3, reported 3: the server stopped"),
        (done("content", 48, 48, 12, 24), "streamed 12 content chunk(s), reported 24: the server stopped at 24 of"),
        (done("content", 16, None, 4, 17), "reported 17: the server reports 17 tokens, more than the max_tokens 16"),
    ],
)
def test_counts_that_disagree_name_requested_streamed_and_reported(sample: Sample, problem: str) -> None:
    found = count_problem(sample)
    assert found is not None and problem in found, found


@pytest.mark.parametrize(
    "sample",
    [
        done("usage", 16, 16, 16, 16),  # exactly what was forced
        done("usage", 48, None, 20, 20),  # stopped at EOS: nothing was promised past max_tokens
        done("usage", 48, None, 20, 21),  # an EOS counted in usage with no chunk of its own
        done("usage", 48, 48, 45, 48),  # a tail of UNSTREAMED_TAIL tokens held back to the finish chunk
        done("usage", 40, 40, 40, 40),  # speculative decoding: 10 chunks, the running count is 40
        done("content", 48, None, 16, 48),  # 16 content chunks of 3 tokens: chunks are not tokens
        done("content", 48, None, 48, 16),
        done("usage", None, None, 16, 16),  # no max_tokens: no bound to check
    ],
)
def test_counts_that_agree_or_cannot_be_compared_pass(sample: Sample) -> None:
    assert count_problem(sample) is None


def test_a_server_that_stops_at_half_the_forced_tokens_fails_the_request() -> None:
    sample = counted(forced(16), Schedule(fault=Fault("stop_early", after_chunks=8)))
    assert not sample.ok and sample.error_kind == "token_count", sample.error
    assert sample.error == (
        "requested 16 (forced), streamed 8, reported 8: the server stopped at 8 of the 16 tokens the request forces"
    )
    assert (sample.requested_tokens, sample.promised_tokens, sample.streamed_tokens) == (16, 16, 8)
    assert sample.completion_tokens == 8 and sample.finish_reason == "stop"
    metrics, flags, _ = sample.measures()
    assert flags == ["token_count"] and all(v is None for v in metrics.values())


def test_a_usage_that_claims_tokens_the_stream_never_delivered_fails_the_request() -> None:
    sample = counted(payload(48), Schedule(fault=Fault("stop_early", after_chunks=16, usage_tokens=48)))
    assert not sample.ok and sample.error_kind == "token_count"
    assert sample.error == (
        "requested up to 48, streamed 16, reported 48: the final usage reports 32 token(s) the stream never delivered"
    )


@pytest.mark.parametrize(
    ("tokens", "claimed", "why"),
    [
        (16, 24, "the server reports 24 tokens, more than the max_tokens 16 it was given"),
        (16, 8, "the stream counted 8 more token(s) than the final usage reports"),
    ],
)
def test_a_final_usage_over_or_under_reporting_fails_the_request(tokens: int, claimed: int, why: str) -> None:
    sample = counted(payload(tokens), Schedule(fault=Fault("misreport", usage_tokens=claimed)))
    assert not sample.ok and sample.error_kind == "token_count"
    assert sample.error is not None and sample.error.endswith(why), sample.error


def test_an_eos_stop_where_nothing_was_forced_passes() -> None:
    sample = counted(payload(48), Schedule(fault=Fault("stop_early", after_chunks=20)))
    assert sample.ok and sample.completion_tokens == sample.streamed_tokens == 20
    assert (sample.requested_tokens, sample.promised_tokens) == (48, None)


def test_speculative_chunks_are_counted_by_their_running_count_not_by_chunks() -> None:
    sample = counted(forced(40), Schedule(tokens_per_chunk=4))
    assert sample.ok and sample.token_chunks == 10 and sample.streamed_tokens == sample.completion_tokens == 40


def test_under_the_content_clock_only_the_request_bounds_are_checked() -> None:
    """Without per-chunk usage, 16 content chunks may carry 48 tokens: not a mismatch. A forced count the usage
    does not reach still is."""
    schedule = Schedule(per_chunk_usage=False, fault=Fault("stop_early", after_chunks=16, usage_tokens=48))
    sample = counted(payload(48), schedule)
    assert sample.ok and sample.token_clock == "content" and sample.streamed_tokens == 16
    short = counted(forced(48), Schedule(per_chunk_usage=False, fault=Fault("stop_early", after_chunks=24)))
    assert not short.ok and short.error_kind == "token_count"
    assert short.error is not None and "streamed 24 content chunk(s), reported 24" in short.error


def test_a_ctrl_c_mid_stream_cuts_the_request_at_once() -> None:
    """KeyboardInterrupt while a stream is read closes the connection before it propagates: a connection left
    open (the traceback keeps its socket) makes the engine's HTTP server wait for it at shutdown, and the
    engine's stop then takes its whole SIGTERM grace."""
    schedule = Schedule(ttft_s=0.01, itl_s=0.05, completion_tokens=200)
    with StreamServer(schedule) as server, Client(server.url, stall_timeout_s=5.0, request_timeout_s=30.0) as client:
        read = client._read_stream
        chunks = 0

        def interrupted(response, *args, **kwargs):  # type: ignore[no-untyped-def]
            nonlocal chunks
            response.readline()  # the server has started streaming
            chunks += 1
            raise KeyboardInterrupt

        client._read_stream = interrupted  # type: ignore[method-assign]
        started = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            client.stream_chat(payload(200))
        assert chunks == 1 and client._conn is None
        served = server.wait_finished(1, timeout_s=5.0)
        assert served[0].outcome == "client_gone"
        assert time.monotonic() - started < 200 * 0.05  # the server did not stream to the end
        client._read_stream = read  # type: ignore[method-assign]
        assert client.stream_chat(payload()).ok  # a fresh connection serves the next request
