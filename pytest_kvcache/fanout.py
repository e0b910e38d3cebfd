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
* after the trial the kept bytes are parsed line by line by `~pytest_kvcache.sample.TokenClock`, each line
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

import contextlib
import json
import math
import multiprocessing
import os
import time
from collections.abc import Mapping, Sequence
from multiprocessing.connection import Connection
from typing import Any
from urllib.parse import urlsplit

from pytest_kvcache import interrupt
from pytest_kvcache.client import Limits, check_counts, prompt_size
from pytest_kvcache.fanout_plan import (
    ClientLoad,
    Monitor,
    Saturation,
    SessionPlan,
    SessionTrial,
    SessionTurn,
    Trial,
    _Job,
    _SessionJob,
)
from pytest_kvcache.fanout_worker import _worker_main
from pytest_kvcache.sample import Sample


def _percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    k = min(len(ordered) - 1, max(0, math.ceil(q / 100.0 * len(ordered)) - 1))
    return ordered[k]


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
        headers: Mapping[str, str] | None = None,
        saturation: Saturation = Saturation(),  # noqa: B008 (a frozen dataclass)
        start_margin_s: float = 0.05,
        **limits: Any,
    ) -> None:
        """``limits``: the fields of :class:`~pytest_kvcache.client.Limits`, as the one-stream client takes them."""
        parts = urlsplit(base_url.rstrip("/"))
        if parts.scheme not in ("http", "https"):
            raise ValueError(f"the many-stream client speaks http and https, not {parts.scheme!r} ({base_url})")
        self.base_url = base_url.rstrip("/")
        self.tls = parts.scheme == "https"
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or (443 if self.tls else 80)
        self.path = parts.path.rstrip("/") + "/v1/chat/completions"
        self.processes = max(1, processes)
        self.limits = Limits(**limits)
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
        interrupt.check()
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
        refused = self._ready_then_go([worker for worker, _, _ in active])
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
                samples[i] = check_counts(Sample(**sample), payloads[i])
        return Trial([s if s is not None else Sample() for s in samples], self._load(figures, n))

    def _ready_then_go(self, workers: Sequence[tuple[Any, Connection]]) -> str | None:
        """Wait until every worker holding a part has connected, then start them together (``start_margin_s``
        from now); a refused connection stops them all instead, and is returned."""
        refused: str | None = None
        for process, conn in workers:
            status, value = self._receive(process, conn, self.limits.connect_timeout_s * 2 + 30)
            if status != "ready":
                raise FanoutError(f"fanout worker: {value}")
            refused = refused or value
        start = time.perf_counter() + self.start_margin_s
        for process, conn in workers:
            self._send(process, conn, ("go" if refused is None else "stop", start))
        return refused

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
        interrupt.check()
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
        refused = self._ready_then_go([worker for worker, _, _ in active])
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
        asked = [json.loads(plan.head + plan.turns[0] + plan.tail) for plan in plans]  # each session's bounds
        for slot in sorted(results):
            data, figure = results[slot]
            figures.append(figure)
            turns += [
                SessionTurn(index, turn, check_counts(Sample(**sample), asked[index])) for index, turn, sample in data
            ]
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
