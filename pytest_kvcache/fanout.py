"""Many simultaneous streams, measured: one event loop per worker process.

The single-stream `~pytest_kvcache.client.Client` gives every stream a thread; past a few dozen streams a
thread per stream pays a GIL hand-off and a wake-up for every chunk of every stream, and the client becomes
what is measured (docs/performance.md). `Fanout` measures a trial of N streams instead with a pool of worker
processes, each running one event loop (uvloop when installed) over its share of the streams:

* connections are opened before the trial starts, and every request has a requested send time;
* the hot path is a protocol's ``data_received``: it stamps the bytes with `time.perf_counter` and keeps them,
  and feeds them to a C HTTP parser (httptools) only to learn where the body starts and the response ends --
  no SSE or JSON parsing while a trial runs;
* the garbage collector is held from the start of the trial to its end;
* after the trial the kept bytes are parsed line by line by `~pytest_kvcache.client.TokenClock`, each line
  timed when its last byte arrived: the same timing model and failure kinds as the single-stream client.

Per trial, `ClientLoad` tells how hard the client worked: schedule delay (requested vs actual send), each
process's CPU share and its event-loop lag (a timer's lateness). A trial whose client was saturated -- a
process above `Saturation.max_cpu_share` of a core, or a loop lag above `Saturation.max_loop_lag_s` -- is
flagged: its timings are the client's, not the engine's.

`Fanout.sessions` runs closed-loop *sessions* instead (the capacity probe): each session sends its turns one
after the other, each turn its previous context plus a new message, a think time after the previous turn ended
(`SessionPlan`). Turn 0 of every session builds its context (the warmup); once every session in every worker
has finished it, the measured window opens for the same time in all workers (a shared array tells them), and
the turns sent in it are the trial's measured turns. A new connection is opened for every turn while the
session thinks, so connecting stays outside every timing here too.

Workers start with the ``spawn`` method: a script that drives `Fanout` itself needs the usual
``if __name__ == "__main__":`` guard (under pytest nothing is needed).

Plain Python: no pytest.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import math
import multiprocessing
import os
import signal
import socket
import ssl
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import Connection
from typing import Any
from urllib.parse import urlsplit

from pytest_kvcache.client import ErrorKind, Limits, Sample, TokenClock, error_text, prompt_size

#: How often each worker's watchdog wakes: stall and timeout checks, and one event-loop lag sample.
TICK_S = 0.005


@dataclass(frozen=True)
class Saturation:
    """When a trial's client counts as saturated (its figures then describe the client, not the engine)."""

    #: a worker process busier than this share of one core over the trial's window
    max_cpu_share: float = 0.85
    #: the loop lag (`ClientLoad.loop_lag_p99_s`) above this: bytes that arrived waited about that long to be read
    max_loop_lag_s: float = 0.005
    #: a request sent this much after its requested time
    max_schedule_delay_s: float = 0.050


@dataclass
class ClientLoad:
    """How hard the client worked in one trial (one worker's figures, or the trial's worst)."""

    processes: int = 0
    streams: int = 0
    wall_s: float = 0.0
    #: CPU seconds of the worker processes in the window (all of them), and per chunk
    cpu_s: float = 0.0
    chunks: int = 0
    cpu_per_chunk_us: float | None = None
    #: the busiest worker's CPU over the window, as a share of one core
    cpu_share_max: float = 0.0
    #: CPU of the parsing after the window (SSE + JSON), in all and per chunk
    parse_cpu_s: float = 0.0
    parse_cpu_per_chunk_us: float | None = None
    #: how long a callback made ready waited for the loop (the I/O it had to handle first), per tick
    loop_lag_p50_s: float = 0.0
    loop_lag_p99_s: float = 0.0
    loop_lag_max_s: float = 0.0
    #: how late the tick's timer woke the loop (adds the host's scheduling delay; reported, not judged)
    timer_lag_p99_s: float = 0.0
    schedule_delay_p50_s: float = 0.0
    schedule_delay_max_s: float = 0.0
    saturated: bool = False
    reasons: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Trial:
    """A trial's samples (in payload order) and the client's load while it ran."""

    samples: list[Sample]
    load: ClientLoad


@dataclass(frozen=True)
class SessionPlan:
    """One session's requests, as JSON pieces: turn ``k``'s body is ``head + turns[0] + … + turns[k] + tail``
    (the messages so far, each turn adding its own), so a turn's request is built by concatenation while the
    session thinks. ``think_s[k]`` is the wait before turn ``k`` (k ≥ 1) after turn ``k - 1`` ended; for
    ``k = 1`` it counts from the opening of the measured window instead (every session waits there after its
    warmup), which staggers the first measured turns. ``prompt_tokens[k]`` sizes turn ``k``'s first-token
    limit (estimated from its length when missing)."""

    head: bytes
    turns: tuple[bytes, ...]
    tail: bytes
    think_s: tuple[float, ...]
    prompt_tokens: tuple[int | None, ...] = ()

    def __post_init__(self) -> None:
        if not self.turns or len(self.think_s) < len(self.turns):
            raise ValueError("a session plan needs at least one turn and a think time for every turn")


