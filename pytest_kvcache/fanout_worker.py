"""The worker side of `~pytest_kvcache.fanout.Fanout`: one process, one event loop (uvloop when installed),
its share of a trial's streams or of a capacity run's sessions, timed on the hot path by a protocol's
``data_received`` and parsed after the trial (see `pytest_kvcache.fanout` for the design)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import signal
import socket
import ssl
import time
import traceback
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from multiprocessing.connection import Connection
from typing import Any

from pytest_kvcache.client import Limits, error_text, prompt_size
from pytest_kvcache.fanout_plan import TICK_S, SessionPlan, _Job, _SessionJob
from pytest_kvcache.sample import ErrorKind, Sample, TokenClock


async def until(perf_s: float) -> None:
    """Wait until the perf counter reaches ``perf_s``: asleep until 2 ms before it (the loop's timers have millisecond
    resolution), then spinning, so every worker's window, and every request, starts within microseconds of its time."""
    wait = perf_s - time.perf_counter()
    if wait > 0.002:
        await asyncio.sleep(wait - 0.002)
    while time.perf_counter() < perf_s:
        pass


async def watched(
    start_perf_s: float, watch: Callable[[float], Coroutine[Any, Any, None]], work: Callable[[], Awaitable[object]]
) -> tuple[float, float, float]:
    """From the shared start, ``work`` with ``watch`` (the lag samples and the stall and timeout checks, given the
    window's start) beside it until the work ends; (window start, end, CPU s)."""
    await until(start_perf_s)
    cpu0 = time.process_time()
    begin = time.perf_counter()
    watchdog = asyncio.get_running_loop().create_task(watch(begin))
    await work()
    end = time.perf_counter()
    cpu = time.process_time() - cpu0
    watchdog.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await watchdog
    return begin, end, cpu


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
        return await watched(start_perf_s, self._watch, lambda: self._send_all(start_perf_s))

    async def _send_all(self, start_perf_s: float) -> None:
        offsets = self.job.offsets_s
        pending = sorted(range(len(self.streams)), key=lambda k: offsets[k])
        for k in pending:
            due = start_perf_s + offsets[k]
            await until(due)
            self.streams[k].send(due)
        await asyncio.gather(*(s.done for s in self.streams if s.done is not None))

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
                    # both limits passed while the loop was late: no headers at all is a hung server, as the
                    # headers timer (due as early or earlier) would have said had it run first
                    limit = s.headers_limit_s
                    hung = limit is not None and not s.headers_seen and now - s.send_perf_s >= limit
                    s.fail("no_response" if hung else "first_token_timeout")
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
        await until(due)
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
        warm = asyncio.Semaphore(max(1, self.sessions_job.warm_concurrency))
        sessions = self.sessions_job.sessions
        return await watched(
            start_perf_s,
            self._watch,
            lambda: asyncio.gather(*(self._session(i, p, start_perf_s, warm) for i, p in sessions)),
        )

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
