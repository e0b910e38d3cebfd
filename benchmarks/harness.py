"""Benchmark the measuring client against the calibrated stream: accuracy, overhead, chunk-rate ceiling, client stacks.

Run ``python benchmarks/harness.py [--quick] [--markdown] [--json FILE] [--servers N]``. The calibrated
`~pytest_kvcache.selfcheck.stream.StreamServer` runs in child processes (`ServerPool`: one or more
`ServerProcess` sharing a port), so its threads do not share the client's GIL; both read CLOCK_MONOTONIC, so
its recorded send times and the client's receive times are on one clock. Every figure compares what a client
saw with what the server recorded it sent (`pytest_kvcache.selfcheck.check.compare`):

* accuracy: TTFT error (client TTFT minus the server's arrival → first-token-sent time) and decode-TPS error
  (``(n − 1) / (last − first)`` on the client against the same over the server's send times), median and p95
  over requests, in %; client CPU per streamed chunk (client process CPU time / SSE chunks parsed);
* chunk-rate sweep: 1 stream and 32 concurrent streams, the inter-token time shrinking until the per-stream
  decode-TPS error passes 2%: the highest aggregate chunk rate (server send rate) still within 2%;
* many-stream sweep: 32, 64, 128 and 256 streams, the aggregate rate growing from 8,000 chunks/s, for the
  single-stream client with a thread per stream, aiohttp on uvloop, and the many-stream client
  (`pytest_kvcache.fanout`) with one and more worker processes, with each row's client load (CPU share,
  event-loop lag, schedule delay, the saturation flag);
* client stacks: the same streams read by our client (stdlib http.client, a thread per stream), our
  many-stream client, httpx (a thread per stream: the client's transport before 2026-11-30), httpx with
  asyncio, aiohttp with asyncio (and uvloop), the openai SDK with a thread per stream and with asyncio.

Every stack applies the same token clock as `pytest_kvcache.client.Client`: parse each ``data:`` line as
JSON, the first and last chunk that raised ``usage.completion_tokens`` (the openai SDK parses into its own
objects). A miss is reported, never raised: these are benchmark figures.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import socket
import sys
import threading
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
import httpx
import numpy as np
import openai
import pandas as pd

from pytest_kvcache.client import Client
from pytest_kvcache.fanout import Fanout
from pytest_kvcache.fanout_plan import ClientLoad
from pytest_kvcache.sample import Sample
from pytest_kvcache.selfcheck.check import (
    ServerPool,
    StreamTiming,
    chat_payload,
    compare,
    machine_facts,
    match_records,
    run_self_check,
)
from pytest_kvcache.selfcheck.schedule import Schedule

MAX_ERROR_PCT = 2.0
#: A row is undistorted only if the server also kept the schedule: a client that reads too slowly fills its
#: socket buffers, the server's writes block, and the stream slows to the client's pace -- an error that the
#: comparison with the server's actual send times cannot show, but the delivered rate does.
MIN_RATE_KEPT_PCT = 98.0
WARMUP = Schedule(ttft_s=0.0, itl_s=0.0, completion_tokens=4)


# ------------------------------------------------------------------------------------------ one stream


@dataclass
class Seen:
    """What one client stack saw of one request (absolute `time.perf_counter` readings)."""

    tag: str
    send: float
    first: float | None = None
    last: float | None = None
    tokens: int = 0
    chunks: int = 0
    error: str | None = None


class Tracker:
    """The token clock of `pytest_kvcache.client.Client`, for stacks that hand us raw ``data:`` lines."""

    def __init__(self, tag: str) -> None:
        self.seen = Seen(tag, time.perf_counter())

    def line(self, line: str | bytes, now: float) -> bool:
        """Feed one SSE line; True at ``[DONE]``."""
        if isinstance(line, bytes):
            line = line.decode()
        if not line.startswith("data:"):
            return False
        data = line[5:].strip()
        if data == "[DONE]":
            return True
        chunk = json.loads(data)
        self.seen.chunks += 1
        running = (chunk.get("usage") or {}).get("completion_tokens")
        self.usage(running, now)
        return False

    def usage(self, running: Any, now: float) -> None:
        if isinstance(running, int) and running > self.seen.tokens:
            if self.seen.first is None:
                self.seen.first = now
            self.seen.last = now
            self.seen.tokens = running


def seen_of(tag: str, sample: Sample) -> Seen:
    """What our clients' `Sample` says of one request, as absolute `time.perf_counter` readings."""
    seen = Seen(tag, sample.send_perf_s, chunks=sample.chunks, tokens=sample.completion_tokens or 0)
    if sample.ok and sample.first_token_s is not None and sample.last_token_s is not None:
        seen.first = sample.send_perf_s + sample.first_token_s
        seen.last = sample.send_perf_s + sample.last_token_s
    else:
        seen.error = f"{sample.error_kind}: {sample.error}"
    return seen