@dataclass
class SessionTurn:
    """One turn of one session: its sample; turn 0 is the session's warmup, the others were sent in the
    measured window."""

    session: int
    turn: int
    sample: Sample


@dataclass
class SessionTrial:
    """A sessions trial: every turn sent (in session, then turn order), the measured window (unix seconds;
    None when the sessions never all finished their warmup) and the client's load."""

    turns: list[SessionTurn]
    window_unix_s: tuple[float, float] | None
    load: ClientLoad

    @property
    def measured(self) -> list[SessionTurn]:
        return [t for t in self.turns if t.turn > 0]


#: A monitor of a sessions trial is told "start" when the measured window opens, "tick" every ``tick_s`` in
#: it, "end" when it closes and "done" when the last turn has ended.
Monitor = Callable[[str], None]

# ---------------------------------------------------------------------------------------------- worker side


class _Stream(asyncio.Protocol):
    """One connection and its one request: stamps the bytes as they arrive, nothing more."""

    def __init__(self, index: int, request: bytes, first_limit_s: float, headers_limit_s: float | None = None) -> None:
        import httptools

        self.index = index
        self.request = request
        self.first_limit_s = first_limit_s
        #: the response headers must come within this long (`Limits.headers_at_once`), or the stream fails
        self.headers_limit_s = headers_limit_s
        self.headers_seen = False
        self._headers_timer: asyncio.TimerHandle | None = None
        self.pieces: list[tuple[float, bytes]] = []
        self.transport: asyncio.Transport | None = None
        self.send_perf_s = 0.0
        self.requested_s = 0.0
        self.last_rx = 0.0
        self.complete = False
        self.closed = False
        #: why the stream was cut short on the hot path: a failure kind and its message ("" for the kinds whose
        #: message `_failed` writes from the limits)
        self.failure: tuple[ErrorKind, str] | None = None
        self.lost: Exception | None = None  # how the connection ended (None: closed cleanly, or still open)
        #: whether a chunk has carried a token (`TokenClock.has_token`): the first-token limit ends there
        self.token_seen = False
        self._head = b""
        self._clock = TokenClock(Sample())
        self.failed_at = 0.0
        self.done: asyncio.Future[None] | None = None
        self._parser = httptools.HttpResponseParser(self)
        self._feed = self._parser.feed_data

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's transports are their own classes
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter()
        self.last_rx = now
        self.pieces.append((now, data))
        try:
            self._feed(data)
        except Exception as exc:  # httptools.HttpParserError and its kinds
            self._end(("dropped", f"the response is not valid HTTP: {type(exc).__name__}: {exc}"), now)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.lost = exc
        if not self.complete and self.failure is None:
            self._end(None, time.perf_counter())

    # httptools callbacks
    def on_headers_complete(self) -> None:
        self.headers_seen = True
        if self._headers_timer is not None:
            self._headers_timer.cancel()

    def on_body(self, body: bytes) -> None:
        if self.token_seen:
            return
        # Until the first token the first-token limit applies (a role chunk or an empty delta does not end
        # it): the body's first lines go through the timing model's own token test, then no more parsing.
        self._head += body
        *complete, self._head = self._head.split(b"\n")
        for line in complete:
            self._clock.line(line, 0.0)
            if self._clock.has_token:
                self.token_seen = True  # from now on the stall timeout applies between chunks
                self._head = b""
                return

    def on_message_complete(self) -> None:
        self.complete = True
        self._end(None, self.last_rx)

    def send(self, requested_s: float) -> None:
        assert self.transport is not None
        self.requested_s = requested_s
        self.send_perf_s = self.last_rx = time.perf_counter()
        self.transport.write(self.request)
        if self.headers_limit_s is not None:
            self._headers_timer = asyncio.get_running_loop().call_later(self.headers_limit_s, self._headers_due)

    def _headers_due(self) -> None:
        if not self.headers_seen:
            self.fail("no_response")  # a server that took the request and sent nothing: hung

    def _end(self, failure: tuple[ErrorKind, str] | None, when: float) -> None:
        if self.done is None or self.done.done():
            return
        if failure is not None:
            self.failure, self.failed_at = failure, when
            if self.transport is not None:
                self.transport.abort()
        self.done.set_result(None)

    def fail(self, kind: ErrorKind, message: str = "") -> None:
        self._end((kind, message), time.perf_counter())


class _Reader:
    """httptools callbacks for the second, unhurried pass over a response's kept bytes."""

    def __init__(self) -> None:
        self.body: list[bytes] = []
        self.complete = False

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        self.complete = True


