"""Measure the measurer: the measuring client's own error and overhead against a calibrated stream.

A `~pytest_kvcache.selfcheck.stream.StreamServer` sends every token chunk on a scripted deadline and records
when each chunk actually left (`time.perf_counter`, CLOCK_MONOTONIC on Linux: one clock for every process
on the machine). The client records when it sent the request and when it saw the first and last token
(`~pytest_kvcache.sample.Sample`, with ``send_perf_s`` absolute). Comparing the two gives the harness's
error on this machine, per request (`StreamTiming`):

* TTFT error: the client's TTFT (send → first token seen) minus the server's TTFT (request arrived → first
  token sent). It is everything the harness and the transport add: the request's way in (``send_lag``)
  plus the first token's way out (``first_lag``), parsing included.
* decode-TPS error: the client's ``(n − 1) / (last − first)`` against the same formula over the server's
  send times of the first and last token chunk, in %.
* ITL error: mean gap between token chunks as the client saw them minus the gap the server sent.
* client CPU per chunk: CPU time of the client's thread (`time.thread_time`) over the request, divided by
  the SSE chunks it parsed: the client's own cost per chunk, which must stay well under the inter-token
  time it measures (`overhead_warning`).

`run_self_check` is the short check run at the start of a test session; ``benchmarks/harness.py`` uses the
same pieces for the full benchmark (``docs/performance.md``). Library code: no pytest here.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import platform
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from multiprocessing.connection import Connection
from typing import Any, Literal

import numpy as np

from pytest_kvcache.client import Client
from pytest_kvcache.sample import Sample
from pytest_kvcache.selfcheck.schedule import Schedule, ServedRequest
from pytest_kvcache.selfcheck.stream import StreamServer

#: The report warns when the client's own time per chunk exceeds this share of the measured inter-token time.
OVERHEAD_WARN_SHARE = 0.02

#: The quick check's stream: 200 tokens, one per chunk, 1 ms apart, after a 20 ms TTFT (~0.22 s a request).
#: 1 ms is faster than any single stream a real engine decodes at in this project (the embedded CPU model
#: runs ~5-20 ms a token, GPU decode of real models ~3-30 ms), so overhead measured here bounds the overhead
#: at real rates from above; a 199 ms decode window makes a 50 µs timing jitter a 0.03% rate error.
QUICK_SCHEDULE = Schedule(ttft_s=0.02, itl_s=0.001, completion_tokens=200)
QUICK_REQUESTS = 5
#: The full check (``--kv-self-check``): 20 requests of 500 tokens, same spacing (~10 s).
FULL_SCHEDULE = Schedule(ttft_s=0.02, itl_s=0.001, completion_tokens=500)
FULL_REQUESTS = 20

ServerMode = Literal["thread", "process"]


# --------------------------------------------------------------------------------------------- timings


@dataclass(frozen=True)
class StreamTiming:
    """One streamed request, as the client measured it and as the server sent it (seconds, tokens/s)."""

    tokens: int
    token_chunks: int
    ttft_true_s: float
    ttft_measured_s: float
    decode_tps_true: float | None
    decode_tps_measured: float | None
    itl_true_s: float | None
    itl_measured_s: float | None
    send_lag_s: float
    first_lag_s: float
    last_lag_s: float
    server_lateness_s: float
    client_cpu_s: float | None = None
    client_chunks: int = 0

    @property
    def ttft_error_s(self) -> float:
        return self.ttft_measured_s - self.ttft_true_s

    @property
    def ttft_error_pct(self) -> float | None:
        return 100.0 * self.ttft_error_s / self.ttft_true_s if self.ttft_true_s > 0 else None

    @property
    def decode_tps_error_pct(self) -> float | None:
        if self.decode_tps_true is None or self.decode_tps_measured is None:
            return None
        return 100.0 * (self.decode_tps_measured / self.decode_tps_true - 1.0)

    @property
    def itl_error_s(self) -> float | None:
        if self.itl_true_s is None or self.itl_measured_s is None:
            return None
        return self.itl_measured_s - self.itl_true_s

    @property
    def cpu_per_chunk_s(self) -> float | None:
        if self.client_cpu_s is None or self.client_chunks <= 0:
            return None
        return self.client_cpu_s / self.client_chunks

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.update(
            ttft_error_s=self.ttft_error_s,
            ttft_error_pct=self.ttft_error_pct,
            decode_tps_error_pct=self.decode_tps_error_pct,
            itl_error_s=self.itl_error_s,
            cpu_per_chunk_s=self.cpu_per_chunk_s,
        )
        return data


def compare(
    record: ServedRequest,
    *,
    send_perf_s: float,
    first_perf_s: float,
    last_perf_s: float,
    completion_tokens: int,
    client_cpu_s: float | None = None,
    client_chunks: int = 0,
) -> StreamTiming:
    """Line up one client measurement (absolute `time.perf_counter` readings) with the server's record.

    Works for any client stack: it needs only when the request was sent and when the first and the last
    token chunk were seen. Raises `ValueError` when the record carries no token chunk.
    """
    sent = record.token_times_s
    if not sent:
        raise ValueError(f"{record.method} {record.path}: the server sent no token chunk")
    n_chunks = len(sent)
    true_window = sent[-1] - sent[0]
    measured_window = last_perf_s - first_perf_s
    decode_true = decode_measured = itl_true = itl_measured = None
    if completion_tokens >= 2 and n_chunks >= 2 and true_window > 0:
        decode_true = (completion_tokens - 1) / true_window
        itl_true = true_window / (n_chunks - 1)
        itl_measured = measured_window / (n_chunks - 1)
        if measured_window > 0:
            decode_measured = (completion_tokens - 1) / measured_window
    lateness = [s - d for s, d in zip(sent, record.token_deadlines_s, strict=False)]
    return StreamTiming(
        tokens=completion_tokens,
        token_chunks=n_chunks,
        ttft_true_s=sent[0] - record.arrival_s,
        ttft_measured_s=first_perf_s - send_perf_s,
        decode_tps_true=decode_true,
        decode_tps_measured=decode_measured,
        itl_true_s=itl_true,
        itl_measured_s=itl_measured,
        send_lag_s=record.arrival_s - send_perf_s,
        first_lag_s=first_perf_s - sent[0],
        last_lag_s=last_perf_s - sent[-1],
        server_lateness_s=float(np.median(lateness)) if lateness else 0.0,
        client_cpu_s=client_cpu_s,
        client_chunks=client_chunks,
    )


def compare_sample(sample: Sample, record: ServedRequest, client_cpu_s: float | None = None) -> StreamTiming:
    """`compare` for a `Sample` of our own client (which must be ok and have ``send_perf_s`` set)."""
    if not sample.ok or sample.first_token_s is None or sample.last_token_s is None:
        raise ValueError(f"sample failed: {sample.error_kind}: {sample.error}")
    return compare(
        record,
        send_perf_s=sample.send_perf_s,
        first_perf_s=sample.send_perf_s + sample.first_token_s,
        last_perf_s=sample.send_perf_s + sample.last_token_s,
        completion_tokens=sample.completion_tokens or 0,
        client_cpu_s=client_cpu_s,
        client_chunks=sample.chunks,
    )


def summarize(values: Iterable[float | None]) -> dict[str, float | int | None]:
    """``n``, ``median``, ``p95`` (of the signed values) and ``p95_abs`` (of their magnitude); None if empty."""
    data = np.array([v for v in values if v is not None and np.isfinite(v)], dtype=float)
    if data.size == 0:
        return {"n": 0, "median": None, "p95": None, "p95_abs": None}
    return {
        "n": int(data.size),
        "median": float(np.median(data)),
        "p95": float(np.percentile(data, 95)),
        "p95_abs": float(np.percentile(np.abs(data), 95)),
    }


def summarize_timings(timings: Sequence[StreamTiming]) -> dict[str, dict[str, float | int | None]]:
    """Per metric (in the unit its name says) median / p95 over requests."""

    def scaled(values: Iterable[float | None], factor: float) -> list[float | None]:
        return [None if v is None else v * factor for v in values]

    return {
        "ttft_error_ms": summarize(scaled((t.ttft_error_s for t in timings), 1e3)),
        "ttft_error_pct": summarize(t.ttft_error_pct for t in timings),
        "decode_tps_error_pct": summarize(t.decode_tps_error_pct for t in timings),
        "itl_error_us": summarize(scaled((t.itl_error_s for t in timings), 1e6)),
        "cpu_per_chunk_us": summarize(scaled((t.cpu_per_chunk_s for t in timings), 1e6)),
        "wall_overhead_per_chunk_us": summarize(scaled((t.last_lag_s for t in timings), 1e6)),
        "send_lag_us": summarize(scaled((t.send_lag_s for t in timings), 1e6)),
        "first_lag_us": summarize(scaled((t.first_lag_s for t in timings), 1e6)),
        "server_lateness_us": summarize(scaled((t.server_lateness_s for t in timings), 1e6)),
    }


# --------------------------------------------------------------------------------------------- driving


def chat_payload(tokens: int, tag: str) -> dict[str, Any]:
    """A streamed chat request for ``tokens`` tokens, tagged (``user``) so its server record can be found."""
    return {
        "model": "stream-test",
        "messages": [{"role": "user", "content": "self-check"}],
        "max_tokens": tokens,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        "user": tag,
    }


def match_records(records: Iterable[ServedRequest]) -> dict[str, ServedRequest]:
    """Generation records by the ``user`` tag of their request body."""
    found: dict[str, ServedRequest] = {}
    for record in records:
        if isinstance(record.body, dict) and isinstance(record.body.get("user"), str):
            found[record.body["user"]] = record
    return found


def stream_with_client(url: str, schedule: Schedule, tags: Sequence[str]) -> list[tuple[str, Sample, float]]:
    """Stream one request per tag, one after another over one connection, with our `Client`.

    Returns (tag, sample, CPU seconds of this thread during the request) per tag.
    """
    results: list[tuple[str, Sample, float]] = []
    with Client(url, request_timeout_s=60.0, stall_timeout_s=30.0, headers=schedule.to_header()) as client:
        for tag in tags:
            cpu0 = time.thread_time()
            sample = client.stream_chat(chat_payload(schedule.completion_tokens, tag))
            results.append((tag, sample, time.thread_time() - cpu0))
    return results


class ServerProcess:
    """A `StreamServer` in a child process, so that its threads do not share the measuring client's GIL.

    Send times stay comparable: the child records `time.perf_counter` (CLOCK_MONOTONIC, system-wide).
    `records` fetches the child's `ServedRequest` list over a pipe.
    """

    def __init__(
        self,
        schedule: Schedule | None = None,
        host: str = "127.0.0.1",
        ready_timeout_s: float = 30.0,
        *,
        port: int = 0,
        reuse_port: bool = False,
    ) -> None:
        self.schedule = schedule or Schedule()
        self.host = host
        self.port = port
        self.reuse_port = reuse_port
        self.ready_timeout_s = ready_timeout_s
        self._conn: Connection | None = None
        self._process: Any = None
        self.url = ""
        self._lock = threading.Lock()

    def start(self) -> ServerProcess:
        ctx = multiprocessing.get_context("spawn")
        parent, child = ctx.Pipe()
        self._process = ctx.Process(
            target=_serve_in_child,
            args=(child, self.schedule.to_dict(), self.host, self.port, self.reuse_port),
            name="streamserver",
            daemon=True,
        )
        self._process.start()
        child.close()
        self._conn = parent
        if not parent.poll(self.ready_timeout_s):
            self.close()
            raise RuntimeError(f"the StreamServer process did not start within {self.ready_timeout_s} s")
        try:
            self.url = str(parent.recv())
        except EOFError:
            self.close()
            raise RuntimeError("the StreamServer process exited before it served (see its stderr)") from None
        return self

    def _call(self, command: str, arg: Any = None) -> Any:
        if self._conn is None:
            raise RuntimeError("ServerProcess is not started")
        with self._lock:
            self._conn.send((command, arg))
            status, value = self._conn.recv()
        if status == "error":
            raise RuntimeError(f"StreamServer process: {value}")
        return value

    def records(self, count: int, timeout_s: float = 10.0) -> list[ServedRequest]:
        """Every record, once ``count`` of them have finished (see `StreamServer.wait_finished`)."""
        result: list[ServedRequest] = self._call("records", (count, timeout_s))
        return result

    def finished(self) -> int:
        """How many recorded requests have finished so far."""
        return int(self._call("finished"))

    def clear(self) -> None:
        self._call("clear")

    def cpu_s(self) -> float:
        """CPU time the server process has used so far (user + system, all its threads)."""
        return float(self._call("cpu"))

    def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(OSError, EOFError):
                self._call("stop")
            self._conn.close()
            self._conn = None
        if self._process is not None:
            self._process.join(5.0)
            if self._process.is_alive():
                self._process.kill()
                self._process.join(5.0)
            self._process = None

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


class ServerPool:
    """Several `ServerProcess` children on one port (SO_REUSEPORT): the kernel spreads the connections
    among them, so a many-stream benchmark is served by ``processes`` cores, not one. Same interface."""

    def __init__(self, processes: int = 1, schedule: Schedule | None = None, host: str = "127.0.0.1") -> None:
        self.processes = max(1, processes)
        self.schedule = schedule
        self.host = host
        self.servers: list[ServerProcess] = []
        self.url = ""

    def start(self) -> ServerPool:
        try:
            first = ServerProcess(self.schedule, self.host, reuse_port=self.processes > 1).start()
            self.servers.append(first)
            port = int(first.url.rsplit(":", 1)[1])
            for _ in range(self.processes - 1):
                self.servers.append(ServerProcess(self.schedule, self.host, port=port, reuse_port=True).start())
        except BaseException:
            self.close()
            raise
        self.url = first.url
        return self

    def records(self, count: int, timeout_s: float = 10.0) -> list[ServedRequest]:
        """Every server's records, once ``count`` requests have finished among them."""
        if len(self.servers) == 1:
            return self.servers[0].records(count, timeout_s)
        deadline = time.monotonic() + timeout_s
        while sum(s.finished() for s in self.servers) < count:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{count} finished requests not seen within {timeout_s} s")
            time.sleep(0.02)
        return [r for s in self.servers for r in s.records(0, timeout_s)]

    def clear(self) -> None:
        for server in self.servers:
            server.clear()

    def cpu_s(self) -> float:
        """CPU time all the server processes have used so far."""
        return sum(server.cpu_s() for server in self.servers)

    def close(self) -> None:
        for server in self.servers:
            server.close()
        self.servers = []

    def __enter__(self) -> ServerPool:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def _serve_in_child(conn: Connection, schedule: dict[str, Any], host: str, port: int, reuse_port: bool) -> None:
    """The child's side of `ServerProcess`: serve, and answer commands until told to stop."""
    with StreamServer(Schedule.from_dict(schedule), host=host, port=port, reuse_port=reuse_port) as server:
        conn.send(server.url)
        while True:
            try:
                command, arg = conn.recv()
            except EOFError:
                return
            try:
                if command == "stop":
                    conn.send(("ok", None))
                    return
                if command == "records":
                    count, timeout_s = arg
                    conn.send(("ok", server.wait_finished(count, timeout_s)))
                elif command == "finished":
                    conn.send(("ok", sum(r.finished_s is not None for r in server.requests)))
                elif command == "clear":
                    server.clear_requests()
                    conn.send(("ok", None))
                elif command == "cpu":
                    conn.send(("ok", time.process_time()))
                else:
                    conn.send(("error", f"unknown command {command!r}"))
            except Exception as exc:  # reported to the parent, which raises
                conn.send(("error", f"{type(exc).__name__}: {exc}"))


