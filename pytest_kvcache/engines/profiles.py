"""Engine profiles: what each kind of server takes, how its tokens are counted, where its evidence lives.

A profile is chosen with ``--kv-engine`` (``vllm``, the default; ``llamacpp``; ``openai`` for any other
OpenAI-compatible server). It is the one place that knows which request fields are vLLM's own: every
request the probes build passes through :meth:`EngineProfile.adapt` before it is sent, so a server never
receives a field it does not take. No pytest here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from pytest_kvcache.config.engine_kinds import EngineKind

#: Request fields only vLLM takes (top level of a chat/completions body).
VLLM_ONLY_FIELDS = frozenset({"ignore_eos", "min_tokens", "return_tokens_as_token_ids", "prompt_logprobs"})
#: ``stream_options`` keys only vLLM takes.
VLLM_ONLY_STREAM_OPTIONS = frozenset({"continuous_usage_stats"})

TokenCounter = Literal["vllm", "llamacpp", "local"]
ColdProof = Literal["metrics", "usage", "none"]


@dataclass(frozen=True)
class EngineProfile:
    """What the plugin may ask of one kind of server."""

    kind: EngineKind
    title: str
    #: top-level request fields this server does not take (removed before sending)
    dropped_fields: frozenset[str] = frozenset()
    dropped_stream_options: frozenset[str] = frozenset()
    #: how prompt tokens are counted for exact-depth prefill: the server's ``/tokenize`` (vLLM's shape),
    #: llama.cpp's ``/apply-template`` + ``/tokenize``, or the model's tokenizer here (``local``)
    tokens: TokenCounter = "local"
    #: what a fresh-prefill request adds so the server computes it from scratch (and can prove it)
    cold_fields: Mapping[str, Any] = field(default_factory=dict)
    #: fields added to every request (llama.cpp: ``timings_per_token``, its per-chunk token count)
    added_fields: Mapping[str, Any] = field(default_factory=dict)
    #: the evidence endpoints this server has (the others are not asked, and the report says so)
    evidence_paths: tuple[str, ...] = ("/v1/models",)
    #: a per-chunk running token count (vLLM's ``continuous_usage_stats``, llama.cpp's ``timings.predicted_n``):
    #: the token clock
    usage_clock: bool = False
    #: greedy decoding reaches exactly ``max_tokens`` (``ignore_eos``); without it a decode may stop early
    exact_length: bool = False
    #: generated token ids with their logprobs (vLLM's ``return_tokens_as_token_ids``, llama.cpp's ``id``):
    #: output agreement
    token_ids: bool = False
    #: llama-server returns no logprobs at all for ``top_logprobs: 0``: asked for at least this many
    min_top_logprobs: int = 0
    #: ``prompt_logprobs`` over token ids on ``/v1/completions``: the fidelity probe
    prompt_logprobs: bool = False
    #: response headers as soon as a request is taken, queued or not (vLLM returns its StreamingResponse before
    #: generating): a request without them after the stall timeout fails as a hung server (``no_response``).
    #: llama-server sends them only once a slot takes the request: one queued behind busy slots has none
    headers_at_once: bool = False
    #: no prompt logprobs, but a forced one-token continuation on ``/completion`` with ``n_probs``
    #: (llama-server): the fidelity probe scores its windows one position at a time on the prompt cache
    forced_scoring: bool = False

    def adapt(self, payload: Mapping[str, Any]) -> dict[str, Any]:
        """``payload`` without the fields this server does not take."""
        out = {k: v for k, v in payload.items() if k not in self.dropped_fields}
        if out.get("stream") is True:
            out.update({k: v for k, v in self.added_fields.items() if k not in out})
        options = out.get("stream_options")
        if isinstance(options, Mapping) and self.dropped_stream_options:
            out["stream_options"] = {k: v for k, v in options.items() if k not in self.dropped_stream_options}
        if out.get("logprobs") is True and int(out.get("top_logprobs") or 0) < self.min_top_logprobs:
            out["top_logprobs"] = self.min_top_logprobs
        return out

    def missing_evidence(self) -> list[str]:
        """What this kind of server cannot show, in words (for the evidence and the report)."""
        missing = []
        if "/metrics" not in self.evidence_paths:
            missing.append("/metrics (prefix-cache hits, engine counters)")
        if self.kind == "openai":
            missing.append("resolved KV-cache dtype (no endpoint or log states it)")
            missing.append("KV-cache capacity")
        if self.tokens == "local":
            missing.append("a tokenizer endpoint (prompt tokens counted with the local tokenizer)")
        if not self.exact_length:
            missing.append("exact decode length (no ignore_eos: a greedy decode may stop early)")
        if not self.usage_clock:
            missing.append("per-chunk token counts (the first content chunk is the token clock)")
        if not self.token_ids:
            missing.append("generated token ids (no output agreement)")
        if not self.prompt_logprobs and not self.forced_scoring:
            missing.append("prompt logprobs (no fidelity probe)")
        return missing


VLLM = EngineProfile(
    kind="vllm",
    title="vLLM",
    tokens="vllm",
    evidence_paths=("/version", "/v1/models", "/metrics"),
    usage_clock=True,
    exact_length=True,
    token_ids=True,
    prompt_logprobs=True,
    headers_at_once=True,
)
LLAMACPP = EngineProfile(
    kind="llamacpp",
    title="llama.cpp (llama-server)",
    # llama-server takes ignore_eos (and cache_prompt), not vLLM's min_tokens, token-id or usage options
    dropped_fields=VLLM_ONLY_FIELDS - {"ignore_eos"},
    dropped_stream_options=VLLM_ONLY_STREAM_OPTIONS,
    tokens="llamacpp",
    cold_fields={"cache_prompt": False},
    added_fields={"timings_per_token": True},
    evidence_paths=("/v1/models", "/props", "/slots", "/metrics"),
    usage_clock=True,
    exact_length=True,
    token_ids=True,
    min_top_logprobs=1,
    forced_scoring=True,
)
OPENAI = EngineProfile(
    kind="openai",
    title="generic OpenAI-compatible server",
    dropped_fields=VLLM_ONLY_FIELDS,
    dropped_stream_options=VLLM_ONLY_STREAM_OPTIONS,
    tokens="local",
    evidence_paths=("/v1/models",),
)

PROFILES: Mapping[EngineKind, EngineProfile] = {"vllm": VLLM, "llamacpp": LLAMACPP, "openai": OPENAI}


def profile(kind: str) -> EngineProfile:
    return PROFILES[kind]  # type: ignore[index]