def _timed_lines(pieces: Sequence[tuple[float, bytes]]) -> tuple[int | None, list[tuple[float, bytes]], bool]:
    """The response's status, its body lines each with the arrival time of its last byte, and whether the
    response was complete."""
    import httptools

    reader = _Reader()
    parser = httptools.HttpResponseParser(reader)
    lines: list[tuple[float, bytes]] = []
    partial = b""
    status: int | None = None
    for when, data in pieces:
        try:
            parser.feed_data(data)
        except Exception:
            break
        if status is None:
            with contextlib.suppress(Exception):
                status = parser.get_status_code() or None
        if not reader.body:
            continue
        text = partial + b"".join(reader.body)
        reader.body.clear()
        *complete, partial = text.split(b"\n")
        lines += [(when, line + b"\n") for line in complete]
    if partial:
        lines.append((pieces[-1][0], partial))
    return status, lines, reader.complete


def _failed(sample: Sample, stream: _Stream, limits: Limits, tokens: int, estimated: bool) -> Sample:
    """``sample`` failed as the hot path decided (``stream.failure``), in the single-stream client's words."""
    assert stream.failure is not None
    kind, message = stream.failure
    if kind == "first_token_timeout":
        return limits.first_token_failure(sample, stream.first_limit_s, tokens, estimated)
    if kind == "no_response":
        return limits.headers_failure(sample)
    if kind == "stall":
        return limits.stall_failure(sample)
    sample.end_s = stream.failed_at - stream.send_perf_s
    if kind == "timeout":
        return limits.timeout_failure(sample)
    return sample.fail(kind, message)


def _settle(stream: _Stream, limits: Limits, tokens: int, estimated: bool, unix0: float, perf0: float) -> Sample:
    """The kept bytes of one stream, read by the timing model: one `Sample`."""
    t0 = stream.send_perf_s
    sample = Sample(send_unix_s=unix0 + (t0 - perf0), send_perf_s=t0)
    if not t0:
        return sample.fail("connection_error", "the request was never sent")
    status, lines, complete = _timed_lines(stream.pieces)
    sample.http_status = status
    last = stream.pieces[-1][0] if stream.pieces else t0
    if stream.failure is not None and not lines:
        return _failed(sample, stream, limits, tokens, estimated)
    if status is not None and status >= 400:
        sample.end_s = last - t0
        body = b"".join(line for _, line in lines)
        return sample.fail("http_error", f"HTTP {status}: {error_text(body)}")
    if status is None:
        return sample.fail("connection_error", "the server closed the connection before it answered")
    clock = TokenClock(sample)
    stopped = False
    for when, line in lines:
        if clock.line(line, when - t0):
            stopped = True
            break
    if not stopped and stream.failure is not None:
        return _failed(sample, stream, limits, tokens, estimated)
    if not stopped and not complete and stream.lost is not None:
        sample.end_s = last - t0
        exc = stream.lost
        what = type(exc).__name__ if not str(exc) else f"{type(exc).__name__}: {exc}"
        return sample.fail("dropped", f"connection dropped mid-stream after {sample.chunks} chunks: {what}")
    clock.finish(last - t0)
    if sample.ok and sample.end_s is not None and sample.end_s > limits.request_timeout_s:
        return limits.timeout_failure(sample)
    return sample


@dataclass
class _Job:
    """What a worker is told to run: its streams (index, request bytes, first-token limit, tokens, estimated)."""

    host: str
    port: int
    tls: bool
    streams: list[tuple[int, bytes, float, int, bool]]
    limits: Limits
    offsets_s: list[float]


def _percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    k = min(len(ordered) - 1, max(0, math.ceil(q / 100.0 * len(ordered)) - 1))
    return ordered[k]


