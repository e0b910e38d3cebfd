"""Short-context probes: one short user message, a long decode (the seed's "canonical benchmark")."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pytest_kvcache.config.constants import Sampling
from pytest_kvcache.probes import registry


@dataclass(frozen=True)
class ShortShape:
    name: str
    prompt: str
    max_tokens: int


SHAPES: tuple[ShortShape, ...] = (
    ShortShape("narrative", "Write an 800-word essay on how attention works in a transformer.", 1000),
    ShortShape("code", "Write a well-commented Python function that sorts a list using quicksort.", 800),
)

#: Output agreement compares at most this many greedy tokens per shape (unmeasured requests).
AGREEMENT_MAX_TOKENS = 256

#: The seed's sampling (PROTOCOL.md): each arm then generates different text and lengths.
SEED_SAMPLING: dict[str, Any] = {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "min_p": 0.0}

STREAM_OPTIONS: dict[str, Any] = {"include_usage": True, "continuous_usage_stats": True}


def sampling_params(mode: Sampling, max_tokens: int) -> dict[str, Any]:
    """Greedy: temperature 0 and ``ignore_eos`` so every arm decodes exactly ``max_tokens`` tokens."""
    if mode == "greedy":
        return {"temperature": 0.0, "ignore_eos": True, "max_tokens": max_tokens, "min_tokens": max_tokens}
    return {**SEED_SAMPLING, "max_tokens": max_tokens}


def chat_payload(
    model: str, messages: list[dict[str, Any]], mode: Sampling, max_tokens: int, **extra: Any
) -> dict[str, Any]:
    return {
        "model": model,
        "messages": messages,
        "stream": True,
        "stream_options": dict(STREAM_OPTIONS),
        **sampling_params(mode, max_tokens),
        **extra,
    }


def plan(st: Any) -> str | None:
    """The boot plan's line: the short probes' sizes where the embedded model on the CPU shrinks them."""
    if (st.max_tokens, st.warmups, st.runs) == (None, 3, 5):
        return None
    return registry.sized_for_cpu(
        st,
        "short probes",
        f"{st.max_tokens or 'each shape’s'} tokens, {st.warmups} warmup(s) + {st.runs} runs a shape",
        "elsewhere: 1000/800 tokens, 3 + 5",
    )


registry.with_plan("short", plan)
