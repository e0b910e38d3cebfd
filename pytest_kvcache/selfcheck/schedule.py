"""What a `~pytest_kvcache.selfcheck.stream.StreamServer` plays: the `Schedule` of a response (its
timings, chunking, usage and injected `Fault`), its wire format (``X-Stream-Schedule``), and the
`ServedRequest` it records for each request."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal, Protocol, get_args

SCHEDULE_HEADER = "X-Stream-Schedule"
"""Request header holding a JSON `Schedule` (fields as in `Schedule`, ``fault`` as a nested object)."""


FaultKind = Literal[
    "drop",
    "stall",
    "malformed",
    "http_error",
    "no_usage",
    "zero_tokens",
    "stream_error",
    "hang",
    "stop_early",
    "misreport",
]


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
    * ``stop_early``: generate only ``after_chunks`` token chunks, whatever ``max_tokens`` (or ``ignore_eos``)
      asked, and finish with "stop"; usage counts what was sent unless ``usage_tokens`` says otherwise.
    * ``misreport``: stream as scheduled, but the final usage (and a whole response's) reports
      ``usage_tokens`` completion tokens; the per-chunk running counts stay true.

    ``usage_tokens`` (``stop_early``, ``misreport``): the completion tokens the final usage claims.

    ``after_chunks`` at or past the number of token chunks fires after the last one, before the
    final usage chunk and ``[DONE]``. ``message`` replaces the default error message.
    """

    kind: FaultKind
    after_chunks: int = 0
    status: int = 500
    stall_s: float = 1.0
    message: str | None = None
    reset: bool = True
    usage_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in _FAULT_KINDS:
            raise ValueError(f"Fault.kind must be one of {', '.join(_FAULT_KINDS)}; got {self.kind!r}")
        if self.after_chunks < 0:
            raise ValueError(f"Fault.after_chunks must be >= 0; got {self.after_chunks}")
        if not 100 <= self.status <= 599:
            raise ValueError(f"Fault.status must be an HTTP status code; got {self.status}")
        if self.stall_s < 0:
            raise ValueError(f"Fault.stall_s must be >= 0; got {self.stall_s}")
        if self.usage_tokens is not None and self.usage_tokens < 0:
            raise ValueError(f"Fault.usage_tokens must be >= 0; got {self.usage_tokens}")
        if self.kind == "misreport" and self.usage_tokens is None:
            raise ValueError("Fault.usage_tokens is required for a misreport fault")

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


def _dumps(payload: Any) -> str:
    """Compact JSON, as vLLM's pydantic models and FastAPI's JSONResponse write it."""
    return json.dumps(payload, separators=(",", ":"))


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
        elif annotation == "int | None":
            ok = value is None or (isinstance(value, int) and not isinstance(value, bool))
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
