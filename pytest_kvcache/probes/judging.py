"""Can this baseline judge quality? Three checks of the baseline arm, made before any quality figure is believed.

A KV dtype's quality is measured against the baseline arm's own outputs. That comparison means something
only when the baseline is a working language model reading text its tokenizer really splits into words:

- **NLL against chance**: the baseline's mean negative log-likelihood of the committed text (nats/token),
  against ln(vocabulary), the NLL of a uniform guess. A trained model reads prose and code far below half of
  it (SmolLM2-135M: docs/models.md); random weights sit at it (``embedded:tiny-qwen3``).
- **Characters per token**: of the text, as the engine's own tokenizer splits it. A tokenizer that fell apart
  into single characters (a converted GGUF tokenizer built with no merges) gives ~1; a working subword
  tokenizer 2.5–4.5 on English prose and code.
- **Greedy repeats**: a short greedy continuation of the text. Output that is one short pattern over and over
  (``<sT>aT>e⏎<sT>aT>e…``) is a model that cannot read its input.

Plain Python: no pytest, no server access (the fidelity probe asks the engine, the report judges).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

#: The baseline's NLL at or above this share of ln(vocabulary) is chance-like: it cannot judge.
NLL_SHARE_MAX = 0.6
#: Fewer characters per token than this: the tokenizer splits text into (nearly) single characters.
MIN_CHARS_PER_TOKEN = 1.5
#: A continuation of which this share repeats itself at a period of at most ``MAX_PERIOD`` characters.
REPEAT_SHARE = 0.9
MAX_PERIOD = 24
#: Characters a greedy continuation needs before its repeats are judged.
MIN_GREEDY_CHARS = 48
#: Tokens of the greedy continuation the fidelity probe asks for.
GREEDY_TOKENS = 48
#: Tokens of the text it continues: the first ones, a short prompt (repeats show without depth, and a deep
#: prompt costs a whole prefill more per text: ~26 s at 1K on a 2-core AVX2 host, bf16).
GREEDY_PROMPT_TOKENS = 128


def chars_per_token(chars: int, tokens: int) -> float | None:
    return chars / tokens if tokens > 0 else None


def repeat_period(text: str) -> int | None:
    """The shortest period p ≤ ``MAX_PERIOD`` at which ≥ ``REPEAT_SHARE`` of ``text`` repeats itself
    (``text[i] == text[i + p]``), or None: the text is not one short pattern over and over."""
    n = len(text)
    for period in range(1, min(MAX_PERIOD, n // 3) + 1):
        same = sum(1 for i in range(n - period) if text[i] == text[i + period])
        if same >= REPEAT_SHARE * (n - period):
            return period
    return None


@dataclass(frozen=True)
class Check:
    """The three figures of one baseline boot's texts, and what each says."""

    nll: float | None
    vocab: int | None
    chars_per_token: float | None
    greedy: Sequence[str]

    @property
    def nll_share(self) -> float | None:
        if self.nll is None or not self.vocab or self.vocab < 2:
            return None
        return self.nll / math.log(self.vocab)

    def problems(self) -> list[str]:
        """Why this baseline cannot judge quality (empty: it can, as far as these checks see)."""
        found = []
        share = self.nll_share
        if share is not None and share >= NLL_SHARE_MAX:
            found.append(
                f"its NLL is {self.nll:.2f} nats/token, {share:.0%} of ln(vocabulary {self.vocab:,}) = "
                f"{math.log(self.vocab or 2):.2f}: chance-like (a trained model reads text below "
                f"{NLL_SHARE_MAX:.0%} of it)"
            )
        if self.chars_per_token is not None and self.chars_per_token < MIN_CHARS_PER_TOKEN:
            found.append(
                f"its tokenizer splits the texts into {self.chars_per_token:.2f} characters a token: (nearly) single "
                "characters, not words"
            )
        for text in self.greedy:
            period = repeat_period(text) if len(text) >= MIN_GREEDY_CHARS else None
            if period is not None:
                found.append(f"its greedy output repeats a {period}-character pattern: {text[: 3 * period]!r}…")
                break
        return found

    def unchecked(self) -> list[str]:
        """The checks these figures could not make (said in the report; they make no verdict)."""
        left = []
        if self.nll_share is None:
            left.append("NLL against chance (vocabulary size unknown)" if self.nll is not None else "NLL (no scores)")
        if self.chars_per_token is None:
            left.append("characters per token")
        if not any(len(t) >= MIN_GREEDY_CHARS for t in self.greedy):
            left.append(f"greedy repeats (no continuation of {MIN_GREEDY_CHARS}+ characters)")
        return left