def _payload(schedule: Schedule, tag: str) -> dict[str, Any]:
    return chat_payload(schedule.completion_tokens, tag)


def _tags(streams: int, per_stream: int, prefix: str) -> list[list[str]]:
    return [[f"{prefix}-{k}-{j}" for j in range(per_stream)] for k in range(streams)]


# ------------------------------------------------------------------------------------------ client stacks
# Each stack streams the requests of ``tags`` (one list per concurrent stream, requests of a stream one
# after another over one connection), after one warm-up request per stream, and returns what it saw and the
# client process's CPU seconds over the measured part.

#: (what the stack saw, client CPU seconds over the measured part, extra figures of the row)
StackResult = tuple[list[Seen], float, dict[str, Any]]


def _threaded(tags: list[list[str]], worker: Callable[[list[str], threading.Barrier], list[Seen]]) -> StackResult:
    """A thread per stream; the measured part starts when every thread has warmed up."""
    barrier = threading.Barrier(len(tags) + 1)
    results: list[list[Seen]] = [[] for _ in tags]

    def run(k: int) -> None:
        results[k] = worker(tags[k], barrier)

    threads = [threading.Thread(target=run, args=(k,), daemon=True) for k in range(len(tags))]
    for thread in threads:
        thread.start()
    barrier.wait()
    cpu0 = time.process_time()
    for thread in threads:
        thread.join()
    return [s for r in results for s in r], time.process_time() - cpu0, {}


def stack_ours(url: str, schedule: Schedule, tags: list[list[str]]) -> StackResult:
    """`pytest_kvcache.client.Client` (stdlib ``http.client``, kept-alive, synchronous), a thread per stream."""

    def worker(mine: list[str], barrier: threading.Barrier) -> list[Seen]:
        out: list[Seen] = []
        with Client(url, headers=schedule.to_header(), request_timeout_s=120, stall_timeout_s=60) as client:
            client.stream_chat(chat_payload(2, f"warm-{mine[0]}"))
            barrier.wait()
            for tag in mine:
                out.append(seen_of(tag, client.stream_chat(_payload(schedule, tag))))
        return out

    return _threaded(tags, worker)


def stack_httpx_threads(url: str, schedule: Schedule, tags: list[list[str]]) -> StackResult:
    """httpx's synchronous ``Client.stream`` (the measuring client's transport before 2026-11-30), a thread
    per stream."""
    headers = {"Content-Type": "application/json", **schedule.to_header()}

    def one(client: httpx.Client, payload: dict[str, Any]) -> Seen:
        tracker = Tracker(payload["user"])
        tracker.seen.send = time.perf_counter()
        with client.stream("POST", "/v1/chat/completions", content=json.dumps(payload).encode()) as response:
            for line in response.iter_lines():
                if tracker.line(line, time.perf_counter()):
                    break
        return tracker.seen

    def worker(mine: list[str], barrier: threading.Barrier) -> list[Seen]:
        with httpx.Client(base_url=url, headers=headers, timeout=120) as client:
            one(client, chat_payload(2, f"warm-{mine[0]}"))
            barrier.wait()
            return [one(client, _payload(schedule, tag)) for tag in mine]

    return _threaded(tags, worker)


def stack_openai_threads(url: str, schedule: Schedule, tags: list[list[str]]) -> StackResult:
    """The openai SDK, ``OpenAI().chat.completions.create(stream=True)``, a thread per stream."""

    def worker(mine: list[str], barrier: threading.Barrier) -> list[Seen]:
        client = openai.OpenAI(
            base_url=f"{url}/v1", api_key="none", max_retries=0, default_headers=schedule.to_header()
        )
        _openai_sync(client, chat_payload(2, f"warm-{mine[0]}"))
        barrier.wait()
        out = [_openai_sync(client, _payload(schedule, tag)) for tag in mine]
        client.close()
        return out

    return _threaded(tags, worker)


