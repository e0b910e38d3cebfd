"""The measuring client: one streamed chat completion → one :class:`Sample`.

It knows nothing of arms, probes or reports. Timing model (``docs/metrics.md``):

* ``send`` — the instant the pre-encoded request is handed to the HTTP stack;
* ``first`` — the first chunk whose running ``usage.completion_tokens`` reaches 1 (vLLM with
  ``continuous_usage_stats``; llama-server's ``timings.predicted_n`` with ``timings_per_token``); from a
  server without per-chunk counts, the first chunk that carries
  content, reasoning or a tool-call delta. A role-only chunk never counts;
* ``last`` — the last chunk that raised the token count (or carried content, in the fallback);
* ``end`` — the ``[DONE]`` line.

Every failure (HTTP error, dropped stream, stall, timeout, malformed JSON, missing usage, zero tokens, token
counts that disagree) is returned as a failed Sample with a reason, never raised.

Every finished stream's token counts are compared (`count_problem`): what the request asked for (``max_tokens``,
and what ``ignore_eos`` / ``min_tokens`` force), what the stream counted as it came, and what the final usage
reports.

The measured stream goes over the standard library's ``http.client`` on a kept-alive connection: of the
stacks measured against a calibrated stream (docs/performance.md: httpx, the openai SDK, aiohttp,
``http.client``), it adds the least time between send and first token and costs the least CPU per chunk
for one stream per thread. The unmeasured calls (``/metrics``, ``/tokenize`` …) use httpx.
"""

from __future__ import annotations

import http.client
import json
import socket
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal
from urllib.parse import urlsplit

import httpx

from pytest_kvcache.metrics import catalogue

ErrorKind = Literal[
    "http_error",
    "connection_error",
    "dropped",
    "stall",
    "timeout",
    "malformed_json",
    "server_error",
    "missing_usage",
    "zero_tokens",
    "no_token_clock",
    "engine_died",
    "first_token_timeout",
    "no_response",
    "token_count",
]

#: A conservative characters-per-token for sizing the first-token limit when the prompt's token count is
#: not known (BPE tokenizers give ~4 for English text and code; fewer chars per token means a longer limit).
CHARS_PER_TOKEN = 3.0

#: A decode window shorter than this share of the request's wall time voids ``decode_tps``.
MIN_DECODE_WINDOW_SHARE = 0.05

#: Tokens the final usage may count beyond the stream's last running count: a stop token (EOS is counted and
#: has no text), or a character still incomplete UTF-8 when the length limit ends it (llama-server holds such
#: bytes back to its finish chunk, which carries no running count; a character is at most 4 bytes).
UNSTREAMED_TAIL = 3


