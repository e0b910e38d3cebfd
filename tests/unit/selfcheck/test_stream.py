"""The scripted OpenAI-compatible stream (`pytest_kvcache.selfcheck.stream`): format, timing, faults.

Everything here runs on loopback against an in-process server; the whole file takes a few seconds.
"""

from __future__ import annotations

import itertools
import json
import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from pytest_kvcache.selfcheck.schedule import RoleChunk, Schedule, ServedRequest
from pytest_kvcache.selfcheck.stream import StreamServer
from pytest_kvcache.testing.stream_faults import Fault

CHAT = "/v1/chat/completions"
MESSAGES = [{"role": "user", "content": "say something"}]
STREAM_OPTIONS = {"include_usage": True, "continuous_usage_stats": True}


@dataclass
class Event:
    """One ``data:`` line of an SSE body, with the client's `time.perf_counter` when it was read."""

    at_s: float
    data: str

    @property
    def json(self) -> dict[str, Any]:
        parsed: dict[str, Any] = json.loads(self.data)
        return parsed

    @property
    def is_done(self) -> bool:
        return self.data == "[DONE]"


@pytest.fixture
def server() -> Iterator[StreamServer]:
    with StreamServer(Schedule(ttft_s=0.01, itl_s=0.001)) as srv:
        yield srv
        assert srv.errors == []


@pytest.fixture
def client() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=10.0) as c:
        yield c


def chat_body(**extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": "stream-test",
        "messages": MESSAGES,
        "stream": True,
        "stream_options": STREAM_OPTIONS,
    }
    body.update(extra)
    return body


def stream_events(
    client: httpx.Client, url: str, body: dict[str, Any], schedule: Schedule | None = None
) -> tuple[float, list[Event]]:
    """POST and read the SSE body to its end; return the send time and the data events."""
    headers = schedule.to_header() if schedule is not None else {}
    events: list[Event] = []
    start = time.perf_counter()
    with client.stream("POST", url + CHAT, json=body, headers=headers) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        for line in response.iter_lines():
            if line.startswith("data: "):
                events.append(Event(time.perf_counter(), line[len("data: ") :]))
    return start, events


def token_events(events: list[Event]) -> list[Event]:
    """Events whose choice carries generated text (the role chunk does not)."""
    found = []
    for event in events:
        if event.is_done:
            continue
        choices = event.json["choices"]
        if choices and "role" not in choices[0]["delta"] and choices[0]["delta"].get("content"):
            found.append(event)
    return found


def last_record(server: StreamServer, count: int) -> ServedRequest:
    return server.wait_finished(count)[count - 1]


# --- the normal stream -----------------------------------------------------------------------------


