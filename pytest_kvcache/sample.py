"""What one streamed request measured (:class:`Sample`: its times, token counts, text and the metrics derived
from them) and the timing model that fills it (:class:`TokenClock`, docs/metrics.md): a stream's SSE lines, each with
the time it arrived — first token, last token, end, and every way a stream fails. The single-stream client and the
many-stream path feed it alike."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

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