def _openai_sync(client: openai.OpenAI, payload: dict[str, Any]) -> Seen:
    tracker = Tracker(payload["user"])
    kwargs = {k: v for k, v in payload.items() if k != "stream"}
    tracker.seen.send = time.perf_counter()
    stream = client.chat.completions.create(stream=True, **kwargs)
    for chunk in stream:
        now = time.perf_counter()
        tracker.seen.chunks += 1
        tracker.usage(chunk.usage.completion_tokens if chunk.usage else None, now)
    return tracker.seen


def stack_http_client(url: str, schedule: Schedule, tags: list[list[str]]) -> StackResult:
    """The standard library's ``http.client`` (a floor: no pool, no h11), a thread per stream."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    headers = {"Content-Type": "application/json", **schedule.to_header()}

    def one(conn: http.client.HTTPConnection, payload: dict[str, Any]) -> Seen:
        body = json.dumps(payload).encode()
        tracker = Tracker(payload["user"])
        tracker.seen.send = time.perf_counter()
        conn.request("POST", "/v1/chat/completions", body=body, headers=headers)
        response = conn.getresponse()
        while line := response.readline():
            if tracker.line(line, time.perf_counter()):
                break
        response.read()
        return tracker.seen

    def worker(mine: list[str], barrier: threading.Barrier) -> list[Seen]:
        conn = http.client.HTTPConnection(host, int(port), timeout=120)
        conn.connect()
        conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        one(conn, chat_payload(2, f"warm-{mine[0]}"))
        barrier.wait()
        out = [one(conn, _payload(schedule, tag)) for tag in mine]
        conn.close()
        return out

    return _threaded(tags, worker)


def _run_async(
    schedule: Schedule,
    tags: list[list[str]],
    one: Callable[[Any, dict[str, Any]], Coroutine[Any, Any, Seen]],
    session: Callable[[], Any],
    uvloop: bool = False,
) -> StackResult:
    """Tasks on one event loop, one per stream; ``session()`` is an async context manager shared by all."""

    async def main() -> StackResult:
        async with session() as s:

            async def stream(mine: list[str]) -> list[Seen]:
                return [await one(s, _payload(schedule, tag)) for tag in mine]

            await asyncio.gather(*(one(s, chat_payload(2, f"warm-{m[0]}")) for m in tags))
            cpu0 = time.process_time()
            results = await asyncio.gather(*(stream(m) for m in tags))
            return [x for r in results for x in r], time.process_time() - cpu0, {}

    if uvloop:
        import uvloop as uv

        return uv.run(main())
    return asyncio.run(main())


def stack_httpx_async(url: str, schedule: Schedule, tags: list[list[str]]) -> StackResult:
    """httpx ``AsyncClient`` on asyncio, a task per stream."""

    async def one(client: httpx.AsyncClient, payload: dict[str, Any]) -> Seen:
        body = json.dumps(payload).encode()
        tracker = Tracker(payload["user"])
        tracker.seen.send = time.perf_counter()
        async with client.stream("POST", "/v1/chat/completions", content=body) as response:
            async for line in response.aiter_lines():
                if tracker.line(line, time.perf_counter()):
                    break
        return tracker.seen

    def session() -> httpx.AsyncClient:
        headers = {"Content-Type": "application/json", **schedule.to_header()}
        limits = httpx.Limits(max_connections=1000, max_keepalive_connections=1000)
        return httpx.AsyncClient(base_url=url, headers=headers, timeout=120, limits=limits)

    return _run_async(schedule, tags, one, session)


def _aiohttp_stack(url: str, schedule: Schedule, tags: list[list[str]], uvloop: bool) -> StackResult:
    async def one(session: aiohttp.ClientSession, payload: dict[str, Any]) -> Seen:
        body = json.dumps(payload).encode()
        tracker = Tracker(payload["user"])
        tracker.seen.send = time.perf_counter()
        async with session.post(f"{url}/v1/chat/completions", data=body) as response:
            async for line in response.content:
                if tracker.line(line, time.perf_counter()):
                    break
        return tracker.seen

    def session() -> aiohttp.ClientSession:
        headers = {"Content-Type": "application/json", **schedule.to_header()}
        return aiohttp.ClientSession(
            headers=headers, connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=120)
        )

    return _run_async(schedule, tags, one, session, uvloop=uvloop)


def stack_aiohttp(url: str, schedule: Schedule, tags: list[list[str]]) -> StackResult:
    """aiohttp (C HTTP parser) on asyncio, a task per stream."""
    return _aiohttp_stack(url, schedule, tags, uvloop=False)


def stack_aiohttp_uvloop(url: str, schedule: Schedule, tags: list[list[str]]) -> StackResult:
    """aiohttp on uvloop (libuv event loop), a task per stream."""
    return _aiohttp_stack(url, schedule, tags, uvloop=True)


def stack_openai_async(url: str, schedule: Schedule, tags: list[list[str]]) -> StackResult:
    """The openai SDK's ``AsyncOpenAI`` on asyncio, a task per stream."""

    async def one(client: openai.AsyncOpenAI, payload: dict[str, Any]) -> Seen:
        tracker = Tracker(payload["user"])
        kwargs = {k: v for k, v in payload.items() if k != "stream"}
        tracker.seen.send = time.perf_counter()
        stream = await client.chat.completions.create(stream=True, **kwargs)
        async for chunk in stream:
            now = time.perf_counter()
            tracker.seen.chunks += 1
            tracker.usage(chunk.usage.completion_tokens if chunk.usage else None, now)
        return tracker.seen

    def session() -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(
            base_url=f"{url}/v1", api_key="none", max_retries=0, default_headers=schedule.to_header()
        )

    return _run_async(schedule, tags, one, session)