class _Trial:
    """One worker's part of one trial, on its event loop."""

    #: the process that started this worker (None: not running in a worker)
    parent_pid: int | None = None

    def __init__(self, job: _Job) -> None:
        self.job = job
        heads = job.limits.headers_limit_s if job.limits.headers_at_once else None
        self.streams = [_Stream(i, req, lim, heads(lim) if heads else None) for i, req, lim, _, _ in job.streams]
        self.lags: list[float] = []
        self.timer_lags: list[float] = []

    async def connect(self) -> None:
        loop = asyncio.get_running_loop()
        job = self.job
        timeout = job.limits.connect_timeout_s
        tls = ssl.create_default_context() if job.tls else None

        async def one(stream: _Stream) -> None:
            await asyncio.wait_for(loop.create_connection(lambda: stream, job.host, job.port, ssl=tls), timeout=timeout)

        await asyncio.gather(*(one(s) for s in self.streams))

    async def run(self, start_perf_s: float) -> tuple[float, float, float]:
        """Send every request at its time and wait until every response ended; (window start, end, CPU s)."""
        loop = asyncio.get_running_loop()
        for stream in self.streams:
            stream.done = loop.create_future()
        wait = start_perf_s - time.perf_counter()
        if wait > 0.002:
            await asyncio.sleep(wait - 0.002)
        while time.perf_counter() < start_perf_s:
            pass
        cpu0 = time.process_time()
        begin = time.perf_counter()
        watchdog = loop.create_task(self._watch(begin))
        offsets = self.job.offsets_s
        pending = sorted(range(len(self.streams)), key=lambda k: offsets[k])
        for k in pending:
            due = start_perf_s + offsets[k]
            ahead = due - time.perf_counter()
            if ahead > 0.002:  # the loop's timers have millisecond resolution: sleep short, then spin
                await asyncio.sleep(ahead - 0.0015)
            while time.perf_counter() < due:
                pass
            self.streams[k].send(due)
        await asyncio.gather(*(s.done for s in self.streams if s.done is not None))
        end = time.perf_counter()
        cpu = time.process_time() - cpu0
        watchdog.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watchdog
        return begin, end, cpu

    async def _watch(self, begin: float) -> None:
        """Every `TICK_S`: one lag sample of each kind, and the stall and timeout checks.

        The loop lag is how long a callback made ready now waits for its turn: the I/O the loop has to handle
        first. It stays near zero while the loop keeps up and grows when it cannot. The timer lag (how late the
        tick itself woke) adds the operating system's wake-up and scheduling delay, which a busy host causes
        without the client being busy; it is reported, not judged.
        """
        loop = asyncio.get_running_loop()
        limits = self.limits
        due = begin + TICK_S
        while True:
            await asyncio.sleep(max(0.0, due - time.perf_counter()))
            if self.parent_pid is not None and os.getppid() != self.parent_pid:
                os._exit(1)  # the parent is gone: nobody reads this trial
            now = time.perf_counter()
            self.timer_lags.append(max(0.0, now - due))
            loop.call_soon(self._lagged, now)
            due = max(due + TICK_S, now)
            for s in self.streams:
                if s.done is None or s.done.done() or not s.send_perf_s:
                    continue
                if now - s.send_perf_s > limits.request_timeout_s:
                    s.fail("timeout")
                elif not s.token_seen and now - s.send_perf_s > s.first_limit_s:
                    s.fail("first_token_timeout")
                elif s.token_seen and now - s.last_rx > limits.read_timeout_s:
                    s.fail("stall")

    @property
    def limits(self) -> Limits:
        return self.job.limits

    def _lagged(self, since: float) -> None:
        self.lags.append(time.perf_counter() - since)

    def close(self) -> None:
        for s in self.streams:
            if s.transport is not None and not s.closed:
                s.transport.abort()


@dataclass
class _SessionJob:
    """A worker's share of a sessions trial: its sessions (index, plan), where its warm time goes in the
    shared array, and the window's length."""

    host: str
    port: int
    tls: bool
    path: str
    headers: dict[str, str]
    sessions: list[tuple[int, SessionPlan]]
    limits: Limits
    window_s: float
    slot: int
    warm_concurrency: int


