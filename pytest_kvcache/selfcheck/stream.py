"""A small OpenAI-compatible streaming server that plays a scripted schedule exactly.

`StreamServer` speaks the slice of vLLM's OpenAI server that pytest-kvcache's measuring client
uses -- ``POST /v1/chat/completions`` (streamed as server-sent events, or not), ``POST
/v1/completions``, ``GET /v1/models``, ``GET /version``, ``GET /health``, ``GET /metrics``,
``POST /tokenize`` -- with the same wire format vLLM sends, but it generates nothing: each
response follows a `Schedule`. The first token chunk leaves at ``arrival + ttft_s``, chunk ``i``
at ``arrival + ttft_s + i * itl_s`` (absolute deadlines), and every chunk's send time is recorded in
`StreamServer.requests`. One pacer thread sends the chunks of every stream in flight: it sleeps until
0.2 ms before the earliest deadline, spins to it, and writes a frame rendered in advance -- so that 32
streams at sub-millisecond spacing cost one thread's work, not 32 spinning threads taken from the
client being measured (``docs/performance.md`` has the measurements).

A chat request with ``"logprobs": true`` gets vLLM-shaped ``logprobs.content`` entries, one per
generated token (deterministic values; ``top_logprobs`` alternatives; ``"token_id:N"`` tokens when it
sets ``return_tokens_as_token_ids``). A completion with ``"prompt_logprobs": K`` over token ids gets
vLLM-shaped ``prompt_logprobs`` (deterministic; moved by ``logprob_shift`` for a lossy arm).

It exists for two jobs, and is a stand-in for vLLM only there:

* tests use it to produce what real vLLM cannot be made to produce on demand -- a connection dropped
  mid-stream, a stall, a malformed SSE line, an injected HTTP error, a stream without usage, a request
  that generates no token (see `Fault`, whose public home for tests is
  `pytest_kvcache.testing.stream_faults`; it is defined in :mod:`.schedule` because it is a field of the
  `Schedule` wire format, and played here, interleaved with the pacing of every chunk);
* the accuracy check uses it as a calibrated stream: because the server knows when each token left,
  the measuring client's own overhead is the difference between what it measured and
  `ServedRequest.token_deadlines_s` / `ServedRequest.chunk_times_s`.

Everything a real engine can do is measured on real vLLM, never here. ``/tokenize`` is a toy
tokenizer (one token per whitespace-separated word), and ``usage`` reports the schedule's
``prompt_tokens``/``cached_tokens``, not anything computed from the prompt.

A request may carry its own schedule as JSON in the ``X-Stream-Schedule`` header (see
`Schedule.to_header`); it replaces the server's default schedule for that request only.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable, Generator, Mapping
from typing import Any

from pytest_kvcache.selfcheck.handler import _HTTPServer
from pytest_kvcache.selfcheck.pacing import _POLL_S, _Aborted, _Job, _Pacer
from pytest_kvcache.selfcheck.schedule import DEFAULT_CACHE_CONFIG_LABELS as DEFAULT_CACHE_CONFIG_LABELS
from pytest_kvcache.selfcheck.schedule import SCHEDULE_HEADER as SCHEDULE_HEADER
from pytest_kvcache.selfcheck.schedule import Fault as Fault
from pytest_kvcache.selfcheck.schedule import FaultKind as FaultKind
from pytest_kvcache.selfcheck.schedule import Outcome as Outcome
from pytest_kvcache.selfcheck.schedule import PromptCache as PromptCache
from pytest_kvcache.selfcheck.schedule import RoleChunk as RoleChunk
from pytest_kvcache.selfcheck.schedule import Schedule as Schedule
from pytest_kvcache.selfcheck.schedule import ServedRequest as ServedRequest
from pytest_kvcache.selfcheck.vllm_output import _Run

#: a user's tests serve the calibrated stream from here (docs/testing.md): the schedule's names come with it
__all__ = [
    "DEFAULT_CACHE_CONFIG_LABELS",
    "SCHEDULE_HEADER",
    "Fault",
    "FaultKind",
    "Outcome",
    "PromptCache",
    "RoleChunk",
    "Schedule",
    "ServedRequest",
    "StreamServer",
]

_JOIN_S = 5.0  # how long close() waits for each connection thread


class StreamServer:
    """An OpenAI-compatible HTTP server that answers on a `Schedule`; see the module docstring.

    Use as a context manager (or `start` / `close`)::

        with StreamServer(Schedule(ttft_s=0.1)) as server:
            httpx.post(f"{server.url}/v1/chat/completions", json={...})
            record = server.wait_finished(1)[0]

    Connections are HTTP/1.1 keep-alive; streamed bodies use chunked transfer encoding, so one
    client connection serves request after request. ``cache_config_labels`` are the labels of
    ``vllm:cache_config_info`` in ``/metrics``.
    """

    def __init__(
        self,
        schedule: Schedule = Schedule(),  # noqa: B008 (a frozen dataclass)
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        model_name: str = "stream-test",
        max_model_len: int = 8192,
        cache_config_labels: Mapping[str, str] | None = None,
        count_prompt_tokens: bool = False,
        disabled_paths: frozenset[str] = frozenset(),
        unstreamed_delay_s: float = 0.0,
        enforce_max_model_len: bool = False,
        advertise_max_model_len: bool = True,
        logprob_shift: float = 0.0,
        rejected_fields: frozenset[str] = frozenset(),
        prompt_counter: Callable[[dict[str, Any]], int] | None = None,
        reuse_port: bool = False,
        prompt_cache: PromptCache | None = None,
    ) -> None:
        #: A prefix-cache model that decides each chat request's cached tokens and TTFT (and adds the KV usage
        #: gauge to ``/metrics``); None: the schedule's.
        self.prompt_cache = prompt_cache
        #: Bind with SO_REUSEPORT: several servers (processes) on one port share its connections, so a
        #: benchmark's streams are served by more than one core.
        self.reuse_port = reuse_port
        #: Request fields (top level or in ``stream_options``) answered with HTTP 400, as a strict server
        #: that does not take them would: a test then fails whenever the plugin sends one.
        self.rejected_fields = rejected_fields
        #: Counts a chat request's ``usage.prompt_tokens`` (with ``count_prompt_tokens``) instead of the toy
        #: tokenizer, e.g. with the model's real tokenizer and chat template.
        self.prompt_counter = prompt_counter
        #: How far ``prompt_logprobs`` move from the deterministic base values (see ``_Run``).
        self.logprob_shift = logprob_shift
        #: Answer a chat request whose prompt (toy-tokenized) plus ``max_tokens`` exceeds ``max_model_len``
        #: with vLLM's HTTP 400, as a real server does (needs ``count_prompt_tokens``).
        self.enforce_max_model_len = enforce_max_model_len
        #: Whether ``/v1/models`` carries ``max_model_len`` (servers other than vLLM often do not).
        self.advertise_max_model_len = advertise_max_model_len
        #: Extra seconds before a non-streamed response (a server slow or stuck on such requests).
        self.unstreamed_delay_s = unstreamed_delay_s
        #: Report ``usage.prompt_tokens`` as the toy tokenizer's count of the request (as /tokenize does)
        #: instead of the schedule's fixed number.
        self.count_prompt_tokens = count_prompt_tokens
        #: POST paths answered 404, like a server without them (e.g. ``{"/tokenize"}``).
        self.disabled_paths = disabled_paths
        self.host = host
        self.port = port
        self.model_name = model_name
        self.max_model_len = max_model_len
        self.cache_config_labels: dict[str, str] = dict(
            DEFAULT_CACHE_CONFIG_LABELS if cache_config_labels is None else cache_config_labels
        )
        self._schedule = schedule
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._records: list[ServedRequest] = []
        self._errors: list[str] = []
        self._connections: dict[socket.socket, threading.Thread] = {}
        self._closing = threading.Event()
        self._pacer: _Pacer | None = None
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._running = 0
        self._success: dict[str, int] = {"length": 0, "stop": 0}
        self._prompt_tokens_total = 0
        self._generation_tokens_total = 0
        self._prefix_queries_total = 0
        self._prefix_hits_total = 0

    # --- lifecycle --------------------------------------------------------------------------------

    def start(self) -> StreamServer:
        """Bind and serve on a daemon thread; cleans up after itself if that fails."""
        if self._httpd is not None:
            raise RuntimeError("StreamServer already started")
        try:
            self._closing.clear()
            httpd = _HTTPServer(self.host, self.port, self, self.reuse_port)
            self._httpd = httpd
            self.port = int(httpd.server_address[1])
            self._pacer = _Pacer(self._closing, name=f"streamserver-pacer:{self.port}")
            self._thread = threading.Thread(
                target=httpd.serve_forever,
                kwargs={"poll_interval": _POLL_S},
                name=f"streamserver:{self.port}",
                daemon=True,
            )
            self._thread.start()
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        """Stop serving: end the accept loop, cut every open connection, close the socket."""
        httpd, thread, pacer = self._httpd, self._thread, self._pacer
        self._closing.set()
        if pacer is not None:
            pacer.wake()
        if httpd is not None and thread is not None and thread.is_alive():
            httpd.shutdown()
        with self._lock:
            connections = list(self._connections.items())
        for conn, _ in connections:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        for _, handler_thread in connections:
            if handler_thread is not threading.current_thread():
                handler_thread.join(_JOIN_S)
        if httpd is not None:
            httpd.server_close()
        if thread is not None:
            thread.join(_JOIN_S)
        if pacer is not None:
            pacer.join(_JOIN_S)
        self._httpd = None
        self._thread = None
        self._pacer = None

    def __enter__(self) -> StreamServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def url(self) -> str:
        """``http://HOST:PORT`` of the running server (a wildcard host reads as loopback)."""
        if self._httpd is None:
            raise RuntimeError("StreamServer is not started")
        host = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}.get(self.host, self.host)
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{self.port}"

    # --- schedule and records -----------------------------------------------------------------

    @property
    def schedule(self) -> Schedule:
        """The default schedule (a request's ``X-Stream-Schedule`` header overrides it)."""
        with self._lock:
            return self._schedule

    def set_schedule(self, schedule: Schedule) -> None:
        """Replace the default schedule for requests that arrive from now on."""
        with self._lock:
            self._schedule = schedule

    @property
    def requests(self) -> list[ServedRequest]:
        """A snapshot of every request so far (all endpoints), oldest first."""
        with self._lock:
            return list(self._records)

    @property
    def errors(self) -> list[str]:
        """Tracebacks of unexpected exceptions in connection threads (normally empty)."""
        with self._lock:
            return list(self._errors)

    def clear_requests(self) -> None:
        with self._lock:
            self._records.clear()

    def wait_finished(self, count: int, timeout_s: float = 5.0) -> list[ServedRequest]:
        """Wait until ``count`` recorded requests have finished; return all records.

        Raises `TimeoutError` with what was seen if that does not happen within ``timeout_s``.
        """
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while sum(r.finished_s is not None for r in self._records) < count:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    seen = [(r.method, r.path, r.outcome) for r in self._records]
                    raise TimeoutError(f"{count} finished requests not seen within {timeout_s} s: {seen}")
                self._changed.wait(remaining)
            return list(self._records)

    # --- called by connection threads -----------------------------------------------------------

    def _register(self, conn: socket.socket) -> None:
        with self._lock:
            self._connections[conn] = threading.current_thread()

    def _unregister(self, conn: socket.socket) -> None:
        with self._lock:
            self._connections.pop(conn, None)

    def _record_error(self, text: str) -> None:
        with self._lock:
            self._errors.append(text)

    def _add_record(self, record: ServedRequest) -> None:
        with self._lock:
            self._records.append(record)

    def _finish_record(self, record: ServedRequest) -> None:
        with self._changed:
            self._changed.notify_all()

    def _pace(self, steps: Generator[float, None, Outcome], first_deadline: float) -> Outcome:
        """Run a stream's remaining steps on the pacer thread; return its outcome or raise what it raised."""
        pacer = self._pacer
        if pacer is None:
            steps.close()
            raise _Aborted
        job = _Job(steps)
        pacer.submit(job, first_deadline)
        job.done.wait()
        if job.error is not None:
            raise job.error
        return job.outcome

    def _started(self) -> None:
        with self._lock:
            self._running += 1

    def _stopped(self, run: _Run, record: ServedRequest, outcome: Outcome) -> None:
        with self._lock:
            self._running -= 1
            if outcome in ("ok", "malformed"):
                self._success[run.finish_reason] = self._success.get(run.finish_reason, 0) + 1
                self._prompt_tokens_total += run.schedule.prompt_tokens
                self._generation_tokens_total += record.completion_tokens
                self._prefix_queries_total += run.schedule.prompt_tokens
                self._prefix_hits_total += run.schedule.cached_tokens

    # --- endpoint bodies -----------------------------------------------------------------------

    def _models_body(self) -> dict[str, Any]:
        return {
            "object": "list",
            "data": [
                {
                    "id": self.model_name,
                    "object": "model",
                    "created": int(time.time()),
                    "owned_by": "vllm",
                    "root": self.model_name,
                    "parent": None,
                    "max_model_len": self.max_model_len if self.advertise_max_model_len else None,
                    "permission": [],
                }
            ],
        }

    def _metrics_text(self) -> str:
        with self._lock:
            running = self._running
            success = dict(self._success)
            prompt, generation = self._prompt_tokens_total, self._generation_tokens_total
            queries, hits = self._prefix_queries_total, self._prefix_hits_total
        base = {"engine": "0", "model_name": self.model_name}
        lines: list[str] = []

        def family(name: str, kind: str, help_text: str, samples: list[tuple[dict[str, str], float]]) -> None:
            lines.append(f"# HELP {name} {help_text}")
            lines.append(f"# TYPE {name} {kind}")
            lines.extend(f"{name}{{{_labels(labels)}}} {float(value)!r}" for labels, value in samples)

        family(
            "vllm:cache_config_info",
            "gauge",
            "Information of the LLMEngine CacheConfig",
            [(self.cache_config_labels, 1.0)],
        )
        family(
            "vllm:num_requests_running",
            "gauge",
            "Number of requests in model execution batches.",
            [(base, running)],
        )
        family(
            "vllm:request_success_total",
            "counter",
            "Count of successfully processed requests.",
            [({**base, "finished_reason": reason}, n) for reason, n in sorted(success.items())],
        )
        family("vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.", [(base, prompt)])
        family(
            "vllm:generation_tokens_total",
            "counter",
            "Number of generation tokens processed.",
            [(base, generation)],
        )
        family(
            "vllm:prefix_cache_queries_total",
            "counter",
            "Prefix cache queries, in terms of number of queried tokens.",
            [(base, queries)],
        )
        family(
            "vllm:prefix_cache_hits_total",
            "counter",
            "Prefix cache hits, in terms of number of cached tokens.",
            [(base, hits)],
        )
        if self.prompt_cache is not None:
            family("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.", [
                (base, self.prompt_cache.usage())
            ])  # fmt: skip
            family("vllm:num_preemptions_total", "counter", "Cumulative number of preemption.", [(base, 0.0)])
        return "\n".join(lines) + "\n"


def _labels(labels: Mapping[str, str]) -> str:
    def escape(value: str) -> str:
        return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')

    return ",".join(f'{key}="{escape(value)}"' for key, value in labels.items())