@dataclass
class Sample:
    """What one streamed request measured. Times are seconds after ``send`` (perf counter)."""

    ok: bool = False
    error_kind: str | None = None
    error: str | None = None
    http_status: int | None = None
    send_unix_s: float = 0.0
    #: `time.perf_counter` at ``send`` (absolute): lines the sample up with another clock reading, e.g. the send
    #: times a `~pytest_kvcache.selfcheck.stream.StreamServer` records (CLOCK_MONOTONIC is system-wide on Linux).
    send_perf_s: float = 0.0
    first_token_s: float | None = None
    last_token_s: float | None = None
    end_s: float | None = None
    chunks: int = 0
    token_chunks: int = 0
    #: tokens the first token chunk carried (running ``usage.completion_tokens``): more than 1 when a
    #: speculative step landed in it; the decode rate counts only the tokens after it
    first_chunk_tokens: int | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    #: the request's ``max_completion_tokens`` or ``max_tokens``: a correct server never reports more
    requested_tokens: int | None = None
    #: the completion tokens the request forces: all of ``max_tokens`` with ``ignore_eos``, else ``min_tokens``
    promised_tokens: int | None = None
    #: what the stream counted as it came: the last running ``usage.completion_tokens`` (usage clock), or the
    #: chunks that carried content (content clock: chunks, not tokens)
    streamed_tokens: int | None = None
    finish_reason: str | None = None
    token_clock: Literal["usage", "content"] | None = None
    content_chars: int = 0
    text: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)

    def fail(self, kind: ErrorKind, message: str) -> Sample:
        self.ok = False
        self.error_kind = kind
        self.error = message
        return self

    # ---------------------------------------------------------------- derived metrics

    def measures(self) -> tuple[dict[str, float | None], list[str], dict[str, str]]:
        """Return (metrics, flags, voided): metric values, sample flags, and metric → reason it was voided."""
        metrics: dict[str, float | None] = dict.fromkeys(catalogue.names("client"))
        flags: list[str] = []
        voided: dict[str, str] = {}
        if self.error_kind == "token_count":
            flags.append("token_count")
        if not self.ok or self.first_token_s is None or self.end_s is None or not self.completion_tokens:
            return metrics, flags, voided
        if self.token_clock == "content":
            flags.append("content_clock")
        ttft = self.first_token_s
        metrics["ttft_s"] = ttft
        if self.end_s > 0:
            metrics["wall_tps"] = self.completion_tokens / self.end_s
        if self.prompt_tokens is not None and ttft > 0:
            metrics["prefill_tps"] = (self.prompt_tokens - (self.cached_tokens or 0)) / ttft
        last = self.last_token_s if self.last_token_s is not None else ttft
        window = last - ttft
        if self.completion_tokens < 2:
            voided["decode_tps"] = "single_token"
        elif window <= 0:
            flags.append("no_decode_window")
            voided["decode_tps"] = "no_decode_window"
        elif window < MIN_DECODE_WINDOW_SHARE * self.end_s:
            flags.append("decode_window_short")
            voided["decode_tps"] = "decode_window_short"
        else:
            # the tokens that arrived after the first token chunk, over the time they took: with speculative
            # decoding a chunk carries several tokens, the first one included
            first = self.first_chunk_tokens if self.token_clock == "usage" and self.first_chunk_tokens else 1
            metrics["decode_tps"] = (self.completion_tokens - first) / window
        return metrics, flags, voided

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        if not data["text"]:
            data.pop("text")
        if not data["tool_calls"]:
            data.pop("tool_calls")
        return data


def _error_message(response: http.client.HTTPResponse) -> str:
    return error_text(response.read(4000), str(response.reason))


def error_text(body_bytes: bytes, reason: str = "") -> str:
    """The message of an HTTP error body (OpenAI's ``{"error": {"message": …}}`` and its variants)."""
    body = body_bytes[:4000].decode("utf-8", "replace")
    try:
        parsed = json.loads(body)
    except json.JSONDecodeError:
        return body.strip() or reason
    if isinstance(parsed, dict):
        err = parsed.get("error", parsed)
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
        if isinstance(err, str):
            return err
        if parsed.get("message"):
            return str(parsed["message"])
    return body.strip()


def token_bounds(payload: Mapping[str, Any]) -> tuple[int | None, int | None]:
    """(the most completion tokens ``payload`` allows, the fewest it forces): ``max_completion_tokens`` or
    ``max_tokens``; with ``ignore_eos`` all of them, else ``min_tokens``. None: no bound."""

    def count(key: str) -> int | None:
        value = payload.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None

    cap = count("max_completion_tokens")
    cap = count("max_tokens") if cap is None else cap
    floor = cap if payload.get("ignore_eos") is True else count("min_tokens")
    return cap, floor or None


def count_problem(sample: Sample) -> str | None:
    """Why a finished stream's token counts disagree, naming the requested, streamed and reported counts (None:
    they agree). Reported (``usage.completion_tokens``, what every token rate divides) must lie within what
    the request allows and forces; under the usage clock the stream's own running count must reach it, but
    for `UNSTREAMED_TAIL`, and never pass it. Under the content clock the stream counted chunks, not tokens
    (a chunk may carry several): only the request's bounds are checked."""
    reported = sample.completion_tokens
    if reported is None:
        return None
    cap, floor, streamed = sample.requested_tokens, sample.promised_tokens, sample.streamed_tokens
    usage = sample.token_clock == "usage"
    why = None
    if floor is not None and reported < floor:
        why = f"the server stopped at {reported} of the {floor} tokens the request forces"
    elif cap is not None and reported > cap:
        why = f"the server reports {reported} tokens, more than the max_tokens {cap} it was given"
    elif usage and streamed is not None and streamed > reported:
        why = f"the stream counted {streamed - reported} more token(s) than the final usage reports"
    elif usage and streamed is not None and reported - streamed > UNSTREAMED_TAIL:
        why = f"the final usage reports {reported - streamed} token(s) the stream never delivered"
    if why is None:
        return None
    if cap is not None and floor == cap:
        asked = f"requested {cap} (forced)"
    elif cap is not None:
        asked = f"requested up to {cap}" + (f", at least {floor}" if floor else "")
    else:
        asked = f"requested at least {floor}" if floor else "requested no limit"
    seen = "?" if streamed is None else str(streamed) if usage else f"{streamed} content chunk(s)"
    return f"{asked}, streamed {seen}, reported {reported}: {why}"