class _Sessions(_Trial):
    """One worker's sessions of one trial, on its event loop: warmups (a few at a time), then, once every
    worker's sessions are warm, the measured turns of every session until the window closes."""

    #: the array the workers share: per worker, when its sessions were all warm (perf counter); 0: not yet;
    #: -1: no sessions in this trial
    shared: Any = None

    def __init__(self, job: _SessionJob) -> None:  # a _Trial whose streams come and go: no _Job
        self.sessions_job = job
        self.streams = []
        self.lags = []
        self.timer_lags = []
        self.turns: list[tuple[int, int, _Stream, int, bool]] = []  # session, turn, stream, tokens, estimated
        self._first: dict[int, _Stream] = {}
        self._warm_left = len(job.sessions)
        self._window: tuple[float, float] | None = None

    def _request(self, body: bytes) -> bytes:
        job = self.sessions_job
        head = [f"POST {job.path} HTTP/1.1", f"Host: {job.host}:{job.port}", f"Content-Length: {len(body)}"]
        head += [f"{name}: {value}" for name, value in job.headers.items()]
        return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body

    def _stream(self, plan: SessionPlan, turn: int, context: bytes) -> tuple[_Stream, int, bool]:
        body = plan.head + context + plan.tail
        given = plan.prompt_tokens[turn] if turn < len(plan.prompt_tokens) else None
        tokens, estimated = prompt_size(body, given)
        stream = _Stream(turn, self._request(body), self.sessions_job.limits.first_token_limit_s(tokens))
        return stream, tokens, estimated

    async def _open(self, stream: _Stream) -> bool:
        loop = asyncio.get_running_loop()
        job = self.sessions_job
        tls = ssl.create_default_context() if job.tls else None
        try:
            await asyncio.wait_for(
                loop.create_connection(lambda: stream, job.host, job.port, ssl=tls),
                timeout=job.limits.connect_timeout_s,
            )
        except (TimeoutError, OSError):
            return False
        return True

    async def connect(self) -> None:
        """Every session's warmup connection, before the trial starts."""
        for index, plan in self.sessions_job.sessions:
            stream, tokens, estimated = self._stream(plan, 0, plan.turns[0])
            self._first[index] = stream
            self.turns.append((index, 0, stream, tokens, estimated))
            if not await self._open(stream):
                raise OSError(f"cannot connect to {self.sessions_job.host}:{self.sessions_job.port}")

    @property
    def limits(self) -> Limits:
        return self.sessions_job.limits

    def window(self) -> tuple[float, float] | None:
        """The measured window (perf counter), once every worker's sessions are warm."""
        if self._window is None:
            shared = self.shared
            values = [shared[i] for i in range(len(shared))] if shared is not None else [self._own_warm]
            if values and all(v != 0 for v in values) and any(v > 0 for v in values):
                start = max(values)
                self._window = (start, start + self.sessions_job.window_s)
        return self._window

    _own_warm = 0.0

    def _warmed(self) -> None:
        self._warm_left -= 1
        if self._warm_left == 0:
            self._own_warm = time.perf_counter()
            if self.shared is not None:
                self.shared[self.sessions_job.slot] = self._own_warm

    async def _send(self, stream: _Stream, due: float) -> None:
        loop = asyncio.get_running_loop()
        stream.done = loop.create_future()
        ahead = due - time.perf_counter()
        if ahead > 0.002:  # the loop's timers have millisecond resolution: sleep short, then spin
            await asyncio.sleep(ahead - 0.0015)
        while time.perf_counter() < due:
            pass
        self.streams.append(stream)
        stream.send(due)
        await stream.done
        if stream.transport is not None and not stream.closed:
            stream.transport.close()  # a session's next turn comes on a new connection: free the server's

    async def _session(self, index: int, plan: SessionPlan, start_perf_s: float, warm: asyncio.Semaphore) -> None:
        first = self._first[index]
        async with warm:
            await self._send(first, max(start_perf_s, time.perf_counter()))
        self._warmed()
        while (window := self.window()) is None:
            await asyncio.sleep(0.002)
        context = plan.turns[0]
        previous_end = window[0]  # turn 1 waits its think time from the opening of the window
        for turn in range(1, len(plan.turns)):
            due = previous_end + plan.think_s[turn]
            if due >= window[1]:
                return
            context += plan.turns[turn]
            stream, tokens, estimated = self._stream(plan, turn, context)
            self.turns.append((index, turn, stream, tokens, estimated))
            if not await self._open(stream):
                return  # never sent: settled as a connection error
            await self._send(stream, due)  # late when connecting took longer than the think time: measured
            previous_end = time.perf_counter()

    async def run(self, start_perf_s: float) -> tuple[float, float, float]:
        loop = asyncio.get_running_loop()
        wait = start_perf_s - time.perf_counter()
        if wait > 0.002:
            await asyncio.sleep(wait - 0.002)
        while time.perf_counter() < start_perf_s:
            pass
        cpu0 = time.process_time()
        begin = time.perf_counter()
        watchdog = loop.create_task(self._watch(begin))
        warm = asyncio.Semaphore(max(1, self.sessions_job.warm_concurrency))
        await asyncio.gather(*(self._session(i, plan, start_perf_s, warm) for i, plan in self.sessions_job.sessions))
        end = time.perf_counter()
        cpu = time.process_time() - cpu0
        watchdog.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watchdog
        return begin, end, cpu

    def close(self) -> None:
        for _, _, s, _, _ in self.turns:
            if s.transport is not None and not s.closed:
                s.transport.abort()


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    return loop


