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
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx

from pytest_kvcache.sample import CHARS_PER_TOKEN, UNSTREAMED_TAIL, Sample, TokenClock


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
        headers: Mapping[str, str] | None = None,
        **limits: Any,
    ) -> None:
        """``limits``: the fields of :class:`Limits` (``stall_timeout_s=…``), each defaulting to its default there."""
        self.base_url = base_url.rstrip("/")
        self.limits = Limits(**limits)
        self._headers = {"Content-Type": "application/json", **(headers or {})}
        parts = urlsplit(self.base_url)
        self._https = parts.scheme == "https"
        self._host = parts.hostname or "127.0.0.1"
        self._port = parts.port or (443 if self._https else 80)
        self._prefix = parts.path.rstrip("/")
        self._conn: http.client.HTTPConnection | None = None
        self._http = httpx.Client(
            base_url=self.base_url,
            timeout=httpx.Timeout(
                connect=self.limits.connect_timeout_s, read=self.read_timeout_s, write=30.0, pool=30.0
            ),
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
                message = error_text(response.read(4000), str(response.reason))
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