def check_counts(sample: Sample, payload: Mapping[str, Any]) -> Sample:
    """Record what ``payload`` asked for on ``sample``; fail a finished sample whose counts disagree
    (`count_problem`) as ``token_count``: every token rate would divide a count the stream does not bear out."""
    sample.requested_tokens, sample.promised_tokens = token_bounds(payload)
    if sample.ok and (problem := count_problem(sample)):
        sample.fail("token_count", problem)
    return sample


def prompt_size(body: bytes, prompt_tokens: int | None) -> tuple[int, bool]:
    """A request's prompt tokens for its first-token limit, and whether they were estimated from its size."""
    if prompt_tokens is None:
        return int(len(body) / CHARS_PER_TOKEN), True
    return prompt_tokens, False


@dataclass(frozen=True)
class Limits:
    """How long a measured stream may take: in all, before its first byte, and between chunks."""

    request_timeout_s: float = 600.0
    stall_timeout_s: float = 120.0
    connect_timeout_s: float = 10.0
    #: Before its first token, a request may wait ``first_token_floor_s + prompt tokens / min_prefill_tps``
    #: after send (prefill; a chunk without a token — a role chunk, an empty delta — does not end it); None:
    #: the stall timeout applies from the start.
    first_token_floor_s: float | None = None
    min_prefill_tps: float = 500.0
    #: The server sends its response headers as soon as it takes a request (vLLM does, queued or not;
    #: llama-server only once a slot takes it): none within the stall timeout means it is hung
    #: (``no_response``), whatever the first-token limit. False: the headers may take as long as the first token.
    headers_at_once: bool = True

    @property
    def read_timeout_s(self) -> float:
        return min(self.stall_timeout_s, self.request_timeout_s)

    def first_token_limit_s(self, prompt_tokens: int) -> float:
        """How long after send a request of ``prompt_tokens`` may wait for its first token (never less than the
        stall timeout, never more than the request timeout)."""
        if self.first_token_floor_s is None:
            return self.read_timeout_s
        limit = self.first_token_floor_s + prompt_tokens / self.min_prefill_tps
        return min(max(limit, self.read_timeout_s), self.request_timeout_s)

    def first_token_failure(self, sample: Sample, limit: float, tokens: int, estimated: bool) -> Sample:
        """Fail ``sample`` for a first token that did not come within ``limit`` of send."""
        if self.first_token_floor_s is None or limit <= self.read_timeout_s:
            return sample.fail("stall", f"no response for {self.read_timeout_s:g} s (--kv-stall-timeout)")
        about = "~" if estimated else ""
        return sample.fail(
            "first_token_timeout",
            f"no first token within the first-token limit of {limit:.4g} s (--kv-first-token-floor "
            f"{self.first_token_floor_s:g} s + {about}{tokens:,} prompt tokens / --kv-min-prefill-tps "
            f"{self.min_prefill_tps:g}); raise either for deeper or slower prefills",
        )

    def headers_limit_s(self, first_limit_s: float) -> float:
        """How long a request of first-token limit ``first_limit_s`` may wait for its response headers."""
        return min(self.read_timeout_s, first_limit_s) if self.headers_at_once else first_limit_s

    def headers_failure(self, sample: Sample) -> Sample:
        """Fail ``sample`` for response headers that did not come within the stall timeout: a hung server."""
        return sample.fail(
            "no_response",
            f"no response headers within {self.read_timeout_s:g} s (--kv-stall-timeout): the server took the "
            "request and sent nothing",
        )

    def stall_failure(self, sample: Sample) -> Sample:
        return sample.fail("stall", f"no chunk for {self.read_timeout_s:g} s (--kv-stall-timeout)")

    def timeout_failure(self, sample: Sample) -> Sample:
        return sample.fail("timeout", f"request took longer than {self.request_timeout_s:g} s")