def test_normal_stream_has_vllm_shape(server: StreamServer, client: httpx.Client) -> None:
    _, events = stream_events(client, server.url, chat_body(max_tokens=5))
    assert [e.is_done for e in events] == [False] * 7 + [True]
    chunks = [e.json for e in events[:-1]]
    role, tokens, usage = chunks[0], chunks[1:6], chunks[6]

    assert role["object"] == "chat.completion.chunk"
    assert role["id"].startswith("chatcmpl-")
    assert role["model"] == "stream-test"
    assert role["choices"] == [
        {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
    ]
    assert role["usage"]["completion_tokens"] == 0
    assert [c["choices"][0]["delta"]["content"] for c in tokens] == [f" tok{i}" for i in range(5)]
    assert [c["usage"]["completion_tokens"] for c in tokens] == [1, 2, 3, 4, 5]
    assert [c["choices"][0]["finish_reason"] for c in tokens] == [None] * 4 + ["length"]
    assert usage["choices"] == []
    assert usage["usage"] == {
        "prompt_tokens": 32,
        "total_tokens": 37,
        "completion_tokens": 5,
        "prompt_tokens_details": {"cached_tokens": 0},
    }
    assert len({c["id"] for c in chunks}) == 1

    record = last_record(server, 1)
    assert record.outcome == "ok"
    assert record.completion_tokens == 5
    assert record.token_chunk_indices == [1, 2, 3, 4, 5]
    assert len(record.chunk_times_s) == 8  # role, 5 tokens, usage, [DONE]
    assert record.body["max_tokens"] == 5


def test_schedule_fields_shape_the_stream(server: StreamServer, client: httpx.Client) -> None:
    schedule = Schedule(
        ttft_s=0.0,
        itl_s=0.0,
        completion_tokens=7,
        honor_max_tokens=False,
        tokens_per_chunk=3,
        per_chunk_usage=False,
        prompt_tokens=100,
        cached_tokens=64,
        empty_content=True,
    )
    _, events = stream_events(client, server.url, chat_body(max_tokens=50), schedule)
    chunks = [e.json for e in events[:-1]]
    assert len(chunks) == 1 + 3 + 1  # role, chunks of 3+3+1 tokens, final usage
    assert all("usage" not in c for c in chunks[:-1])
    assert [c["choices"][0]["delta"]["content"] for c in chunks[1:4]] == ["", "", ""]
    assert chunks[3]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["usage"]["completion_tokens"] == 7
    assert chunks[-1]["usage"]["prompt_tokens_details"] == {"cached_tokens": 64}


def test_honor_stream_options_follows_the_request(server: StreamServer, client: httpx.Client) -> None:
    server.set_schedule(Schedule(ttft_s=0.0, itl_s=0.0, completion_tokens=3, honor_stream_options=True))
    body = chat_body()
    del body["stream_options"]
    _, events = stream_events(client, server.url, body)
    assert all("usage" not in e.json for e in events[:-1])
    _, events = stream_events(client, server.url, chat_body(stream_options={"include_usage": True}))
    assert ["usage" in e.json for e in events[:-1]] == [False] * 4 + [True]


def test_non_streaming_response(server: StreamServer, client: httpx.Client) -> None:
    response = client.post(server.url + CHAT, json=chat_body(stream=False, max_tokens=3))
    assert response.status_code == 200
    payload = response.json()
    assert payload["object"] == "chat.completion"
    assert payload["choices"][0]["message"]["content"] == " tok0 tok1 tok2"
    assert payload["choices"][0]["finish_reason"] == "length"
    assert payload["usage"]["completion_tokens"] == 3


def test_completions_endpoint_streams_text(server: StreamServer, client: httpx.Client) -> None:
    body = {"model": "stream-test", "prompt": "a b", "max_tokens": 2, "stream": True}
    with client.stream("POST", server.url + "/v1/completions", json=body) as response:
        lines = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    chunks = [json.loads(line) for line in lines[:-1]]
    assert lines[-1] == "[DONE]"
    assert [c["choices"][0]["text"] for c in chunks[:2]] == [" tok0", " tok1"]
    assert chunks[0]["object"] == "text_completion"


def test_unknown_model_is_404_like_vllm(server: StreamServer, client: httpx.Client) -> None:
    response = client.post(server.url + CHAT, json=chat_body(model="other"))
    assert response.status_code == 404
    assert response.json()["error"]["code"] == 404


# --- timing ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("role_chunk", ["early", "with_first"])
def test_role_chunk_timing(server: StreamServer, client: httpx.Client, role_chunk: RoleChunk) -> None:
    schedule = Schedule(ttft_s=0.08, itl_s=0.001, completion_tokens=2, role_chunk=role_chunk)
    start, events = stream_events(client, server.url, chat_body(), schedule)
    assert "role" in events[0].json["choices"][0]["delta"]
    role_s = events[0].at_s - start
    first_token_s = token_events(events)[0].at_s - start
    assert first_token_s >= 0.08 and role_s <= first_token_s
    # Judged on the server's own send times (a loaded machine delays what the client sees, not the order).
    record = last_record(server, 1)
    role_sent, first_due = record.chunk_times_s[0], record.token_deadlines_s[0]
    if role_chunk == "early":
        assert role_sent < first_due - 0.04
    else:
        assert role_sent >= first_due


def test_schedule_precision_on_loopback(server: StreamServer, client: httpx.Client) -> None:
    ttft_s, itl_s, n = 0.1, 0.002, 100
    schedule = Schedule(ttft_s=ttft_s, itl_s=itl_s, completion_tokens=n)
    stream_events(client, server.url, chat_body(max_tokens=2), schedule)  # warm the connection
    start, events = stream_events(client, server.url, chat_body(), schedule)
    tokens = token_events(events)
    assert len(tokens) == n

    # What a client sees: the first token ~ttft_s after it sent, then one every itl_s.
    # Tolerances are loose on purpose: on an oversubscribed 2-core machine both threads get
    # descheduled and chunks go out and are read in bursts, so per-gap medians are meaningless
    # there; the mean rate and the median error against the grid hold. Idle loopback measures about
    # +1 ms on the first token, a median gap within 0.01 ms of itl_s, a median error of ~0.3 ms and
    # a median server lateness of ~0.1 ms.
    measured_ttft_s = tokens[0].at_s - start
    assert ttft_s <= measured_ttft_s < ttft_s + 0.1
    mean_gap_s = (tokens[-1].at_s - tokens[0].at_s) / (n - 1)
    assert abs(mean_gap_s - itl_s) < 0.25 * itl_s
    offsets = [e.at_s - i * itl_s for i, e in enumerate(tokens)]
    errors = [abs(o - statistics.median(offsets)) for o in offsets]
    assert statistics.median(errors) < 0.01

    # What the server did: each chunk left on its absolute deadline.
    record = last_record(server, 2)
    assert record.token_deadlines_s[0] == pytest.approx(record.arrival_s + ttft_s)
    lateness = [sent - due for sent, due in zip(record.token_times_s, record.token_deadlines_s, strict=True)]
    assert min(lateness) >= 0
    assert statistics.median(lateness) < 0.005
    sent_span_s = record.token_times_s[-1] - record.token_times_s[0]
    assert abs(sent_span_s / (n - 1) - itl_s) < 0.0002


# --- faults ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("reset", [True, False])
def test_drop_cuts_the_stream_before_done(server: StreamServer, client: httpx.Client, reset: bool) -> None:
    schedule = Schedule(ttft_s=0.0, itl_s=0.001, completion_tokens=20, fault=Fault("drop", 5, reset=reset))
    seen: list[str] = []
    with (
        pytest.raises(httpx.TransportError),
        client.stream("POST", server.url + CHAT, json=chat_body(), headers=schedule.to_header()) as response,
    ):
        seen.extend(response.iter_lines())
    assert "data: [DONE]" not in seen
    record = last_record(server, 1)
    assert record.outcome == "dropped"
    assert record.completion_tokens == 5
    # the pool dropped the broken connection; the next request works on a fresh one
    _, events = stream_events(client, server.url, chat_body(max_tokens=2))
    assert events[-1].is_done


def test_stall_leaves_a_gap(server: StreamServer, client: httpx.Client) -> None:
    schedule = Schedule(ttft_s=0.0, itl_s=0.001, completion_tokens=6, fault=Fault("stall", 3, stall_s=0.2))
    start, events = stream_events(client, server.url, chat_body(), schedule)
    tokens = token_events(events)
    assert len(tokens) == 6
    assert tokens[3].at_s - start >= 0.2
    gaps = [b.at_s - a.at_s for a, b in itertools.pairwise(tokens)]
    assert gaps[2] > 0.15  # the client may read token 3 late under load
    assert max(gaps[:2] + gaps[3:]) < 0.1
    assert events[-1].is_done
    record = last_record(server, 1)
    assert record.token_times_s[3] - record.token_times_s[2] >= 0.2
    due = record.token_deadlines_s  # later chunks keep their spacing: no burst to catch up
    assert [b - a for a, b in itertools.pairwise(due)] == pytest.approx([0.001, 0.001, 0.201, 0.001, 0.001])


def test_malformed_line_then_the_stream_goes_on(server: StreamServer, client: httpx.Client) -> None:
    schedule = Schedule(ttft_s=0.0, itl_s=0.0, completion_tokens=4, fault=Fault("malformed", 2))
    _, events = stream_events(client, server.url, chat_body(), schedule)
    bad = []
    for event in events:
        try:
            json.loads(event.data) if not event.is_done else None
        except json.JSONDecodeError:
            bad.append(event.data)
    assert bad == ["{not json"]
    assert len(token_events([e for e in events if e.data != "{not json"])) == 4
    assert events[-1].is_done


def test_stream_error_event(server: StreamServer, client: httpx.Client) -> None:
    schedule = Schedule(ttft_s=0.0, itl_s=0.0, completion_tokens=4, fault=Fault("stream_error", 1))
    _, events = stream_events(client, server.url, chat_body(), schedule)
    assert events[-2].json["error"]["code"] == 500
    assert events[-1].is_done
    assert len(token_events(events[:-2])) == 1


@pytest.mark.parametrize("status", [400, 500])
def test_http_error(server: StreamServer, client: httpx.Client, status: int) -> None:
    schedule = Schedule(fault=Fault("http_error", status=status))
    with client.stream("POST", server.url + CHAT, json=chat_body(), headers=schedule.to_header()) as response:
        response.read()
    assert response.status_code == status
    assert response.headers["content-type"] == "application/json"
    error = response.json()["error"]
    assert error["code"] == status
    assert error["type"] == {400: "BadRequestError", 500: "InternalServerError"}[status]
    if status == 400:
        assert "maximum context length is 8192 tokens" in error["message"]


def test_no_usage_anywhere(server: StreamServer, client: httpx.Client) -> None:
    schedule = Schedule(ttft_s=0.0, itl_s=0.0, completion_tokens=3, fault=Fault("no_usage"))
    _, events = stream_events(client, server.url, chat_body(), schedule)
    assert all("usage" not in e.json for e in events if not e.is_done)
    assert len(token_events(events)) == 3
    response = client.post(server.url + CHAT, json=chat_body(stream=False), headers=schedule.to_header())
    assert "usage" not in response.json()


def test_zero_tokens(server: StreamServer, client: httpx.Client) -> None:
    schedule = Schedule(ttft_s=0.0, fault=Fault("zero_tokens"))
    _, events = stream_events(client, server.url, chat_body(), schedule)
    chunks = [e.json for e in events[:-1]]
    assert "role" in chunks[0]["choices"][0]["delta"]
    assert chunks[1]["choices"][0]["finish_reason"] == "length"
    assert chunks[1]["choices"][0]["delta"]["content"] == ""
    assert chunks[-1]["usage"]["completion_tokens"] == 0
    assert token_events(events) == []
    assert events[-1].is_done


# --- per-request schedules and connections ------------------------------------------------------


def test_header_overrides_the_default_per_request(server: StreamServer, client: httpx.Client) -> None:
    override = Schedule(ttft_s=0.0, itl_s=0.0, completion_tokens=2, honor_max_tokens=False)
    _, events = stream_events(client, server.url, chat_body(max_tokens=9), override)
    assert len(token_events(events)) == 2
    _, events = stream_events(client, server.url, chat_body(max_tokens=4))
    assert len(token_events(events)) == 4
    server.set_schedule(override)
    _, events = stream_events(client, server.url, chat_body(max_tokens=9))
    assert len(token_events(events)) == 2
    assert [r.schedule for r in server.wait_finished(3)] == [
        override,
        Schedule(ttft_s=0.01, itl_s=0.001),
        override,
    ]


def test_bad_schedule_header_is_400(server: StreamServer, client: httpx.Client) -> None:
    headers = {"X-Stream-Schedule": json.dumps({"ttft_s": 0.1, "bogus": 1})}
    response = client.post(server.url + CHAT, json=chat_body(), headers=headers)
    assert response.status_code == 400
    assert "bogus" in response.json()["error"]["message"]


def test_schedule_round_trips_through_json() -> None:
    schedule = Schedule(ttft_s=0.5, role_chunk="early", fault=Fault("stall", 2, stall_s=0.3))
    assert Schedule.from_json(schedule.to_header()["X-Stream-Schedule"]) == schedule
    with pytest.raises(ValueError, match="tokens_per_chunk"):
        Schedule(tokens_per_chunk=0)
    with pytest.raises(ValueError, match="kind"):
        Fault.from_dict({"kind": "explode"})
    with pytest.raises(ValueError, match="ttft_s"):
        Schedule.from_dict({"ttft_s": "fast"})


def test_keep_alive_reuses_one_connection(server: StreamServer, client: httpx.Client) -> None:
    for _ in range(3):
        _, events = stream_events(client, server.url, chat_body(max_tokens=3))
        assert events[-1].is_done
    records = server.wait_finished(3)
    assert len({r.client_port for r in records}) == 1


def test_close_cuts_a_stream_in_flight(client: httpx.Client) -> None:
    srv = StreamServer(Schedule(ttft_s=0.0, itl_s=0.01, completion_tokens=1000)).start()
    try:
        with client.stream("POST", srv.url + CHAT, json=chat_body()) as response:
            lines = response.iter_lines()
            next(lines)
            started = time.perf_counter()
            srv.close()
            assert time.perf_counter() - started < 2.0
            with pytest.raises(httpx.TransportError):
                list(lines)
    finally:
        srv.close()
    assert srv.requests[0].outcome == "aborted"


# --- the other endpoints ---------------------------------------------------------------------------


def test_metrics_parse_and_count(client: httpx.Client) -> None:
    labels = {
        "block_size": "16",
        "cache_dtype": "fp8_e4m3",
        "enable_prefix_caching": "True",
        "kv_cache_size_tokens": "2097152",
        "mamba_cache_dtype": "auto",
    }
    schedule = Schedule(ttft_s=0.0, itl_s=0.0, prompt_tokens=50, cached_tokens=20)
    with StreamServer(schedule, cache_config_labels=labels) as srv:
        for _ in range(2):
            stream_events(client, srv.url, chat_body(max_tokens=4))
        srv.wait_finished(2)
        text = client.get(srv.url + "/metrics").text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert families["vllm:cache_config_info"].samples[0].labels == labels
    assert families["vllm:cache_config_info"].samples[0].value == 1.0

    def value(name: str) -> float:
        return sum(s.value for s in families[name].samples if s.name == name + "_total")

    assert value("vllm:request_success") == 2
    assert value("vllm:prompt_tokens") == 100
    assert value("vllm:generation_tokens") == 8
    assert value("vllm:prefix_cache_queries") == 100
    assert value("vllm:prefix_cache_hits") == 40
    assert families["vllm:num_requests_running"].samples[0].value == 0


def test_default_cache_config_line(server: StreamServer, client: httpx.Client) -> None:
    text = client.get(server.url + "/metrics").text
    assert (
        'vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="True",'
        'kv_cache_size_tokens="65536",mamba_cache_dtype="auto"} 1.0'
    ) in text.splitlines()


def test_tokenize_counts_words(server: StreamServer, client: httpx.Client) -> None:
    by_prompt = client.post(server.url + "/tokenize", json={"model": "stream-test", "prompt": "one two  three"})
    assert by_prompt.json()["count"] == 3
    by_messages = client.post(
        server.url + "/tokenize",
        json={"messages": [{"role": "system", "content": "a b"}, {"role": "user", "content": "c d e"}]},
    ).json()
    assert by_messages["count"] == 5
    assert len(by_messages["tokens"]) == 5
    assert by_messages["max_model_len"] == 8192


def test_models_version_health_and_404(server: StreamServer, client: httpx.Client) -> None:
    models = client.get(server.url + "/v1/models").json()
    assert models["object"] == "list"
    assert models["data"][0]["id"] == "stream-test"
    assert models["data"][0]["object"] == "model"
    assert models["data"][0]["max_model_len"] == 8192
    assert client.get(server.url + "/version").json() == {"version": "0.0.0-streamserver"}
    health = client.get(server.url + "/health")
    assert (health.status_code, health.content) == (200, b"")
    missing = client.get(server.url + "/v2/nothing")
    assert missing.status_code == 404
    assert missing.json() == {"detail": "Not Found"}


# --- logprobs --------------------------------------------------------------------------------------


def test_logprobs_one_entry_per_token_streamed_and_whole(server: StreamServer, client: httpx.Client) -> None:
    _, events = stream_events(client, server.url, chat_body(max_tokens=9, logprobs=True))
    chunks = [e.json for e in events[:-1]]
    assert chunks[0]["choices"][0]["logprobs"] is None  # the role chunk
    entries = [entry for c in chunks[1:] if c["choices"] for entry in c["choices"][0]["logprobs"]["content"]]
    assert [e["token"] for e in entries] == [f" tok{i}" for i in range(9)]
    assert [e["logprob"] for e in entries] == [pytest.approx(-0.01 * (i % 7)) for i in range(9)]
    assert all(e["bytes"] is None and e["top_logprobs"] == [] for e in entries)

    whole = client.post(server.url + CHAT, json=chat_body(max_tokens=9, logprobs=True, stream=False)).json()
    assert whole["choices"][0]["logprobs"]["content"] == entries

    plain = client.post(server.url + CHAT, json=chat_body(max_tokens=3, stream=False)).json()
    assert plain["choices"][0]["logprobs"] is None


def test_logprobs_token_ids_and_top_logprobs(server: StreamServer, client: httpx.Client) -> None:
    schedule = Schedule(ttft_s=0.0, itl_s=0.0, tokens_per_chunk=3)

    def entries(content: str, **extra: Any) -> list[dict[str, Any]]:
        body = chat_body(max_tokens=7, logprobs=True, return_tokens_as_token_ids=True, **extra)
        body["messages"] = [{"role": "user", "content": content}]
        _, events = stream_events(client, server.url, body, schedule)
        chunks = [e.json for e in events[:-1] if e.json["choices"]]
        assert [len(c["choices"][0]["logprobs"]["content"]) for c in chunks[1:]] == [3, 3, 1]
        return [entry for c in chunks[1:] for entry in c["choices"][0]["logprobs"]["content"]]

    first = entries("the same prompt", top_logprobs=2)
    ids = [e["token"] for e in first]
    assert all(t.startswith("token_id:") and t[len("token_id:") :].isdigit() for t in ids)
    assert len(set(ids)) == 7
    assert [e["token"] for e in entries("the same prompt", top_logprobs=2)] == ids  # deterministic
    assert [e["token"] for e in entries("another prompt")] != ids  # derived from the prompt
    for entry in first:
        top = entry["top_logprobs"]
        assert top[0]["token"] == entry["token"] != top[1]["token"]
        assert len(top) == 2 and top[1]["logprob"] < top[0]["logprob"] == entry["logprob"]