def stack_fanout(processes: int) -> Callable[[str, Schedule, list[list[str]]], StackResult]:
    """`pytest_kvcache.fanout.Fanout`: ``processes`` worker processes, one event loop each; the k-th requests
    of every stream form one trial (all sent at once). CPU: the workers' CPU over the trial's window plus their
    parsing after it; the row's ``hot_cpu_per_chunk_us`` is the window's alone."""

    def stack(url: str, schedule: Schedule, tags: list[list[str]]) -> StackResult:
        seen: list[Seen] = []
        loads: list[ClientLoad] = []
        with Fanout(
            url, processes=processes, headers=schedule.to_header(), request_timeout_s=120, stall_timeout_s=60
        ) as fanout:
            fanout.trial([chat_payload(2, f"warm-{m[0]}") for m in tags])
            for j in range(max(len(m) for m in tags)):
                batch = [m[j] for m in tags if j < len(m)]
                trial = fanout.trial([_payload(schedule, tag) for tag in batch])
                loads.append(trial.load)
                seen += [seen_of(tag, sample) for tag, sample in zip(batch, trial.samples, strict=True)]
        hot = sum(load.cpu_s for load in loads)
        parse = sum(load.parse_cpu_s for load in loads)
        chunks = sum(load.chunks for load in loads)
        extra = {
            "hot_cpu_per_chunk_us": 1e6 * hot / chunks if chunks else float("nan"),
            "parse_cpu_per_chunk_us": 1e6 * parse / chunks if chunks else float("nan"),
            "proc_cpu_share_max_pct": 100 * max(load.cpu_share_max for load in loads),
            "loop_lag_p99_ms": 1e3 * max(load.loop_lag_p99_s for load in loads),
            "schedule_delay_max_ms": 1e3 * max(load.schedule_delay_max_s for load in loads),
            "saturated": any(load.saturated for load in loads),
            "saturation": "; ".join(sorted({r for load in loads for r in load.reasons})) or None,
            # the cores the workers used over the trials' windows (all processes together)
            "client_cpu_pct": 100 * hot / sum(load.wall_s for load in loads) if loads else float("nan"),
        }
        return seen, hot + parse, extra

    return stack


def fanout_name(processes: int) -> str:
    return f"ours: fanout, {processes} process{'es' if processes > 1 else ''}"