class Client:
    """Streams chat completions from one OpenAI-compatible server, one request at a time.

    One stream at a time per client; the concurrency probe's simultaneous streams are read by the many-stream
    client (`pytest_kvcache.fanout.Fanout`), which applies the same `TokenClock` and `Limits`.
    """

    def __init__(
        self,
        base_url: str,
        *,
        request_timeout_s: float = 600.0,
        stall_timeout_s: float = 120.0,
        connect_timeout_s: float = 10.0,
        headers: Mapping[str, str] | None = None,
        first_token_floor_s: float | None = None,
        min_prefill_tps: float = 500.0,
        headers_at_once: bool = True,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.limits = Limits(
            request_timeout_s=request_timeout_s,
            stall_timeout_s=stall_timeout_s,
            connect_timeout_s=connect_timeout_s,
            first_token_floor_s=first_token_floor_s,
            min_prefill_tps=min_prefill_tps,
            headers_at_once=headers_at_once,
        )
        self._headers = {"Content-Type": "application/json", **(headers or {})}
        parts = urlsplit(self.base_url)
        self._https = parts.scheme == "https"
        self._host = parts.hostname or "127.0.0.1"
        self._port = parts.port or (443 if self._https else 80)
        self._prefix = parts.path.rstrip("/")
        self._conn: http.client.HTTPConnection | None = None
        self._http = httpx.Client(
            base_url=self.base_url,
            timeout=httpx.Timeout(connect=connect_timeout_s, read=self.read_timeout_s, write=30.0, pool=30.0),
            headers=self._headers,
        )

    @property
    def read_timeout_s(self) -> float:
        """How long a read may wait: the stall timeout, bounded by the request timeout."""
        return self.limits.read_timeout_s

    def close(self) -> None:
        self._drop_connection()
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def get_json(self, path: str, timeout_s: float = 10.0) -> Any:
        response = self._http.get(path, timeout=timeout_s)
        response.raise_for_status()
        return response.json()

    def get_text(self, path: str, timeout_s: float = 10.0) -> str:
        response = self._http.get(path, timeout=timeout_s)
        response.raise_for_status()
        return response.text

    def post_json(self, path: str, body: Mapping[str, Any], timeout_s: float = 60.0) -> Any:
        response = self._http.post(path, content=json.dumps(body).encode(), timeout=timeout_s)
        response.raise_for_status()
        return response.json()

    # ---------------------------------------------------------------- the measured stream

    def _connection(self) -> tuple[http.client.HTTPConnection, bool]:
        """The kept-alive connection (and whether it is fresh), connected with TCP_NODELAY."""
        if self._conn is not None:
            return self._conn, False
        cls = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
        conn = cls(self._host, self._port, timeout=self.limits.connect_timeout_s)
        try:
            conn.connect()
        except TimeoutError:  # not a first-token or header timeout: the server never took the connection
            raise _ConnectTimeout(f"no connection within {self.limits.connect_timeout_s:g} s") from None
        assert conn.sock is not None
        conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn.sock.settimeout(self.read_timeout_s)
        self._conn = conn
        return conn, True

    def _drop_connection(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _send(self, body: bytes, first_limit_s: float) -> http.client.HTTPResponse:
        """POST the request; a kept-alive connection the server closed meanwhile is replaced once. The
        response headers may take `Limits.headers_limit_s` (`_NoHeaders` past it); after them, until the
        body's first byte, the socket waits for what is left of ``first_limit_s``."""
        path = self._prefix + "/v1/chat/completions"
        headers_limit = self.limits.headers_limit_s(first_limit_s)
        for attempt in (1, 2):
            conn, fresh = self._connection()
            try:
                sock = conn.sock  # the response keeps it when the server says it will close
                assert sock is not None
                sent = time.perf_counter()
                sock.settimeout(headers_limit)
                try:
                    conn.request("POST", path, body=body, headers=self._headers)
                    response = conn.getresponse()
                except TimeoutError:
                    raise _NoHeaders from None
                sock.settimeout(max(first_limit_s - (time.perf_counter() - sent), 0.001))
                return response
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                self._drop_connection()
                if fresh or attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def first_token_limit_s(self, prompt_tokens: int) -> float:
        """See `Limits.first_token_limit_s`."""
        return self.limits.first_token_limit_s(prompt_tokens)

    def stream_chat(
        self, payload: Mapping[str, Any], *, keep_text: bool = False, prompt_tokens: int | None = None
    ) -> Sample:
        """Send one streamed chat completion and measure it. ``payload`` must set ``stream: true``.

        Until the first token arrives the first-token limit applies, counted from send
        (``first_token_limit_s`` of ``prompt_tokens``, estimated from the payload's length when not given); a
        chunk that carries no token (a role chunk, an empty delta) does not end it. After the first token, the
        stall timeout applies between chunks.
        """
        body = json.dumps(payload).encode()
        tokens, estimated = prompt_size(body, prompt_tokens)
        first_limit = self.first_token_limit_s(tokens)
        sample = Sample(send_unix_s=time.time())
        sample.requested_tokens, sample.promised_tokens = token_bounds(payload)
        t0 = sample.send_perf_s = time.perf_counter()
        first_token = [False]
        try:
            try:
                response = self._send(body, first_limit)
            except (ConnectionRefusedError, _ConnectTimeout, socket.gaierror, http.client.RemoteDisconnected) as exc:
                self._drop_connection()
                return sample.fail("connection_error", f"cannot connect to {self.base_url}: {exc}")
            except _NoHeaders:
                self._drop_connection()
                if self.limits.headers_at_once:
                    return self.limits.headers_failure(sample)
                return self.limits.first_token_failure(sample, first_limit, tokens, estimated)
            sample.http_status = response.status
            if response.status >= 400:
                sample.end_s = time.perf_counter() - t0
                message = _error_message(response)
                self._drop_connection()
                return sample.fail("http_error", f"HTTP {response.status}: {message}")
            self._read_stream(response, sample, t0, keep_text, first_token, first_limit)
            if sample.ok or sample.error_kind in ("missing_usage", "zero_tokens", "no_token_clock"):
                response.read()  # the end of the chunked body: the connection stays reusable
            else:
                self._drop_connection()
        except TimeoutError:
            self._drop_connection()
            if not first_token[0]:
                return self.limits.first_token_failure(sample, first_limit, tokens, estimated)
            return self.limits.stall_failure(sample)
        except (http.client.IncompleteRead, http.client.HTTPException, ConnectionError) as exc:
            self._drop_connection()
            sample.end_s = time.perf_counter() - t0
            what = type(exc).__name__ if not str(exc) else f"{type(exc).__name__}: {exc}"
            return sample.fail("dropped", f"connection dropped mid-stream after {sample.chunks} chunks: {what}")
        except OSError as exc:
            self._drop_connection()
            return sample.fail("connection_error", f"{type(exc).__name__}: {exc}")
        except BaseException:
            # Ctrl-C mid-stream: cut the request now. Left open (the traceback keeps the socket alive) the
            # engine's HTTP server waits for it to finish before it exits, and its stop takes the full grace.
            self._drop_connection()
            raise
        if response.will_close:
            self._drop_connection()
        return check_counts(sample, payload)

    def _read_stream(
        self,
        response: http.client.HTTPResponse,
        sample: Sample,
        t0: float,
        keep_text: bool,
        first_token: list[bool],
        first_limit_s: float,
    ) -> None:
        clock = TokenClock(sample, keep_text)
        sock = self._conn.sock if self._conn is not None else None
        while raw := response.readline():
            now = time.perf_counter() - t0
            if now > self.limits.request_timeout_s:
                sample.end_s = now
                self.limits.timeout_failure(sample)
                return
            if clock.line(raw, now):
                break
            if first_token[0] or sock is None:
                continue
            if clock.has_token:
                first_token[0] = True  # from now on the stall timeout applies between chunks
                sock.settimeout(self.read_timeout_s)
            else:  # a chunk without a token: the first-token limit still runs, from send
                sock.settimeout(max(first_limit_s - (time.perf_counter() - t0), 0.001))
        clock.finish(time.perf_counter() - t0)


class _NoHeaders(Exception):
    """No response headers within `Limits.headers_limit_s` of sending."""


class _ConnectTimeout(ConnectionError):
    """The server did not take the connection within the connect timeout."""


class TokenClock:
    """The timing model of a stream, fed its SSE lines with the time each arrived; fills a `Sample`.

    The single-stream `Client` feeds it line by line as it reads; the many-stream path
    (`pytest_kvcache.fanout`) stamps bytes as they arrive and feeds the lines after the measured window. Both
    therefore time and fail a stream the same way.
    """

    def __init__(self, sample: Sample, keep_text: bool = False) -> None:
        self.sample = sample
        self.keep_text = keep_text
        self.count = 0
        self.first_usage: float | None = None
        self.last_usage: float | None = None
        self.first_content: float | None = None
        self.last_content: float | None = None
        self.content_chunks = 0
        self.usage: dict[str, Any] | None = None
        self.done = False
        self.text: list[str] = []
        self.tool_calls: dict[int, dict[str, Any]] = {}

    @property
    def has_token(self) -> bool:
        """Whether a chunk has carried a token yet (a running token count ≥ 1, or content, reasoning or a tool
        call): the end of the first-token limit. A role chunk or an empty delta is not one."""
        return self.first_usage is not None or self.first_content is not None

    def line(self, raw: bytes, now: float) -> bool:
        """One line of the body, arrived ``now`` seconds after send. True: stop reading (``[DONE]`` or a
        failure already recorded on the sample)."""
        sample = self.sample
        if not raw.startswith(b"data:"):
            return False
        data = raw[5:].strip().decode("utf-8", "replace")
        if data == "[DONE]":
            sample.end_s = now
            self.done = True
            return True
        try:
            chunk = json.loads(data)
        except json.JSONDecodeError:
            sample.end_s = now
            sample.fail("malformed_json", f"chunk {sample.chunks + 1} is not JSON: {data[:120]!r}")
            return True
        sample.chunks += 1
        if not isinstance(chunk, dict):
            sample.fail("malformed_json", f"chunk {sample.chunks} is not an object: {data[:120]!r}")
            return True
        if "error" in chunk and "choices" not in chunk:
            err = chunk["error"]
            message = err.get("message", err) if isinstance(err, dict) else err
            sample.end_s = now
            sample.fail("server_error", f"server sent an error event: {message}")
            return True
        choices = chunk.get("choices") or []
        if isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]
        if choices:
            choice = choices[0]
            delta = choice.get("delta") or {}
            content = delta.get("content") or ""
            reasoning = delta.get("reasoning_content") or delta.get("reasoning") or ""
            calls = delta.get("tool_calls") or []
            if content or reasoning or calls:
                self.first_content = now if self.first_content is None else self.first_content
                self.last_content = now
                self.content_chunks += 1
                sample.content_chars += len(content)
                if self.keep_text:
                    self.text.append(content)
                    for call in calls:
                        slot = self.tool_calls.setdefault(int(call.get("index", 0)), {"name": "", "arguments": ""})
                        fn = call.get("function") or {}
                        slot["name"] += fn.get("name") or ""
                        slot["arguments"] += fn.get("arguments") or ""
            if choice.get("finish_reason"):
                sample.finish_reason = choice["finish_reason"]
            running = (chunk.get("usage") or {}).get("completion_tokens")
            timings = chunk.get("timings")
            if not isinstance(running, int) and isinstance(timings, dict):
                running = timings.get("predicted_n")  # llama-server's running count (timings_per_token)
            if isinstance(running, int) and running > self.count:
                if self.first_usage is None:
                    self.first_usage = now
                    sample.first_chunk_tokens = running
                self.last_usage = now
                self.count = running
                sample.token_chunks += 1
        return False

    def finish(self, ended_s: float) -> None:
        """The body ended ``ended_s`` after send (or the reading stopped): settle the sample."""
        sample = self.sample
        if self.keep_text:
            sample.text = "".join(self.text)
            sample.tool_calls = [self.tool_calls[i] for i in sorted(self.tool_calls)]
        if sample.error_kind is not None:
            return
        if not self.done:
            sample.end_s = ended_s
            sample.fail("dropped", f"stream ended without [DONE] after {sample.chunks} chunks")
            return
        usage = self.usage
        if usage is None:
            sample.fail("missing_usage", "the stream carried no usage (token counts)")
            return
        sample.prompt_tokens = usage.get("prompt_tokens")
        sample.completion_tokens = usage.get("completion_tokens")
        details = usage.get("prompt_tokens_details") or {}
        sample.cached_tokens = details.get("cached_tokens")
        if not sample.completion_tokens:
            sample.fail("zero_tokens", "the server reported 0 completion tokens")
            return
        if self.first_usage is not None:
            sample.token_clock = "usage"
            sample.first_token_s, sample.last_token_s = self.first_usage, self.last_usage
            sample.streamed_tokens = self.count
        elif self.first_content is not None:
            sample.token_clock = "content"
            sample.first_token_s, sample.last_token_s = self.first_content, self.last_content
            sample.streamed_tokens = self.content_chunks
        else:
            sample.fail("no_token_clock", "no chunk carried per-chunk usage or content: first token not observable")
            return
        sample.ok = True
