"""Fresh-prefill probes: a salted haystack sized to an exact depth with the server's own tokenizer.

Every request is a new haystack: a salt is woven into every sentence, so no block of one request can
match a cached block of another. Salts derive from (run seed, depth, phase, index): arm A's k-th request
and arm B's k-th request are byte-identical and pair up, while no two requests of one arm share a block.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pytest_kvcache.probes import registry
from pytest_kvcache.probes.registry import depth_label

#: The filler sentence; ``{salt}`` is woven into every repeat so cached blocks never match.
FILLER = (
    "Record {n} of log {salt}: the scheduler admitted a request, the cache manager allocated blocks, "
    "and the worker computed attention over every earlier token before emitting one more."
)
HEADER = "Session {salt}. Below is a long log. Read it, then answer the question at the end.\n\n"
QUESTION = "\n\nQuestion: how many records does log {salt} contain? Answer with one number."
PAD_WORD = " {salt}"

#: Depth tolerance: a measured prompt must lie within this share of its target.
DEPTH_TOLERANCE = 0.01


def salt_for(seed: int, *parts: object) -> str:
    """An 8-letter salt derived from the run seed and the request's coordinates (same in every arm)."""
    digest = hashlib.sha256(":".join(str(p) for p in (seed, *parts)).encode()).digest()
    return "".join(chr(ord("a") + b % 26) for b in digest[:8])


def haystack(salt: str, repeats: int, pad_words: int) -> str:
    body = "\n".join(FILLER.format(n=i + 1, salt=salt) for i in range(repeats))
    pad = "".join(PAD_WORD.format(salt=salt) for _ in range(pad_words))
    return HEADER.format(salt=salt) + body + pad + QUESTION.format(salt=salt)


def messages_for(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


@dataclass(frozen=True)
class SizedPrompt:
    """How many filler repeats and pad words make ``target`` tokens, as measured with one salt."""

    repeats: int
    pad_words: int
    tokens: int
    target: int
    tokenize_calls: int

    def messages(self, salt: str) -> list[dict[str, Any]]:
        return messages_for(haystack(salt, self.repeats, self.pad_words))


CountTokens = Callable[[list[dict[str, Any]]], int]


class SizingError(RuntimeError):
    """The prompt could not be sized to its depth (a failed ``/tokenize`` or calibration request)."""


def size_prompt(target: int, salt: str, count: CountTokens) -> SizedPrompt:
    """Find (repeats, pad words) whose chat-rendered prompt is as close to ``target`` tokens as possible
    without exceeding it.

    ``count`` returns the server's token count of a message list (``/tokenize`` applies the chat
    template, as a chat completion does). Repeats are solved by secant steps, then single pad words
    (each one salt, ~1-3 tokens) close the gap from below.
    """
    calls = 0

    def measure(repeats: int, pad: int) -> int:
        nonlocal calls
        calls += 1
        return count(messages_for(haystack(salt, repeats, pad)))

    base = measure(0, 0)
    per_repeat = max(1.0, float(measure(1, 0) - base))
    repeats = max(0, int((target - base) / per_repeat))
    tokens = measure(repeats, 0)
    for _ in range(8):  # secant refinement on whole repeats
        if tokens <= target and target - tokens < per_repeat:
            break
        step = int((target - tokens) // per_repeat)
        if step == 0:
            step = -1 if tokens > target else 1
        repeats = max(0, repeats + step)
        tokens = measure(repeats, 0)
    while tokens > target and repeats > 0:
        repeats -= 1
        tokens = measure(repeats, 0)
    pad = 0
    per_pad = max(1.0, float(measure(repeats, 1) - tokens))
    while tokens < target and calls < 60:
        step = max(1, int((target - tokens) / per_pad))
        trial = measure(repeats, pad + step)
        if trial > target:
            if step == 1:
                break
            per_pad = max(per_pad, (trial - tokens) / step)
            continue
        pad, tokens = pad + step, trial
    return SizedPrompt(repeats, pad, tokens, target, calls)


MAX_TOKENS = 16


#: Why a sample nothing proves cold is left out (unless ``--kv-allow-unproven-cold``).
UNPROVEN = "cold unproven: the engine reports neither prefix-cache hits (/metrics) nor cached_tokens (usage)"


def cold_check(
    sample_cached: int | None, engine: dict[str, Any] | None, block_size: int, *, allow_unproven: bool = False
) -> tuple[list[str], str | None, str]:
    """Was the request computed from scratch? Returns (flags, excluded_reason, proof).

    Proof comes from the engine's ``vllm:prefix_cache_hits_total`` delta around the request; without
    ``/metrics``, from ``usage.prompt_tokens_details.cached_tokens``. More than one block of hits is
    "not cold": the sample is flagged and excluded. Neither source: "cold_unproven", excluded unless
    ``allow_unproven`` (a server that may have served it from a cache cannot time a fresh prefill).
    """
    if engine is not None and "prefix_cache_hits" in engine:
        hits, proof = int(engine["prefix_cache_hits"]), "metrics"
    elif sample_cached is not None:
        hits, proof = sample_cached, "usage"
    else:
        return ["cold_unproven"], None if allow_unproven else f"{UNPROVEN} (--kv-allow-unproven-cold keeps it)", "none"
    if hits > block_size:
        return ["not_cold"], f"not cold: {hits} prefix-cache hit tokens > one block ({block_size})", proof
    return [], None, proof


def unverified_depth(prompt_tokens: int | None, target: int) -> str | None:
    """Why a finished request cannot stand for depth ``target`` though nothing else failed: its usage gave no
    ``prompt_tokens``, so neither the depth nor ``prefill_tps`` can be checked (the request then fails as
    ``token_count``)."""
    if prompt_tokens is not None:
        return None
    return f"requested a {target}-token prompt, reported none: the usage carries no prompt_tokens to prove the depth"


def prompt_count_flags(counted: int | None, reported: int | None) -> list[str]:
    """``prompt_count_mismatch`` when the server's ``usage.prompt_tokens`` differs from what the plugin counted
    for that very prompt (its ``/tokenize``, or the local tokenizer): the record keeps both; the depth check
    (±1% of the target) decides whether the sample counts."""
    if counted is None or reported is None or counted == reported:
        return []
    return ["prompt_count_mismatch"]


def depth_check(prompt_tokens: int | None, target: int) -> tuple[list[str], str | None]:
    if prompt_tokens is None:
        return [], None
    error = (prompt_tokens - target) / target
    if abs(error) > DEPTH_TOLERANCE:
        return ["depth_off"], f"depth off: {prompt_tokens} prompt tokens vs target {target} ({100 * error:+.2f}%)"
    return [], None


def depth_plan(st: Any) -> str | None:
    """The boot plan's line for the depth probes (prefill and agentic) on the embedded model on the CPU."""
    return registry.sized_for_cpu(
        st,
        "depth probes",
        f"depths {','.join(depth_label(d) for d in st.depths)}, {st.sessions} agentic session(s) of "
        f"{st.turns or 'all'} turns, {st.agentic_max_tokens} tokens a turn, agentic depth {st.agentic_depth}",
        "the seed's: --kv-depths=10k,90k --kv-sessions=2 --kv-turns=15",
    )


registry.with_plan("prefill", depth_plan)
registry.with_plan("agentic", depth_plan)
