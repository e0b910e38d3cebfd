"""What vLLM's OpenAI server sends, rendered in advance: the chunks, usage, logprobs and whole responses of
one request (`_Run`), the error bodies, and the toy tokenizer behind ``/tokenize``."""

from __future__ import annotations

import http
import json
import math
import time
import uuid
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from pytest_kvcache.selfcheck.schedule import Schedule, _dumps

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


_VOCAB = 151936  # Qwen3's vocabulary size: "token_id:N" ids stay below it


_ID_STRIDE = 7919  # token k's id: (crc32 of the prompt's words + k * _ID_STRIDE) mod _VOCAB


_ALT_STRIDE = 104729  # offset of the j-th top_logprobs alternative's id


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
    #: the completion tokens the final usage claims (a ``misreport`` fault); None: what was sent
    usage_tokens: int | None = None
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
        chunk["usage"] = self.usage(completion_tokens if self.usage_tokens is None else self.usage_tokens)
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
            response["usage"] = self.usage(self.n_tokens if self.usage_tokens is None else self.usage_tokens)
        return response


def _frame(data: str, *, last: bool = False) -> bytes:
    """One SSE event as an HTTP/1.1 chunk (and, for the last, the terminating zero-length chunk)."""
    payload = f"data: {data}\n\n".encode()
    frame = f"{len(payload):x}\r\n".encode() + payload + b"\r\n"
    return frame + b"0\r\n\r\n" if last else frame


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
