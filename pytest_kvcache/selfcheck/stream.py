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
  `pytest_kvcache.testing.stream_faults`; it is defined here because it is a field of the `Schedule`
  wire format and its behaviour is interleaved with the pacing of every chunk);
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
import heapq
import http
import itertools
import json
import math
import socket
import struct
import threading
import time
import traceback
import uuid
import zlib
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from socketserver import TCPServer
from typing import Any, Literal, Protocol, cast, get_args

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

SCHEDULE_HEADER = "X-Stream-Schedule"
"""Request header holding a JSON `Schedule` (fields as in `Schedule`, ``fault`` as a nested object)."""

FaultKind = Literal["drop", "stall", "malformed", "http_error", "no_usage", "zero_tokens", "stream_error", "hang"]
RoleChunk = Literal["with_first", "early"]
Outcome = Literal[
    "pending", "ok", "http_error", "dropped", "stream_error", "malformed", "client_gone", "aborted", "hung"
]

_FAULT_KINDS: tuple[str, ...] = get_args(FaultKind)
_ROLE_CHUNKS: tuple[str, ...] = get_args(RoleChunk)

DEFAULT_CACHE_CONFIG_LABELS: dict[str, str] = {
    "block_size": "16",
    "cache_dtype": "auto",
    "enable_prefix_caching": "True",
    "kv_cache_size_tokens": "65536",
    "mamba_cache_dtype": "auto",
}
"""The labels of ``vllm:cache_config_info`` unless `StreamServer` is given others."""

_ENGINE_ERROR = "EngineCore encountered an issue (fault injected by StreamServer)"
_SPIN_S = 0.0002  # sleep until this long before a deadline, then spin (measured: docs/performance.md)
_POLL_S = 0.05  # serve_forever's poll interval: bounds how long close() waits for the accept loop
_JOIN_S = 5.0  # how long close() waits for each connection thread
_ERROR_TYPES: dict[int, str] = {
    400: "BadRequestError",
    401: "UnauthorizedError",
    404: "NotFoundError",
    405: "MethodNotAllowedError",
    413: "RequestEntityTooLargeError",
    422: "UnprocessableEntityError",
    429: "RateLimitError",
    500: "InternalServerError",
    501: "NotImplementedError",
    503: "ServiceUnavailableError",
}


class PromptCache(Protocol):
    """A model of an engine's prefix cache (the stand-in engine's KV capacity, ``testing.standin``): told each
    chat prompt (toy token ids) when it arrives, it says how many leading tokens it had cached and when the
    first token leaves (the request's TTFT, queueing behind other prefills included)."""

    def admit(self, tokens: Sequence[int], arrival_s: float) -> tuple[int, float]: ...

    def usage(self) -> float: ...


@dataclass(frozen=True)
class Fault:
    """A misbehaviour injected into a response.

    * ``drop``: after ``after_chunks`` token chunks, close the TCP connection abruptly -- no
      terminating chunk, no ``[DONE]``. With ``reset`` (the default) the close sends an RST
      (``SO_LINGER`` 0); without it, a plain FIN after ``shutdown``.
    * ``stall``: before token chunk ``after_chunks``, stop sending for ``stall_s``, then continue on
      the same spacing (every later deadline moves by ``stall_s``).
    * ``malformed``: after ``after_chunks`` token chunks, write ``data: {not json``, then continue.
    * ``stream_error``: after ``after_chunks`` token chunks, send vLLM's in-stream error event
      (``data: {"error": {...}}``) and ``[DONE]``, as vLLM does when the engine fails mid-request.
    * ``http_error``: answer at once with HTTP ``status`` and an OpenAI-style JSON error body; a 400
      says the prompt is over the model's context length, like vLLM's.
    * ``no_usage``: no ``usage`` anywhere in the response.
    * ``zero_tokens``: the role chunk, then a finish chunk (``finish_reason`` "length") and usage
      with ``completion_tokens`` 0.
    * ``hang``: take the request and send nothing -- no status line, no headers -- for ``stall_s``,
      then close the connection (a hung server; vLLM sends its headers at once).

    ``after_chunks`` at or past the number of token chunks fires after the last one, before the
    final usage chunk and ``[DONE]``. ``message`` replaces the default error message.
    """

    kind: FaultKind
    after_chunks: int = 0
    status: int = 500
    stall_s: float = 1.0
    message: str | None = None
    reset: bool = True

    def __post_init__(self) -> None:
        if self.kind not in _FAULT_KINDS:
            raise ValueError(f"Fault.kind must be one of {', '.join(_FAULT_KINDS)}; got {self.kind!r}")
        if self.after_chunks < 0:
            raise ValueError(f"Fault.after_chunks must be >= 0; got {self.after_chunks}")
        if not 100 <= self.status <= 599:
            raise ValueError(f"Fault.status must be an HTTP status code; got {self.status}")
        if self.stall_s < 0:
            raise ValueError(f"Fault.stall_s must be >= 0; got {self.stall_s}")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Fault:
        """Build a fault from a JSON object (unknown keys and wrong types raise `ValueError`)."""
        return cls(**_checked_kwargs(cls, data))


