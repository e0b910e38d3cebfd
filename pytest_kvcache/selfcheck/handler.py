"""HTTP handling of the `~pytest_kvcache.selfcheck.stream.StreamServer`: the threaded HTTP server, and the
request handler that answers each route and streams (or faults) a response on the pacer's deadlines."""

from __future__ import annotations

import contextlib
import json
import socket
import struct
import time
import traceback
import zlib
from collections.abc import Generator
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from socketserver import TCPServer
from typing import TYPE_CHECKING, Any, Protocol, cast

from pytest_kvcache.selfcheck.pacing import _SPIN_S, _Aborted
from pytest_kvcache.selfcheck.schedule import SCHEDULE_HEADER, Outcome, Schedule, ServedRequest, _dumps
from pytest_kvcache.selfcheck.vllm_output import (
    _default_error_message,
    _error_body,
    _frame,
    _int_or_none,
    _Run,
    _toy_tokenize,
)

if TYPE_CHECKING:
    import threading
    from collections.abc import Callable

    from pytest_kvcache.selfcheck.schedule import PromptCache


class Owner(Protocol):
    """What the handler reads of the server it answers for (``stream.StreamServer``): its settings, its records
    and its pacer. Declared here so that the handler needs no import of the server that builds it."""

    prompt_cache: PromptCache | None
    rejected_fields: frozenset[str]
    prompt_counter: Callable[[dict[str, Any]], int] | None
    logprob_shift: float
    enforce_max_model_len: bool
    unstreamed_delay_s: float
    count_prompt_tokens: bool
    disabled_paths: frozenset[str]
    model_name: str
    max_model_len: int
    _closing: threading.Event

    @property
    def schedule(self) -> Schedule: ...

    def _register(self, conn: socket.socket) -> None: ...

    def _unregister(self, conn: socket.socket) -> None: ...

    def _record_error(self, text: str) -> None: ...

    def _add_record(self, record: ServedRequest) -> None: ...

    def _finish_record(self, record: ServedRequest) -> None: ...

    def _pace(self, steps: Generator[float, None, Outcome], first_deadline: float) -> Outcome: ...

    def _started(self) -> None: ...

    def _stopped(self, run: _Run, record: ServedRequest, outcome: Outcome) -> None: ...

    def _models_body(self) -> dict[str, Any]: ...

    def _metrics_text(self) -> str: ...


_ENGINE_ERROR = "EngineCore encountered an issue (fault injected by StreamServer)"


class _Dropped(Exception):
    """The connection was dropped on purpose."""


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128

    def __init__(self, host: str, port: int, owner: Owner, reuse_port: bool = False) -> None:
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
    def _owner(self) -> Owner:
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
        if fault is not None and kind == "stop_early" and n_tokens > fault.after_chunks * schedule.tokens_per_chunk:
            n_tokens, finish_reason = fault.after_chunks * schedule.tokens_per_chunk, "stop"
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
            usage_tokens=fault.usage_tokens if fault is not None and kind in ("stop_early", "misreport") else None,
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


_GET_PATHS = frozenset({"/health", "/ping", "/version", "/v1/models", "/metrics"})


_POST_PATHS = frozenset({"/v1/chat/completions", "/v1/completions", "/tokenize"})