def _worker_main(conn: Connection, shared: Any = None) -> None:
    """A worker process: runs trials as the parent sends them, until the pipe closes or the parent is gone.

    Ctrl-C is the parent's to handle (it closes the pool); a worker whose parent died mid-trial exits at the
    next watchdog tick instead of finishing the trial for no one.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _Trial.parent_pid = os.getppid()
    _Sessions.shared = shared
    loop = _new_loop()
    asyncio.set_event_loop(loop)
    try:
        while True:
            try:
                job: _Job | _SessionJob | None = conn.recv()
            except (EOFError, OSError):
                return
            if job is None:
                return
            try:
                _serve_one(loop, conn, job)
            except Exception:
                conn.send(("error", traceback.format_exc(limit=6)))
    finally:
        loop.close()


def _serve_one(loop: asyncio.AbstractEventLoop, conn: Connection, job: _Job | _SessionJob) -> None:
    trial = _Sessions(job) if isinstance(job, _SessionJob) else _Trial(job)
    try:
        try:
            loop.run_until_complete(trial.connect())
            gc.collect()  # now, not in the window: a full collection of a big heap takes tens of ms
            conn.send(("ready", None))
        except (TimeoutError, OSError) as exc:
            url = f"{'https' if job.tls else 'http'}://{job.host}:{job.port}"
            conn.send(("ready", f"cannot connect to {url}: {type(exc).__name__}: {exc}"))
        command, start_perf_s = conn.recv()
        if command != "go":
            return
        unix0, perf0 = time.time(), time.perf_counter()
        gc.disable()
        try:
            begin, end, cpu = loop.run_until_complete(trial.run(start_perf_s))
        finally:
            gc.enable()
        parse0 = time.process_time()
        samples: list[Any] = []
        if isinstance(trial, _Sessions):
            for index, turn, stream, tokens, estimated in trial.turns:
                sample = _settle(stream, job.limits, tokens, estimated, unix0, perf0).to_dict()
                samples.append((index, turn, sample))
        else:
            assert isinstance(job, _Job)
            for (_, _, _, tokens, estimated), stream in zip(job.streams, trial.streams, strict=True):
                samples.append(_settle(stream, job.limits, tokens, estimated, unix0, perf0).to_dict())
        parse_cpu = time.process_time() - parse0
        delays = [s.send_perf_s - s.requested_s for s in trial.streams if s.send_perf_s]
        figures = {
            "wall_s": end - begin,
            "cpu_s": cpu,
            "parse_cpu_s": parse_cpu,
            "chunks": sum(int((s[2] if isinstance(s, tuple) else s).get("chunks") or 0) for s in samples),
            "lags": trial.lags,
            "timer_lags": trial.timer_lags,
            "delays": delays,
        }
        conn.send(("done", (samples, figures)))
    finally:
        trial.close()


# ---------------------------------------------------------------------------------------------- parent side


def default_processes(streams: int, cores: int | None = None) -> int:
    """How many worker processes a trial of ``streams`` gets when not told: one per 64 streams, leaving a core
    of every two to the engine's own front end, and never more than the streams."""
    cores = cores or os.cpu_count() or 1
    return max(1, min(streams, math.ceil(streams / 64), max(1, cores // 2)))


class FanoutError(RuntimeError):
    """A worker process failed outside any stream's measurement (it could not start, or crashed)."""


class Fanout:
    """Runs trials of simultaneous streams against one OpenAI-compatible server; see the module docstring.

    Use as a context manager; the worker processes live until `close`::

        with Fanout(url, processes=2, **settings.client_kwargs()) as fanout:
            trial = fanout.trial(payloads)
    """

    def __init__(
        self,
        base_url: str,
        *,
        processes: int = 1,
        request_timeout_s: float = 600.0,
        stall_timeout_s: float = 120.0,
        connect_timeout_s: float = 10.0,
        headers: Mapping[str, str] | None = None,
        first_token_floor_s: float | None = None,
        min_prefill_tps: float = 500.0,
        headers_at_once: bool = True,
        saturation: Saturation = Saturation(),
        start_margin_s: float = 0.05,
    ) -> None:
        parts = urlsplit(base_url.rstrip("/"))
        if parts.scheme not in ("http", "https"):
            raise ValueError(f"the many-stream client speaks http and https, not {parts.scheme!r} ({base_url})")
        self.base_url = base_url.rstrip("/")
        self.tls = parts.scheme == "https"
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or (443 if self.tls else 80)
        self.path = parts.path.rstrip("/") + "/v1/chat/completions"
        self.processes = max(1, processes)
        self.limits = Limits(
            request_timeout_s=request_timeout_s,
            stall_timeout_s=stall_timeout_s,
            connect_timeout_s=connect_timeout_s,
            first_token_floor_s=first_token_floor_s,
            min_prefill_tps=min_prefill_tps,
            headers_at_once=headers_at_once,
        )
        self.headers = {"Content-Type": "application/json", **(headers or {})}
        self.saturation = saturation
        self.start_margin_s = start_margin_s
        self._workers: list[tuple[Any, Connection]] = []
        self._shared: Any = None

    def start(self) -> Fanout:
        ctx = multiprocessing.get_context("spawn")
        try:
            self._shared = ctx.RawArray("d", self.processes)
            for k in range(self.processes):
                parent, child = ctx.Pipe()
                process = ctx.Process(
                    target=_worker_main, args=(child, self._shared), name=f"kv-fanout-{k}", daemon=True
                )
                process.start()
                child.close()
                self._workers.append((process, parent))
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        for _, conn in self._workers:
            with contextlib.suppress(OSError, ValueError):
                conn.send(None)
            conn.close()
        for process, _ in self._workers:
            process.join(5.0)
            if process.is_alive():
                process.kill()
                process.join(5.0)
        self._workers = []

    def processes_alive(self) -> list[Any]:
        """The worker processes (`multiprocessing.Process`) still running."""
        return [process for process, _ in self._workers if process.is_alive()]

    def __enter__(self) -> Fanout:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _request(self, body: bytes) -> bytes:
        """The whole HTTP request of one stream, written in one go at its send time."""
        head = [f"POST {self.path} HTTP/1.1", f"Host: {self.host}:{self.port}", f"Content-Length: {len(body)}"]
        head += [f"{name}: {value}" for name, value in self.headers.items()]
        return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body

    def trial(
        self,
        payloads: Sequence[Mapping[str, Any]],
        *,
        offsets_s: Sequence[float] | None = None,
        prompt_tokens: Sequence[int | None] | None = None,
        timeout_s: float | None = None,
    ) -> Trial:
        """Stream every payload (``stream: true``) at once -- or each ``offsets_s[i]`` after the start -- and
        measure it; samples in payload order, never raised failures."""
        if not self._workers:
            self.start()
        n = len(payloads)
        offsets = list(offsets_s) if offsets_s is not None else [0.0] * n
        tokens_of = list(prompt_tokens) if prompt_tokens is not None else [None] * n
        parts: list[list[tuple[int, bytes, float, int, bool]]] = [[] for _ in self._workers]
        part_offsets: list[list[float]] = [[] for _ in self._workers]
        for i, payload in enumerate(payloads):
            body = json.dumps(payload).encode()
            tokens, estimated = prompt_size(body, tokens_of[i])
            k = i % len(self._workers)
            parts[k].append((i, self._request(body), self.limits.first_token_limit_s(tokens), tokens, estimated))
            part_offsets[k].append(offsets[i])
        active = [(w, p, o) for w, p, o in zip(self._workers, parts, part_offsets, strict=True) if p]
        wait_s = timeout_s if timeout_s is not None else self.limits.request_timeout_s + max(offsets, default=0) + 30
        for (process, conn), part, offs in active:
            self._send(process, conn, _Job(self.host, self.port, self.tls, part, self.limits, offs))
        refused: str | None = None
        for (process, conn), _, _ in active:
            status, value = self._receive(process, conn, self.limits.connect_timeout_s * 2 + 30)
            if status != "ready":
                raise FanoutError(f"fanout worker: {value}")
            refused = refused or value
        start = time.perf_counter() + self.start_margin_s
        for (process, conn), _, _ in active:
            self._send(process, conn, ("go" if refused is None else "stop", start))
        if refused is not None:
            return Trial([Sample().fail("connection_error", refused) for _ in payloads], ClientLoad(streams=n))
        samples: list[Sample | None] = [None] * n
        figures: list[dict[str, Any]] = []
        for (process, conn), part, _ in active:
            status, value = self._receive(process, conn, wait_s)
            if status != "done":
                raise FanoutError(f"fanout worker: {value}")
            data, figure = value
            figures.append(figure)
            for (i, *_), sample in zip(part, data, strict=True):
                samples[i] = Sample(**sample)
        return Trial([s if s is not None else Sample() for s in samples], self._load(figures, n))

    def sessions(
        self,
        plans: Sequence[SessionPlan],
        *,
        window_s: float,
        monitor: Monitor | None = None,
        tick_s: float = 0.5,
        warm_concurrency: int = 4,
        timeout_s: float | None = None,
    ) -> SessionTrial:
        """Run ``plans`` as closed-loop sessions (see `SessionPlan`): every session's turn 0 (at most
        ``warm_concurrency`` at a time in each worker), then ``window_s`` seconds of turns in every session;
        a turn due after the window is not sent. ``monitor`` is told when the window opens, every ``tick_s``
        in it, when it closes and when the last turn ended (the probe reads the engine's counters there)."""
        if not self._workers:
            self.start()
        n = len(self._workers)
        parts: list[list[tuple[int, SessionPlan]]] = [[] for _ in range(n)]
        for i, plan in enumerate(plans):
            parts[i % n].append((i, plan))
        shared = self._shared
        for k in range(n):
            shared[k] = 0.0 if parts[k] else -1.0
        active = [(w, part, k) for k, (w, part) in enumerate(zip(self._workers, parts, strict=True)) if part]
        turns_max = max((len(p.turns) for p in plans), default=1)
        limit = self.limits.request_timeout_s
        wait_s = timeout_s if timeout_s is not None else limit * (turns_max + 1) + window_s + 60
        for (process, conn), part, slot in active:
            job = _SessionJob(
                self.host, self.port, self.tls, self.path, self.headers, part, self.limits, window_s, slot,
                warm_concurrency,
            )  # fmt: skip
            self._send(process, conn, job)
        refused: str | None = None
        for (process, conn), _, _ in active:
            status, value = self._receive(process, conn, self.limits.connect_timeout_s * 2 + 30)
            if status != "ready":
                raise FanoutError(f"fanout worker: {value}")
            refused = refused or value
        start = time.perf_counter() + self.start_margin_s
        for (process, conn), _, _ in active:
            self._send(process, conn, ("go" if refused is None else "stop", start))
        if refused is not None:
            failed = [SessionTurn(i, 0, Sample().fail("connection_error", refused)) for i in range(len(plans))]
            return SessionTrial(failed, None, ClientLoad(streams=len(plans)))
        results: dict[int, tuple[list[Any], dict[str, Any]]] = {}
        deadline = time.monotonic() + wait_s
        window: tuple[float, float] | None = None
        told: set[str] = set()
        next_tick = 0.0

        def tell(event: str) -> None:
            if monitor is not None and event not in told:
                monitor(event)
            told.add(event)

        while len(results) < len(active):
            for (process, conn), _, slot in active:
                if slot in results:
                    continue
                if conn.poll(0.01):
                    status, value = self._receive(process, conn, 0)
                    if status != "done":
                        raise FanoutError(f"fanout worker: {value}")
                    results[slot] = value
                elif not process.is_alive():
                    raise FanoutError(f"a worker process exited (exit code {process.exitcode})")
            values = [shared[k] for k in range(n)]
            if window is None and all(v != 0 for v in values) and any(v > 0 for v in values):
                opened = max(values)
                window = (opened, opened + window_s)
                tell("start")
                next_tick = time.perf_counter() + tick_s
            now = time.perf_counter()
            if window is not None and "end" not in told:
                if now >= window[1]:
                    tell("end")
                elif now >= next_tick and monitor is not None:
                    monitor("tick")
                    next_tick = now + tick_s
            if time.monotonic() > deadline:
                raise FanoutError(f"a sessions trial did not end within {wait_s:g} s")
        if window is not None:
            tell("end")
        tell("done")
        turns: list[SessionTurn] = []
        figures: list[dict[str, Any]] = []
        for slot in sorted(results):
            data, figure = results[slot]
            figures.append(figure)
            turns += [SessionTurn(index, turn, Sample(**sample)) for index, turn, sample in data]
        turns.sort(key=lambda t: (t.session, t.turn))
        shift = time.time() - time.perf_counter()
        window_unix = (window[0] + shift, window[1] + shift) if window is not None else None
        return SessionTrial(turns, window_unix, self._load(figures, len(plans)))

    def _send(self, process: Any, conn: Connection, message: Any) -> None:
        try:
            conn.send(message)
        except OSError:
            raise FanoutError(f"a worker process exited (exit code {process.exitcode})") from None

    def _receive(self, process: Any, conn: Connection, timeout_s: float) -> tuple[str, Any]:
        if not conn.poll(timeout_s):
            raise FanoutError(f"a worker process did not answer within {timeout_s:g} s")
        try:
            result: tuple[str, Any] = conn.recv()
        except EOFError:
            raise FanoutError(f"a worker process exited (exit code {process.exitcode})") from None
        return result

    def _load(self, figures: list[dict[str, Any]], streams: int) -> ClientLoad:
        sat = self.saturation
        lags = [lag for f in figures for lag in f["lags"]]
        delays = [d for f in figures for d in f["delays"]]
        chunks = sum(int(f["chunks"]) for f in figures)
        cpu = sum(float(f["cpu_s"]) for f in figures)
        parse = sum(float(f["parse_cpu_s"]) for f in figures)
        shares = [float(f["cpu_s"]) / float(f["wall_s"]) for f in figures if f["wall_s"] > 0]
        load = ClientLoad(
            processes=len(figures),
            streams=streams,
            wall_s=max((float(f["wall_s"]) for f in figures), default=0.0),
            cpu_s=cpu,
            chunks=chunks,
            cpu_per_chunk_us=1e6 * cpu / chunks if chunks else None,
            cpu_share_max=max(shares, default=0.0),
            parse_cpu_s=parse,
            parse_cpu_per_chunk_us=1e6 * parse / chunks if chunks else None,
            loop_lag_p50_s=_percentile(lags, 50),
            loop_lag_p99_s=_percentile(lags, 99),
            loop_lag_max_s=max(lags, default=0.0),
            timer_lag_p99_s=_percentile([lag for f in figures for lag in f["timer_lags"]], 99),
            schedule_delay_p50_s=_percentile(delays, 50),
            schedule_delay_max_s=max(delays, default=0.0),
        )
        if load.cpu_share_max > sat.max_cpu_share:
            load.reasons.append(f"a client process used {100 * load.cpu_share_max:.0f}% of a core")
        if load.loop_lag_p99_s > sat.max_loop_lag_s:
            load.reasons.append(f"event-loop lag p99 {1e3 * load.loop_lag_p99_s:.2f} ms")
        if load.schedule_delay_max_s > sat.max_schedule_delay_s:
            load.reasons.append(f"a request left {1e3 * load.schedule_delay_max_s:.1f} ms after its time")
        load.saturated = bool(load.reasons)
        return load