@dataclass(frozen=True)
class Schedule:
    """When and what the server sends for one generation request.

    Token chunk ``i`` is sent at ``arrival + ttft_s + i * itl_s``; each carries ``tokens_per_chunk``
    tokens (the last one possibly fewer). ``completion_tokens`` is replaced by the request's
    ``max_tokens`` (or ``max_completion_tokens``) when ``honor_max_tokens``; the finish reason is then
    "length", otherwise "stop". As vLLM does, the last token chunk carries the finish reason.

    ``role_chunk``: "with_first" sends the ``{"role": "assistant", "content": ""}`` chunk just before
    the first token chunk (vLLM's way); "early" sends it as soon as the request arrived.
    ``per_chunk_usage``: every chunk carries ``usage`` with the running ``completion_tokens``
    (vLLM's ``continuous_usage_stats``). ``final_usage``: after the last token chunk, a chunk with
    ``choices: []`` and the full usage. ``honor_stream_options``: additionally require the request's
    ``stream_options`` to ask for them (``include_usage``, ``continuous_usage_stats``), as vLLM does.
    ``empty_content``: token chunks carry ``content: ""`` (dummy-weight vLLM often does), so the
    token count shows only in usage.
    """

    ttft_s: float = 0.02
    itl_s: float = 0.002
    completion_tokens: int = 16
    honor_max_tokens: bool = True
    tokens_per_chunk: int = 1
    role_chunk: RoleChunk = "with_first"
    per_chunk_usage: bool = True
    final_usage: bool = True
    honor_stream_options: bool = False
    prompt_tokens: int = 32
    cached_tokens: int = 0
    empty_content: bool = False
    fault: Fault | None = None

    def __post_init__(self) -> None:
        if self.ttft_s < 0 or self.itl_s < 0:
            raise ValueError(f"ttft_s and itl_s must be >= 0; got {self.ttft_s}, {self.itl_s}")
        if self.completion_tokens < 0 or self.prompt_tokens < 0:
            raise ValueError("completion_tokens and prompt_tokens must be >= 0")
        if not 0 <= self.cached_tokens <= self.prompt_tokens:
            raise ValueError(
                f"cached_tokens must be between 0 and prompt_tokens ({self.prompt_tokens}); got {self.cached_tokens}"
            )
        if self.tokens_per_chunk < 1:
            raise ValueError(f"tokens_per_chunk must be >= 1; got {self.tokens_per_chunk}")
        if self.role_chunk not in _ROLE_CHUNKS:
            raise ValueError(f"role_chunk must be 'with_first' or 'early'; got {self.role_chunk!r}")

    def to_dict(self) -> dict[str, Any]:
        """The schedule as a JSON-ready dict (``fault`` nested, or None)."""
        return asdict(self)

    def to_header(self) -> dict[str, str]:
        """``{"X-Stream-Schedule": json}``: pass as request headers to use this schedule for one request."""
        return {SCHEDULE_HEADER: _dumps(self.to_dict())}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Schedule:
        """Build a schedule from a JSON object; missing fields take `Schedule`'s defaults."""
        kwargs = _checked_kwargs(cls, {k: v for k, v in data.items() if k != "fault"})
        fault = data.get("fault")
        if fault is not None:
            if not isinstance(fault, Mapping):
                raise ValueError(f"fault must be an object or null; got {fault!r}")
            kwargs["fault"] = Fault.from_dict(fault)
        return cls(**kwargs)

    @classmethod
    def from_json(cls, text: str) -> Schedule:
        """Parse the JSON text of an ``X-Stream-Schedule`` header."""
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"not JSON: {exc}") from exc
        if not isinstance(data, dict):
            raise ValueError("a schedule must be a JSON object")
        return cls.from_dict(data)


@dataclass(eq=False)
class ServedRequest:
    """One request as the server saw it.

    ``arrival_s`` is `time.perf_counter` when the request line had been read. ``chunk_times_s``
    holds the `time.perf_counter` after each write of the response body had returned: each SSE event
    (role, token, usage, malformed line, ``[DONE]`` together with the body's end) for a stream, the
    whole body otherwise. ``token_chunk_indices`` says which of those writes carried tokens, and
    ``token_deadlines_s`` when each of them was scheduled. All three stay empty for non-generation
    endpoints. Wait for `StreamServer.wait_finished` before reading a record a client just finished
    with: the server appends the last time just after the client may already have seen the bytes.
    """

    method: str
    path: str
    headers: dict[str, str]
    client_port: int
    arrival_s: float
    body: Any = None
    schedule: Schedule | None = None
    stream: bool = False
    status: int = 0
    outcome: Outcome = "pending"
    completion_tokens: int = 0
    chunk_times_s: list[float] = field(default_factory=list)
    token_chunk_indices: list[int] = field(default_factory=list)
    token_deadlines_s: list[float] = field(default_factory=list)
    finished_s: float | None = None

    @property
    def token_times_s(self) -> list[float]:
        """Send times of the chunks that carried tokens."""
        return [self.chunk_times_s[i] for i in self.token_chunk_indices]


