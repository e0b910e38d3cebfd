"""Fresh-prefill probes: a salted haystack sized to an exact depth with the server's own tokenizer.

Every request is a new haystack: a salt is woven into every sentence, so no block of one request can
match a cached block of another. Salts derive from (run seed, depth, phase, index): arm A's k-th request
and arm B's k-th request are byte-identical and pair up, while no two requests of one arm share a block.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

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

DEPTH = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kK]?)\s*$")


def parse_depths(raw: str) -> tuple[int, ...]:
    """``"10k,90k"`` → (10000, 90000). Raises ValueError naming the bad part."""
    depths = []
    for part in raw.split(","):
        m = DEPTH.match(part)
        if not m:
            raise ValueError(f"expected depths like 2k,8k,90k or 12000; bad part {part.strip()!r}")
        value = float(m.group(1)) * (1000 if m.group(2) else 1)
        if value < 64 or value != int(value):
            raise ValueError(f"a depth must be a whole number of tokens >= 64; got {part.strip()!r}")
        depths.append(int(value))
    if len(set(depths)) != len(depths):
        raise ValueError(f"depths must be distinct; got {raw!r}")
    return tuple(depths)


def depth_label(depth: int) -> str:
    return f"{depth // 1000}k" if depth % 1000 == 0 else str(depth)


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
    salt: str
    messages: list[dict[str, Any]]
    tokens: int
    target: int
    tokenize_calls: int
    method: str  # "tokenize" | "calibrated"

    @property
    def error_pct(self) -> float:
        return 100.0 * (self.tokens - self.target) / self.target


CountTokens = Callable[[list[dict[str, Any]]], int]


def size_prompt(target: int, salt: str, count: CountTokens, method: str = "tokenize") -> SizedPrompt:
    """Find (repeats, pad words) whose chat-rendered prompt is as close to ``target`` tokens as possible.

    ``count`` returns the server's token count of a message list (``/tokenize``; it applies the chat
    template). Repeats are solved by secant steps, then single pad words close the gap from below.
    """
    calls = 0

    def measure(repeats: int, pad: int) -> int:
        nonlocal calls
        calls += 1
        return count(messages_for(haystack(salt, repeats, pad)))

    base = measure(0, 0)
    one = measure(1, 0)
    per_repeat = max(1.0, float(one - base))
    repeats = max(0, int((target - base) / per_repeat))
    tokens = measure(repeats, 0)
    for _ in range(8):  # secant refinement on repeats
        if tokens <= target and target - tokens < per_repeat:
            break
        repeats = max(0, repeats + int((target - tokens) // per_repeat))
        new = measure(repeats, 0)
        if new == tokens:
            break
        tokens = new
    while tokens > target and repeats > 0:
        repeats -= 1
        tokens = measure(repeats, 0)
    # Pad words close the remaining gap (each adds ~1-2 tokens).
    pad = 0
    pad_step = max(1.0, float(measure(repeats, 1) - tokens))
    while tokens < target:
        step = max(1, int((target - tokens) / pad_step))
        trial = measure(repeats, pad + step)
        if trial > target:
            if step == 1:
                break
            pad_step = max(pad_step, (trial - tokens) / step)
            continue
        pad += step
        tokens = trial
        if step == 1 and calls > 40:
            break
    return SizedPrompt(salt, messages_for(haystack(salt, repeats, pad)), tokens, target, calls, method)