#: The stacks of the accuracy table and the chunk-rate sweep (the full stack table measures all of them).
DEFAULT_COMPARED = ";".join(
    (
        "ours: http.client, thread/stream",
        fanout_name(1),
        "httpx, thread/stream",
        "aiohttp, uvloop",
        "stdlib http.client, thread/stream",
    )
)
#: The stacks of the many-stream sweep: the single-stream client with a thread per stream (the concurrency probe's
#: path until 2026-12-02), the best other stack, and the many-stream path.
DEFAULT_MANY = ";".join(("ours: http.client, thread/stream", "aiohttp, uvloop", fanout_name(1), fanout_name(2)))

STACKS: dict[str, Callable[[str, Schedule, list[list[str]]], StackResult]] = {
    "ours: http.client, thread/stream": stack_ours,
    "httpx, thread/stream": stack_httpx_threads,
    "httpx, asyncio": stack_httpx_async,
    "aiohttp, asyncio": stack_aiohttp,
    "aiohttp, uvloop": stack_aiohttp_uvloop,
    "openai SDK, thread/stream": stack_openai_threads,
    "openai SDK, asyncio": stack_openai_async,
    "stdlib http.client, thread/stream": stack_http_client,
    **{fanout_name(k): stack_fanout(k) for k in (1, 2, 4, 8)},
}


# ------------------------------------------------------------------------------------------ measuring


def measure(server: ServerPool, stack: str, schedule: Schedule, streams: int, per_stream: int) -> dict[str, Any]:
    """Run one stack on one schedule; one row of figures (errors in %, CPU in µs per chunk)."""
    tags = _tags(streams, per_stream, f"{stack[:5]}-{time.perf_counter_ns()}")
    server.clear()
    server_cpu0 = server.cpu_s()
    wall0 = time.perf_counter()
    extra: dict[str, Any] = {}
    try:
        seen, cpu_s, extra = STACKS[stack](server.url, schedule, tags)
        failure = None
    except Exception as exc:  # a stack that breaks is a row that says so
        seen, cpu_s, failure = [], 0.0, f"{type(exc).__name__}: {exc}"
    wall = time.perf_counter() - wall0
    server_cpu = server.cpu_s() - server_cpu0
    records = match_records(server.records(len(seen) + streams if seen else 0, timeout_s=30.0)) if seen else {}
    timings: list[StreamTiming] = []
    errors = [s.error for s in seen if s.error]
    for s in seen:
        if s.error or s.first is None or s.last is None or s.tag not in records:
            continue
        timings.append(
            compare(
                records[s.tag], send_perf_s=s.send, first_perf_s=s.first, last_perf_s=s.last, completion_tokens=s.tokens
            )
        )
    chunks = sum(s.chunks for s in seen)
    ttft = [t.ttft_error_pct for t in timings if t.ttft_error_pct is not None]
    tps = [t.decode_tps_error_pct for t in timings if t.decode_tps_error_pct is not None]
    rate = sum(t.decode_tps_true or 0.0 for t in timings) / per_stream if timings else 0.0
    target = streams * schedule.tokens_per_chunk / schedule.itl_s if schedule.itl_s > 0 else float("nan")
    cpu_per_chunk_us = 1e6 * cpu_s / chunks if chunks else float("nan")
    return {
        "stack": stack,
        "streams": streams,
        "ttft_ms": schedule.ttft_s * 1e3,
        "itl_ms": schedule.itl_s * 1e3,
        "tokens": schedule.completion_tokens,
        "n": len(timings),
        "ttft_err_med_pct": _q(ttft, 50),
        "ttft_err_p95_pct": _q(ttft, 95),
        "ttft_err_med_ms": _q([t.ttft_error_s * 1e3 for t in timings], 50),
        "tps_err_med_pct": _q(tps, 50),
        "tps_err_p95_pct": _q([abs(x) for x in tps], 95),
        "cpu_per_chunk_us": cpu_per_chunk_us,
        "cpu_pct_of_0_5ms": cpu_per_chunk_us / 500.0 * 100.0,
        "agg_chunks_per_s": rate,
        "target_chunks_per_s": target,
        "rate_kept_pct": 100.0 * rate / target if target else float("nan"),
        "server_late_med_us": _q([t.server_lateness_s * 1e6 for t in timings], 50),
        "send_lag_med_us": _q([t.send_lag_s * 1e6 for t in timings], 50),
        "first_lag_med_us": _q([t.first_lag_s * 1e6 for t in timings], 50),
        "client_cpu_pct": 100.0 * cpu_s / wall if wall > 0 else float("nan"),
        "server_cpu_pct": 100.0 * server_cpu / wall if wall > 0 else float("nan"),
        "failed": len(errors) + (0 if failure is None else 1),
        "failure": failure or (errors[0] if errors else None),
        **extra,
    }