class _Aborted(Exception):
    """The server is closing: stop the response where it stands."""


class _Dropped(Exception):
    """The connection was dropped on purpose."""


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128

    def __init__(self, host: str, port: int, owner: StreamServer, reuse_port: bool = False) -> None:
        self.owner = owner
        self.allow_reuse_port = reuse_port
        if ":" in host:
            self.address_family = socket.AF_INET6
        super().__init__((host, port), _Handler)

    def server_bind(self) -> None:
        # HTTPServer.server_bind resolves the host's FQDN, which can stall on a DNS lookup.
        TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name = str(host)
        self.server_port = int(port)

    def handle_error(self, request: Any, client_address: Any) -> None:
        self.owner._record_error(traceback.format_exc())


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # TCP_NODELAY on every accepted socket
    server_version = "streamserver"
    sys_version = ""

    _arrival_s: float = 0.0

    # --- plumbing -------------------------------------------------------------------------------

    @property
    def _owner(self) -> StreamServer:
        return cast(_HTTPServer, self.server).owner

    def handle(self) -> None:
        owner = self._owner
        owner._register(self.connection)
        try:
            super().handle()
        except (OSError, _Aborted, _Dropped):
            self.close_connection = True
        finally:
            owner._unregister(self.connection)

    def parse_request(self) -> bool:
        self._arrival_s = time.perf_counter()
        return super().parse_request()

    def log_message(self, format: str, *args: Any) -> None:
        pass  # quiet: tests read `StreamServer.requests`, not a log

    def _new_record(self, body: Any = None) -> ServedRequest:
        headers = dict(self.headers.items())
        record = ServedRequest(
            method=self.command,
            path=self.path,
            headers=headers,
            client_port=int(self.client_address[1]),
            arrival_s=self._arrival_s,
            body=body,
        )
        self._owner._add_record(record)
        return record

    def _finish(self, record: ServedRequest, outcome: Outcome) -> None:
        record.outcome = outcome
        record.finished_s = time.perf_counter()
        self._owner._finish_record(record)

    def _send_body(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _send_json(self, status: int, payload: Any) -> None:
        self._send_body(status, _dumps(payload).encode(), "application/json")

    def _send_error_json(self, status: int, message: str, param: str | None = None) -> None:
        self._send_json(status, _error_body(status, message, param))

    def _read_body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length > 0 else b""

    def _wait_until(self, deadline: float) -> None:
        closing = self._owner._closing
        while True:
            remaining = deadline - time.perf_counter()
            if remaining <= 0:
                return
            if remaining > _SPIN_S:
                if closing.wait(remaining - _SPIN_S):
                    raise _Aborted
            else:
                time.sleep(0)  # spin, but let other threads have the GIL

    def _drop(self, reset: bool) -> None:
        conn = self.connection
        with contextlib.suppress(OSError):
            if reset:
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            else:
                conn.shutdown(socket.SHUT_RDWR)
        self.rfile.close()  # the socket's file descriptor closes only once its makefile() is closed
        conn.close()
        self.close_connection = True
        raise _Dropped

    # --- routing --------------------------------------------------------------------------------

    def do_GET(self) -> None:
        record = self._new_record()
        owner = self._owner
        path = self.path.split("?", 1)[0]
        status = 200
        try:
            if path in owner.disabled_paths:
                status = 404
                self._send_json(404, {"detail": "Not Found"})
            elif path in ("/health", "/ping"):
                self._send_body(200, b"", "application/json")
            elif path == "/version":
                self._send_json(200, {"version": "0.0.0-streamserver"})
            elif path == "/v1/models":
                self._send_json(200, owner._models_body())
            elif path == "/metrics":
                text = owner._metrics_text().encode()
                self._send_body(200, text, "text/plain; version=0.0.4; charset=utf-8")
            else:
                status = 405 if path in _POST_PATHS else 404
                self._send_json(status, {"detail": "Method Not Allowed" if status == 405 else "Not Found"})
        finally:
            record.status = status
            self._finish(record, "ok")

    def do_HEAD(self) -> None:
        self.do_GET()

    def do_POST(self) -> None:
        raw = self._read_body()
        path = self.path.split("?", 1)[0]
        body: Any = None
        parse_error: str | None = None
        if raw:
            try:
                body = json.loads(raw)
            except ValueError as exc:
                parse_error = f"request body is not JSON: {exc}"
        record = self._new_record(body)
        if path not in _POST_PATHS or path in self._owner.disabled_paths:
            status = 405 if path in _GET_PATHS else 404
            self._send_json(status, {"detail": "Method Not Allowed" if status == 405 else "Not Found"})
            record.status = status
            self._finish(record, "ok")
            return
        if parse_error is not None or not isinstance(body, dict):
            self._send_error_json(400, parse_error or "request body must be a JSON object")
            record.status = 400
            self._finish(record, "http_error")
            return
        options = body.get("stream_options")
        sent = set(body) | (set(options) if isinstance(options, dict) else set())
        if unsupported := sorted(sent & self._owner.rejected_fields):
            self._send_error_json(400, f"unsupported request field(s): {', '.join(unsupported)}")
            record.status = 400
            self._finish(record, "http_error")
            return
        if path == "/tokenize":
            tokens = _toy_tokenize(body)
            owner = self._owner
            self._send_json(
                200,
                {
                    "count": len(tokens),
                    "max_model_len": owner.max_model_len,
                    "tokens": tokens,
                    "token_strs": None,
                },
            )
            record.status = 200
            self._finish(record, "ok")
            return
        self._generate(record, body, chat=path == "/v1/chat/completions")

    # --- generation -----------------------------------------------------------------------------

    def _generate(self, record: ServedRequest, body: dict[str, Any], chat: bool) -> None:
        owner = self._owner
        header = self.headers.get(SCHEDULE_HEADER)
        try:
            schedule = Schedule.from_json(header) if header is not None else owner.schedule
        except (ValueError, TypeError) as exc:
            self._send_error_json(400, f"invalid {SCHEDULE_HEADER} header: {exc}")
            record.status = 400
            self._finish(record, "http_error")
            return
        if owner.count_prompt_tokens:
            counter = owner.prompt_counter
            prompt_tokens = counter(body) if counter is not None else len(_toy_tokenize(body))
            schedule = replace(
                schedule, prompt_tokens=prompt_tokens, cached_tokens=min(schedule.cached_tokens, prompt_tokens)
            )
        if owner.prompt_cache is not None and chat:
            ids = _toy_tokenize(body)
            cached, ttft_s = owner.prompt_cache.admit(ids, record.arrival_s)
            schedule = replace(schedule, prompt_tokens=len(ids), cached_tokens=cached, ttft_s=ttft_s)
        record.schedule = schedule
        model = body.get("model")
        if model is not None and model != owner.model_name:
            self._send_error_json(404, f"The model `{model}` does not exist.", "model")
            record.status = 404
            self._finish(record, "http_error")
            return

        fault = schedule.fault
        kind = fault.kind if fault is not None else None
        n_tokens = schedule.completion_tokens
        limit_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
        wanted = schedule.prompt_tokens + (limit_tokens if isinstance(limit_tokens, int) else 0)
        if chat and owner.enforce_max_model_len and owner.count_prompt_tokens and wanted > owner.max_model_len:
            self._send_error_json(400, _default_error_message(400, owner.max_model_len, wanted))
            record.status = 400
            self._finish(record, "http_error")
            return
        finish_reason = "stop"
        if schedule.honor_max_tokens:
            limit = body.get("max_completion_tokens", body.get("max_tokens"))
            if isinstance(limit, int) and not isinstance(limit, bool) and limit >= 0:
                n_tokens, finish_reason = limit, "length"
        if kind == "zero_tokens":
            n_tokens, finish_reason = 0, "length"
        stream = body.get("stream") is True
        record.stream = stream

        if fault is not None and kind == "hang":
            try:
                self._wait_until(time.perf_counter() + fault.stall_s)
            finally:
                self._finish(record, "hung")
            self._drop(reset=False)

        if fault is not None and kind == "http_error":
            self._send_error_json(
                fault.status,
                fault.message
                or _default_error_message(fault.status, owner.max_model_len, schedule.prompt_tokens + n_tokens),
            )
            record.status = fault.status
            self._finish(record, "http_error")
            return

        per_chunk_usage = schedule.per_chunk_usage
        final_usage = schedule.final_usage
        if schedule.honor_stream_options:
            options = body.get("stream_options") or {}
            include = isinstance(options, dict) and options.get("include_usage") is True
            continuous = isinstance(options, dict) and options.get("continuous_usage_stats") is True
            final_usage = final_usage and include
            per_chunk_usage = per_chunk_usage and include and continuous
        if kind == "no_usage":
            per_chunk_usage = final_usage = False

        top_logprobs = body.get("top_logprobs")
        run = _Run(
            chat=chat,
            model=owner.model_name,
            schedule=schedule,
            n_tokens=n_tokens,
            finish_reason=finish_reason,
            per_chunk_usage=per_chunk_usage,
            final_usage=final_usage if stream else kind != "no_usage",
            logprobs=chat and body.get("logprobs") is True,
            top_logprobs=top_logprobs if isinstance(top_logprobs, int) and not isinstance(top_logprobs, bool) else 0,
            token_ids=body.get("return_tokens_as_token_ids") is True,
            prompt_hash=zlib.crc32(",".join(map(str, _toy_tokenize(body))).encode()),
            prompt_ids=tuple(_toy_tokenize(body)) if not chat and "prompt_logprobs" in body else (),
            prompt_logprobs=_int_or_none(body.get("prompt_logprobs")) if not chat else None,
            logprob_shift=owner.logprob_shift,
        )
        owner._started()
        outcome: Outcome = "aborted"
        try:
            outcome = self._stream(record, run) if stream else self._respond_whole(record, run)
        except _Dropped:
            outcome = "dropped"
            raise
        except (BrokenPipeError, ConnectionResetError, ConnectionAbortedError):
            outcome = "client_gone"
            self.close_connection = True
        except _Aborted:
            outcome = "aborted"
            raise
        finally:
            owner._stopped(run, record, outcome)
            self._finish(record, outcome)

    def _write_event(self, record: ServedRequest, data: str, *, last: bool = False) -> None:
        self._write_frame(record, _frame(data, last=last))

    def _write_frame(self, record: ServedRequest, frame: bytes) -> None:
        self.wfile.write(frame)
        record.chunk_times_s.append(time.perf_counter())

    def _stream(self, record: ServedRequest, run: _Run) -> Outcome:
        """Send the headers here, then hand the stream to the server's `_Pacer` and wait until it is done."""
        steps = self._stream_steps(record, run)
        try:
            first_deadline = next(steps)
        except StopIteration as stop:
            outcome: Outcome = stop.value
            return outcome
        return self._owner._pace(steps, first_deadline)

    def _stream_steps(self, record: ServedRequest, run: _Run) -> Generator[float, None, Outcome]:
        """The stream as steps: each ``yield`` is a deadline, the code after it runs when the deadline is due.

        The next frame is rendered before its deadline is yielded, so that at the deadline only the write is
        left to do.
        """
        schedule = run.schedule
        fault = schedule.fault
        arrival = record.arrival_s
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        record.status = 200

        if run.chat and schedule.role_chunk == "early":
            self._write_event(record, run.role_chunk())
        sizes = run.chunk_sizes()
        n_chunks = len(sizes)
        fire_at = -1
        if fault is not None and fault.kind in ("drop", "stall", "malformed", "stream_error"):
            fire_at = min(fault.after_chunks, n_chunks)
        shift = 0.0
        sent = 0
        outcome: Outcome = "ok"
        for i in range(n_chunks + 1):
            deadline = arrival + schedule.ttft_s + i * schedule.itl_s + shift
            if i == fire_at and fault is not None:
                if i < n_chunks or n_chunks == 0:
                    yield deadline
                if fault.kind == "drop":
                    self._drop(fault.reset)
                elif fault.kind == "stall":
                    yield time.perf_counter() + fault.stall_s
                    shift += fault.stall_s
                    deadline += fault.stall_s
                elif fault.kind == "malformed":
                    self._write_event(record, "{not json")
                    outcome = "malformed"
                else:  # stream_error
                    message = fault.message or _ENGINE_ERROR
                    self._write_event(record, _dumps(_error_body(500, message)))
                    self._write_event(record, "[DONE]", last=True)
                    return "stream_error"
            if i == n_chunks:
                break
            role = _frame(run.role_chunk()) if i == 0 and run.chat and schedule.role_chunk == "with_first" else None
            first = sent
            token = _frame(run.token_chunk(first, first + sizes[i], last=i == n_chunks - 1))
            yield deadline
            if role is not None:
                self._write_frame(record, role)
            sent += sizes[i]
            record.token_deadlines_s.append(deadline)
            record.token_chunk_indices.append(len(record.chunk_times_s))
            self._write_frame(record, token)
            record.completion_tokens = sent
        if n_chunks == 0:
            # nothing generated: the role chunk and a finish chunk, when the first token would have come
            yield arrival + schedule.ttft_s + shift
            if run.chat and schedule.role_chunk == "with_first":
                self._write_event(record, run.role_chunk())
            self._write_event(record, run.token_chunk(0, 0, last=True))
        if run.final_usage:
            self._write_event(record, run.usage_chunk(sent))
        self._write_event(record, "[DONE]", last=True)
        return outcome

    def _respond_whole(self, record: ServedRequest, run: _Run) -> Outcome:
        schedule = run.schedule
        fault = schedule.fault
        n_chunks = len(run.chunk_sizes())
        done_at = record.arrival_s + schedule.ttft_s + max(n_chunks - 1, 0) * schedule.itl_s
        done_at += self._owner.unstreamed_delay_s
        if fault is not None and fault.kind == "stall":
            done_at += fault.stall_s
        self._wait_until(done_at)
        if fault is not None and fault.kind == "drop":
            self._drop(fault.reset)
        if fault is not None and fault.kind == "stream_error":
            message = fault.message or _ENGINE_ERROR
            self._send_error_json(500, message)
            record.status = 500
            record.chunk_times_s.append(time.perf_counter())
            return "stream_error"
        if fault is not None and fault.kind == "malformed":
            self._send_body(200, b"{not json", "application/json")
            record.status = 200
            record.chunk_times_s.append(time.perf_counter())
            return "malformed"
        record.token_deadlines_s.append(done_at)
        record.token_chunk_indices.append(0)
        self._send_json(200, run.whole_response())
        record.status = 200
        record.chunk_times_s.append(time.perf_counter())
        record.completion_tokens = run.n_tokens
        return "ok"


_VOCAB = 151936  # Qwen3's vocabulary size: "token_id:N" ids stay below it
_ID_STRIDE = 7919  # token k's id: (crc32 of the prompt's words + k * _ID_STRIDE) mod _VOCAB
_ALT_STRIDE = 104729  # offset of the j-th top_logprobs alternative's id
_GET_PATHS = frozenset({"/health", "/ping", "/version", "/v1/models", "/metrics"})
_POST_PATHS = frozenset({"/v1/chat/completions", "/v1/completions", "/tokenize"})


@dataclass
class _Run:
    """The response being produced for one generation request."""

    chat: bool
    model: str
    schedule: Schedule
    n_tokens: int
    finish_reason: str
    per_chunk_usage: bool
    final_usage: bool
    logprobs: bool = False
    top_logprobs: int = 0
    token_ids: bool = False
    prompt_hash: int = 0
    prompt_ids: tuple[int, ...] = ()
    prompt_logprobs: int | None = None
    logprob_shift: float = 0.0
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    created: int = field(default_factory=lambda: int(time.time()))
    _head: str | None = field(default=None, init=False, repr=False)

    def chunk_sizes(self) -> list[int]:
        size = self.schedule.tokens_per_chunk
        return [min(size, self.n_tokens - start) for start in range(0, self.n_tokens, size)]

    def token_text(self, k: int) -> str:
        return "" if self.schedule.empty_content else f" tok{k}"

    def text(self, first: int, end: int) -> str:
        return "".join(self.token_text(k) for k in range(first, end))

    def _token(self, k: int, alternative: int = 0) -> str:
        if self.token_ids:
            return f"token_id:{(self.prompt_hash + _ID_STRIDE * k + _ALT_STRIDE * alternative) % _VOCAB}"
        return self.token_text(k) if alternative == 0 else f" alt{alternative}"

    def logprobs_content(self, first: int, end: int) -> dict[str, Any] | None:
        """vLLM's chat ``logprobs`` for tokens ``first`` .. ``end - 1``; None unless the request asked."""
        if not self.logprobs:
            return None
        entries = []
        for k in range(first, end):
            logprob = -0.01 * (k % 7)
            top = [
                {"token": self._token(k, j), "logprob": logprob - float(j), "bytes": None}
                for j in range(self.top_logprobs)
            ]
            entries.append({"token": self._token(k), "logprob": logprob, "bytes": None, "top_logprobs": top})
        return {"content": entries}

    def prompt_logprobs_content(self) -> list[dict[str, Any] | None]:
        """vLLM's ``prompt_logprobs``: None for position 0, then ``{"<id>": {logprob, rank, decoded_token}}``
        with the prompt's own token and the top-k. Deterministic in (token, position); ``logprob_shift``
        moves every logprob by up to ±shift × ln(1 + position / 1000): a lossy arm whose error grows with
        depth (a stand-in for what a KV dtype does, which real vLLM cannot be made to do on cue)."""
        out: list[dict[str, Any] | None] = [None]
        k = self.prompt_logprobs or 0
        for p in range(1, len(self.prompt_ids)):
            token = self.prompt_ids[p]
            wobble = self.logprob_shift * math.log1p(p / 1000) * (((p * 2654435761) % 7) - 3) / 3
            entry: dict[str, Any] = {}
            for j in range(k):
                alt = (token * 31 + (j + 1) * _ALT_STRIDE + p) % 4096
                entry[str(alt)] = {"logprob": -1.5 - 0.5 * j + wobble, "rank": j + 1, "decoded_token": f"t{alt}"}
            if str(token) not in entry:
                own = -2.0 - ((token * 7919 + p) % 1000) / 250 + wobble
                entry[str(token)] = {"logprob": own, "rank": k + 1 + (token + p) % 50, "decoded_token": f"t{token}"}
            out.append(entry)
        return out

    def usage(self, completion_tokens: int) -> dict[str, Any]:
        prompt = self.schedule.prompt_tokens
        return {
            "prompt_tokens": prompt,
            "total_tokens": prompt + completion_tokens,
            "completion_tokens": completion_tokens,
            "prompt_tokens_details": {"cached_tokens": self.schedule.cached_tokens},
        }

    def _envelope(self, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "id": f"chatcmpl-{self.request_id}" if self.chat else f"cmpl-{self.request_id}",
            "object": "chat.completion.chunk" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }

    def role_chunk(self) -> str:
        chunk = self._envelope(
            [
                {
                    "index": 0,
                    "delta": {"role": "assistant", "content": ""},
                    "logprobs": None,
                    "finish_reason": None,
                }
            ]
        )
        if self.per_chunk_usage:
            chunk["usage"] = self.usage(0)
        return _dumps(chunk)

    def token_chunk(self, first: int, end: int, *, last: bool) -> str:
        if self.chat and not last and not self.logprobs:
            return self._plain_token_chunk(first, end)
        choice: dict[str, Any]
        text = self.text(first, end)
        if self.chat:
            choice = {
                "index": 0,
                "delta": {"content": text},
                "logprobs": self.logprobs_content(first, end),
                "finish_reason": None,
            }
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": None, "stop_reason": None}
        if last:
            choice["finish_reason"] = self.finish_reason
            choice["stop_reason"] = None
        chunk = self._envelope([choice])
        if self.per_chunk_usage:
            chunk["usage"] = self.usage(end)
        return _dumps(chunk)

    def _plain_token_chunk(self, first: int, end: int) -> str:
        """`token_chunk` for a chat chunk that is neither the last nor carries logprobs, byte for byte.

        The pacer renders one of these per token: pasting the envelope (serialized once) and the usage
        numbers into fixed text takes a third of the time of serializing the whole chunk.
        """
        if self._head is None:
            envelope = _dumps(self._envelope([]))
            self._head = envelope[: -len("[]}")]
        content = json.dumps(self.text(first, end))
        body = f'[{{"index":0,"delta":{{"content":{content}}},"logprobs":null,"finish_reason":null}}]'
        if not self.per_chunk_usage:
            return f"{self._head}{body}}}"
        prompt, cached = self.schedule.prompt_tokens, self.schedule.cached_tokens
        usage = (
            f'{{"prompt_tokens":{prompt},"total_tokens":{prompt + end},"completion_tokens":{end},'
            f'"prompt_tokens_details":{{"cached_tokens":{cached}}}}}'
        )
        return f'{self._head}{body},"usage":{usage}}}'

    def usage_chunk(self, completion_tokens: int) -> str:
        chunk = self._envelope([])
        chunk["usage"] = self.usage(completion_tokens)
        return _dumps(chunk)

    def whole_response(self) -> dict[str, Any]:
        text = self.text(0, self.n_tokens)
        choice: dict[str, Any]
        if self.chat:
            choice = {
                "index": 0,
                "message": {"role": "assistant", "content": text, "tool_calls": []},
                "logprobs": self.logprobs_content(0, self.n_tokens),
                "finish_reason": self.finish_reason,
                "stop_reason": None,
            }
        else:
            choice = {
                "index": 0,
                "text": text,
                "logprobs": None,
                "finish_reason": self.finish_reason,
                "stop_reason": None,
            }
            if self.prompt_logprobs is not None:
                choice["prompt_logprobs"] = self.prompt_logprobs_content()
        response = self._envelope([choice])
        response["object"] = "chat.completion" if self.chat else "text_completion"
        if self.final_usage:
            response["usage"] = self.usage(self.n_tokens)
        return response


class _Job:
    """One stream handed to the `_Pacer`: its steps, and how it ended."""

    def __init__(self, steps: Generator[float, None, Outcome]) -> None:
        self.steps = steps
        self.done = threading.Event()
        self.outcome: Outcome = "aborted"
        self.error: BaseException | None = None

    def finish(self, outcome: Outcome | None = None, error: BaseException | None = None) -> None:
        if outcome is not None:
            self.outcome = outcome
        self.error = error
        self.done.set()


class _Pacer:
    """One thread that sends the chunks of every stream in flight, each on its deadline.

    A thread per stream that sleeps and then spins to each deadline (the first design) costs a core's worth
    of spinning once a few dozen streams run at sub-millisecond spacing, and that core is taken from the
    client being measured. Here one thread keeps the deadlines in a heap, sleeps on a condition until
    `_SPIN_S` before the earliest, yields the GIL in a short spin to it, and then writes every frame that is
    due. A late deadline (the machine was busy) is sent at once; the send time is recorded either way.

    Writes block: a client that stops reading long enough to fill its socket buffers (hundreds of KB on
    loopback) holds up every stream until it reads again or goes away -- the calibrated stream is for
    clients that read.
    """

    def __init__(self, closing: threading.Event, name: str) -> None:
        self._closing = closing
        self._heap: list[tuple[float, int, _Job]] = []
        self._order = itertools.count()
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, job: _Job, deadline: float) -> None:
        with self._cond:
            if self._closing.is_set():
                job.finish(error=_Aborted())
                return
            heapq.heappush(self._heap, (deadline, next(self._order), job))
            if self._heap[0][2] is job:
                self._cond.notify()

    def wake(self) -> None:
        """Make the thread notice `closing`."""
        with self._cond:
            self._cond.notify()

    def join(self, timeout_s: float) -> None:
        self._thread.join(timeout_s)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._closing.is_set():
                    if not self._heap:
                        self._cond.wait(_POLL_S)
                        continue
                    remaining = self._heap[0][0] - time.perf_counter()
                    if remaining <= _SPIN_S:
                        break
                    self._cond.wait(remaining - _SPIN_S)
                if self._closing.is_set():
                    pending = [job for _, _, job in self._heap]
                    self._heap.clear()
                    for job in pending:
                        job.steps.close()
                        job.finish(error=_Aborted())
                    return
                deadline = self._heap[0][0]
            while time.perf_counter() < deadline:
                time.sleep(0)  # spin, but let the connection threads have the GIL
            with self._cond:
                now = time.perf_counter()
                due: list[_Job] = []
                while self._heap and self._heap[0][0] <= now:
                    due.append(heapq.heappop(self._heap)[2])
            for job in due:
                self._step(job)

    def _step(self, job: _Job) -> None:
        try:
            deadline = job.steps.send(None)
        except StopIteration as stop:
            job.finish(outcome=stop.value)
        except BaseException as exc:  # handed to the connection thread, which raises it
            job.finish(error=exc)
        else:
            self.submit(job, deadline)


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
        schedule: Schedule = Schedule(),
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