# --------------------------------------------------------------------------------------------- the check


def machine_facts() -> dict[str, Any]:
    """What the figures depend on: cores, load, Python, platform."""
    try:
        load: list[float] | None = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        load = None
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count() or 0
    return {
        "cpu_count": os.cpu_count(),
        "usable_cpus": usable,
        "load_avg": load,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_model": _cpu_model(),
    }


def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def run_self_check(
    *,
    quick: bool = True,
    schedule: Schedule | None = None,
    requests: int | None = None,
    server: ServerMode = "thread",
) -> dict[str, Any]:
    """Stream from a calibrated `StreamServer` on loopback with our `Client`; return the client's error and overhead.

    ``quick`` (the default at the start of every run): `QUICK_REQUESTS` requests on `QUICK_SCHEDULE`, about
    1.5 s; otherwise `FULL_REQUESTS` on `FULL_SCHEDULE`. One short warm-up request (connection setup, first
    use of the code paths) is not counted. ``server`` "thread" serves from this process (what the session
    does: no child process to spawn), "process" from a child process (no GIL shared with the client).

    The result is JSON-ready: ``schedule``, ``n``, ``failed``, ``metrics`` (per metric ``median``/``p95``),
    ``overhead_per_chunk_s`` (the client's median CPU time per chunk: what `overhead_warning` compares with
    the inter-token time), ``measured_itl_s``, ``machine``, ``duration_s``.
    """
    started = time.perf_counter()
    schedule = schedule or (QUICK_SCHEDULE if quick else FULL_SCHEDULE)
    count = requests if requests is not None else (QUICK_REQUESTS if quick else FULL_REQUESTS)
    if count < 1:
        raise ValueError(f"requests must be >= 1; got {count}")
    warmup = Schedule(ttft_s=0.0, itl_s=0.0, completion_tokens=4)
    tags = [f"selfcheck-{i}" for i in range(count)]
    fetch: Callable[[int], list[ServedRequest]]
    with contextlib.ExitStack() as stack:
        if server == "process":
            proc = stack.enter_context(ServerProcess(schedule))
            url, fetch = proc.url, proc.records
        else:
            srv = stack.enter_context(StreamServer(schedule))
            url, fetch = srv.url, srv.wait_finished
        stream_with_client(url, warmup, ["selfcheck-warmup"])
        results = stream_with_client(url, schedule, tags)
        try:
            records = match_records(fetch(count + 1))
        except TimeoutError:  # a request the server never finished: compare what there is
            records = match_records(fetch(0))
    timings: list[StreamTiming] = []
    failures: list[str] = []
    for tag, sample, cpu in results:
        if not sample.ok:
            failures.append(f"{tag}: {sample.error_kind}: {sample.error}")
            continue
        try:
            timings.append(compare_sample(sample, records[tag], cpu))
        except (KeyError, ValueError) as exc:
            failures.append(f"{tag}: {exc}")
    metrics = summarize_timings(timings)
    cpu_median = metrics["cpu_per_chunk_us"]["median"]
    overhead = None if cpu_median is None else float(cpu_median) / 1e6
    itl = summarize(t.itl_measured_s for t in timings)["median"]
    return {
        "client": "pytest_kvcache.client.Client (stdlib http.client, kept-alive, synchronous, one stream)",
        "server": server,
        "schedule": schedule.to_dict(),
        "n": len(timings),
        "failed": failures,
        "metrics": metrics,
        "overhead_per_chunk_s": overhead,
        "measured_itl_s": itl,
        "overhead_share_of_itl": None if overhead is None or not itl else overhead / float(itl),
        "machine": machine_facts(),
        "duration_s": time.perf_counter() - started,
        "requests": [t.to_dict() for t in timings],
    }


def overhead_warning(self_check: dict[str, Any], measured_itl_s: float) -> str | None:
    """A warning sentence when the client's own time per chunk exceeds 2% of the measured inter-token time."""
    overhead = self_check.get("overhead_per_chunk_s")
    if not isinstance(overhead, int | float) or measured_itl_s <= 0:
        return None
    share = overhead / measured_itl_s
    if share <= OVERHEAD_WARN_SHARE:
        return None
    return (
        f"the measuring client spends {overhead * 1e6:.0f} µs of CPU per streamed chunk on this machine, "
        f"{100 * share:.1f}% of the measured inter-token time ({measured_itl_s * 1e3:.2f} ms; warn above "
        f"{100 * OVERHEAD_WARN_SHARE:.0f}%): inter-token and decode figures may carry client overhead"
    )