def _q(values: Sequence[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def _tokens_for(itl_s: float, seconds: float) -> int:
    return int(min(4000, max(100, seconds / itl_s)))


def accuracy(server: ServerPool, stacks: list[str], quick: bool) -> list[dict[str, Any]]:
    """The two reference schedules, one stream, requests one after another."""
    per = 4 if quick else 12
    rows = []
    for ttft, itl, tokens in ((0.150, 0.002, 250), (0.020, 0.0005, 1000)):
        for stack in stacks:
            rows.append(measure(server, stack, Schedule(ttft_s=ttft, itl_s=itl, completion_tokens=tokens), 1, per))
    return rows


def _stack_list(text: str) -> list[str]:
    names = [name.strip() for name in text.split(";") if name.strip()]
    unknown = [name for name in names if name not in STACKS]
    if unknown:
        raise SystemExit(f"unknown stack(s) {unknown}; known: {'; '.join(STACKS)}")
    return names


def sweep(server: ServerPool, stack: str, streams: int, quick: bool) -> list[dict[str, Any]]:
    """Shrink the inter-token time until a row is distorted (`undistorted`, median error) twice in a row.

    Both attempts are kept (``attempt`` 1 and 2); `ceiling` counts a rate if either attempt was undistorted.
    """
    if streams == 1:
        itls = [2.0, 1.0, 0.5, 0.35, 0.25, 0.18, 0.125, 0.09, 0.0625, 0.045, 0.03]
    else:
        rates = [1000, 2000, 4000, 6000, 8000, 12000, 16000, 20000, 24000, 32000, 48000]
        itls = [1e3 * streams / r for r in rates]
    seconds = 0.4 if quick else 1.0
    per = 2 if streams == 1 else 1
    rows = []
    for itl_ms in itls:
        itl = itl_ms / 1e3
        schedule = Schedule(ttft_s=0.02, itl_s=itl, completion_tokens=_tokens_for(itl, seconds))
        row = measure(server, stack, schedule, streams, per)
        row["attempt"] = 1
        if not undistorted(row, "tps_err_med_pct"):  # once more: a busy moment of a shared machine is not a ceiling
            rows.append(row)
            row = measure(server, stack, schedule, streams, per)
            row["attempt"] = 2
        rows.append(row)
        if not undistorted(row, "tps_err_med_pct"):  # the laxer criterion failed too
            break
    return rows


MANY_RATES = (8000, 16000, 24000, 32000, 48000, 64000, 80000, 96000, 128000, 160000, 200000, 256000, 320000, 400000)


def sweep_many(server: ServerPool, stack: str, streams: int, quick: bool) -> list[dict[str, Any]]:
    """`sweep` for many streams: the aggregate rate grows from 8,000 chunks/s until a row is distorted twice."""
    seconds = 0.5 if quick else 1.0
    rows = []
    for rate in MANY_RATES:
        itl = streams / rate
        if itl > 0.016:  # under 60 chunks/s a stream: too few tokens in a second to time (256 streams start higher)
            continue
        schedule = Schedule(ttft_s=0.02, itl_s=itl, completion_tokens=int(min(4000, max(100, seconds / itl))))
        row = measure(server, stack, schedule, streams, 1)
        row["attempt"] = 1
        if not undistorted(row, "tps_err_med_pct"):
            rows.append(row)
            row = measure(server, stack, schedule, streams, 1)
            row["attempt"] = 2
        rows.append(row)
        if not undistorted(row, "tps_err_med_pct"):
            break
    return rows


def undistorted(row: dict[str, Any], column: str) -> bool:
    """No failure, the ``column`` decode-TPS error within 2%, the server delivered at least 98% of its schedule,
    and the client did not judge itself saturated (the many-stream client's rows; the concurrency probe
    excludes such a trial's figures).

    Below 98% the client read too slowly and its back-pressure slowed the server. Above 100% the server started
    late (a burst of arrivals) and caught up on its absolute deadlines: a server artefact that the comparison
    with its recorded send times already accounts for, not a client distortion.
    """
    return (
        not row["failed"]
        and abs(row[column]) <= MAX_ERROR_PCT
        and row["rate_kept_pct"] >= MIN_RATE_KEPT_PCT
        and row.get("saturated") is not True
    )


def ceilings_row(stack: str, streams: int, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """One stack's ceilings at one stream count: by the median and by the p95 of the per-stream errors."""
    return {
        "stack": stack,
        "streams": streams,
        "max_chunks_per_s_med_le_2pct": ceiling(rows, "tps_err_med_pct"),
        "max_chunks_per_s_p95_le_2pct": ceiling(rows, "tps_err_p95_pct"),
    }


def ceiling(rows: list[dict[str, Any]], column: str) -> float:
    """The highest aggregate chunk rate among `undistorted` rows (by the ``column`` error)."""
    ok = [r["agg_chunks_per_s"] for r in rows if undistorted(r, column)]
    return max(ok) if ok else float("nan")


def compare_stacks(server: ServerPool, quick: bool, itl32_ms: float) -> list[dict[str, Any]]:
    """Every stack on one stream (TTFT 20 ms / ITL 0.5 ms) and on 32 streams (ITL ``itl32_ms``)."""
    rows = []
    one = Schedule(ttft_s=0.02, itl_s=0.0005, completion_tokens=1000 if not quick else 500)
    many = Schedule(ttft_s=0.02, itl_s=itl32_ms / 1e3, completion_tokens=_tokens_for(itl32_ms / 1e3, 1.0))
    for stack in STACKS:
        if stack in (fanout_name(4), fanout_name(8)):
            continue  # one stream or 32: more processes than streams per process would matter
        rows.append(measure(server, stack, one, 1, 3 if quick else 8))
        rows.append(measure(server, stack, many, 32, 1 if quick else 2))
    return rows


# ------------------------------------------------------------------------------------------ output

COLUMNS = {
    "accuracy": ["stack", "ttft_ms", "itl_ms", "tokens", "n", "ttft_err_med_ms", "ttft_err_med_pct", "ttft_err_p95_pct",
                 "send_lag_med_us", "first_lag_med_us", "tps_err_med_pct", "tps_err_p95_pct", "cpu_per_chunk_us",
                 "cpu_pct_of_0_5ms", "server_late_med_us"],
    "sweep": ["stack", "streams", "attempt", "itl_ms", "tokens", "n", "target_chunks_per_s", "agg_chunks_per_s",
              "rate_kept_pct", "tps_err_med_pct", "tps_err_p95_pct", "ttft_err_med_ms", "cpu_per_chunk_us",
              "client_cpu_pct", "server_cpu_pct", "server_late_med_us"],
    "many": ["stack", "streams", "attempt", "itl_ms", "tokens", "n", "target_chunks_per_s", "agg_chunks_per_s",
             "rate_kept_pct", "tps_err_med_pct", "tps_err_p95_pct", "ttft_err_med_ms", "cpu_per_chunk_us",
             "hot_cpu_per_chunk_us", "client_cpu_pct", "proc_cpu_share_max_pct", "loop_lag_p99_ms",
             "schedule_delay_max_ms", "saturated", "server_cpu_pct", "server_late_med_us"],
    "stacks": ["stack", "streams", "itl_ms", "n", "ttft_err_med_ms", "ttft_err_med_pct", "tps_err_med_pct",
               "tps_err_p95_pct", "cpu_per_chunk_us", "rate_kept_pct", "client_cpu_pct", "server_late_med_us",
               "failed"],
}  # fmt: skip


def table(rows: list[dict[str, Any]], columns: list[str], markdown: bool) -> str:
    frame = pd.DataFrame(rows).reindex(columns=columns)
    if not markdown:
        return frame.to_string(index=False, float_format=lambda x: f"{x:.3g}" if abs(x) < 100 else f"{x:.0f}")
    return markdown_table(frame)


def markdown_table(frame: pd.DataFrame) -> str:
    def cell(value: Any) -> str:
        if isinstance(value, float):
            if np.isnan(value):
                return "–"
            return f"{value:.3g}" if abs(value) < 100 else f"{value:,.0f}"
        return str(value)

    lines = ["| " + " | ".join(frame.columns) + " |", "|" + "---|" * len(frame.columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer and shorter requests (~1 min instead of ~4)")
    parser.add_argument("--markdown", action="store_true", help="print markdown tables")
    parser.add_argument("--json", metavar="FILE", help="also write every row as JSON")
    parser.add_argument(
        "--only",
        choices=["accuracy", "sweep", "many", "stacks"],
        action="append",
        help="run only these parts (repeatable)",
    )
    parser.add_argument("--many-stacks", default=DEFAULT_MANY, help="';'-separated stacks for the many-stream sweep")
    parser.add_argument(
        "--many-streams", default="32,64,128,256", help="','-separated stream counts of the many-stream sweep"
    )
    parser.add_argument(
        "--servers",
        type=int,
        default=1,
        help="calibrated-stream server processes sharing one port (SO_REUSEPORT); more than one where the "
        "server, not the client, would bound the many-stream sweep",
    )
    parser.add_argument(
        "--accuracy-stacks",
        default=DEFAULT_COMPARED,
        help="';'-separated stacks for the accuracy table (names as in the stack table)",
    )
    parser.add_argument(
        "--sweep-stacks",
        default=DEFAULT_COMPARED,
        help="';'-separated stacks for the chunk-rate sweep",
    )
    parser.add_argument("--itl32-ms", type=float, default=4.0, help="inter-token time of the 32-stream stack rows")
    args = parser.parse_args(argv)
    parts = args.only or ["accuracy", "sweep", "many", "stacks"]
    result: dict[str, Any] = {"machine": machine_facts(), "quick": args.quick, "argv": sys.argv}
    started = time.perf_counter()
    check = run_self_check(quick=True)
    check.pop("requests")
    result["self_check"] = check
    print(
        f"## Session self-check (quick): overhead {1e6 * (check['overhead_per_chunk_s'] or 0):.0f} µs/chunk, "
        f"TTFT error {check['metrics']['ttft_error_ms']['median']:.2f} ms, decode-TPS error "
        f"{check['metrics']['decode_tps_error_pct']['median']:.3f}%, {check['duration_s']:.1f} s\n",
        flush=True,
    )
    result["servers"] = args.servers
    with ServerPool(args.servers) as server:
        if "accuracy" in parts:
            result["accuracy"] = accuracy(server, _stack_list(args.accuracy_stacks), args.quick)
            print("## Accuracy: one stream, against the server's send times\n")
            print(table(result["accuracy"], COLUMNS["accuracy"], args.markdown), "\n", flush=True)
        if "sweep" in parts:
            rows: list[dict[str, Any]] = []
            ceilings = []
            for stack in _stack_list(args.sweep_stacks):
                for streams in (1, 32):
                    part = sweep(server, stack, streams, args.quick)
                    rows += part
                    ceilings.append(ceilings_row(stack, streams, part))
            result["sweep"], result["ceilings"] = rows, ceilings
            print("## Chunk-rate sweep\n")
            print(table(rows, COLUMNS["sweep"], args.markdown), "\n")
            print(table(ceilings, list(ceilings[0]), args.markdown), "\n", flush=True)
        if "many" in parts:
            rows, ceilings = [], []
            for stack in _stack_list(args.many_stacks):
                for streams in (int(n) for n in args.many_streams.split(",")):
                    part = sweep_many(server, stack, streams, args.quick)
                    rows += part
                    ceilings.append(ceilings_row(stack, streams, part))
                    print(table(part, COLUMNS["many"], args.markdown), "\n", flush=True)
            result["many"], result["many_ceilings"] = rows, ceilings
            print("## Many streams\n")
            print(table(ceilings, list(ceilings[0]), args.markdown), "\n", flush=True)
        if "stacks" in parts:
            result["stacks"] = compare_stacks(server, args.quick, args.itl32_ms)
            print("## Client stacks\n")
            print(table(result["stacks"], COLUMNS["stacks"], args.markdown), "\n", flush=True)
    result["duration_s"] = time.perf_counter() - started
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(result, handle, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