# --- helpers ---------------------------------------------------------------------------------------


def _dumps(payload: Any) -> str:
    """Compact JSON, as vLLM's pydantic models and FastAPI's JSONResponse write it."""
    return json.dumps(payload, separators=(",", ":"))


def _frame(data: str, *, last: bool = False) -> bytes:
    """One SSE event as an HTTP/1.1 chunk (and, for the last, the terminating zero-length chunk)."""
    payload = f"data: {data}\n\n".encode()
    frame = f"{len(payload):x}\r\n".encode() + payload + b"\r\n"
    return frame + b"0\r\n\r\n" if last else frame


def _labels(labels: Mapping[str, str]) -> str:
    def escape(value: str) -> str:
        return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')

    return ",".join(f'{key}="{escape(value)}"' for key, value in labels.items())


def _error_body(status: int, message: str, param: str | None = None) -> dict[str, Any]:
    return {
        "error": {
            "message": message,
            "type": _ERROR_TYPES.get(status, _phrase(status).replace(" ", "") + "Error"),
            "param": param,
            "code": status,
        }
    }


def _default_error_message(status: int, max_model_len: int, requested_tokens: int) -> str:
    if status == 400:
        requested = max(requested_tokens, max_model_len + 1)
        return (
            f"This model's maximum context length is {max_model_len} tokens. However, you requested "
            f"{requested} tokens. Please reduce the length of the messages or completion. "
            "(fault injected by StreamServer)"
        )
    return f"{_phrase(status)} (fault injected by StreamServer)"


def _phrase(status: int) -> str:
    try:
        return http.HTTPStatus(status).phrase
    except ValueError:
        return "Error"


def _words(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield from value.split()
    elif isinstance(value, list):
        for part in value:
            if isinstance(part, dict):
                yield from _words(part.get("text"))
            else:
                yield from _words(part)


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _toy_tokenize(body: Mapping[str, Any]) -> list[int]:
    """A toy tokenizer: one token per whitespace-separated word (ids are CRC32s mod 4096)."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return [int(t) for t in prompt]
    if prompt is not None:
        words = list(_words(prompt))
    else:
        words = []
        for message in body.get("messages") or []:
            if isinstance(message, dict):
                words.extend(_words(message.get("content")))
    return [zlib.crc32(word.encode()) % 4096 for word in words]


def _checked_kwargs(cls: type[Any], data: Mapping[str, Any]) -> dict[str, Any]:
    """Keyword arguments for a dataclass from JSON: unknown keys and wrong types raise ValueError."""
    known = {f.name: f for f in fields(cls)}
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise ValueError(f"unknown {cls.__name__} field(s): {', '.join(unknown)}")
    kwargs: dict[str, Any] = {}
    for name, value in data.items():
        annotation = str(known[name].type)
        if annotation == "bool":
            ok = isinstance(value, bool)
        elif annotation == "int":
            ok = isinstance(value, int) and not isinstance(value, bool)
        elif annotation == "float":
            ok = isinstance(value, int | float) and not isinstance(value, bool)
            value = float(value) if ok else value
        elif annotation == "str | None":
            ok = value is None or isinstance(value, str)
        else:  # Literal aliases: checked by __post_init__
            ok = isinstance(value, str)
        if not ok:
            raise ValueError(f"{cls.__name__}.{name}: {value!r} is not a valid {annotation}")
        kwargs[name] = value
    return kwargs
