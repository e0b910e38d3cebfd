"""Output agreement: do two arms generate the same tokens?

Per short shape and boot, separate unmeasured requests ask for greedy decoding with each token's id and
logprob (vLLM: ``logprobs`` with ``return_tokens_as_token_ids``). Arms are then compared pairwise: the
share of identical sequences, where the first divergence falls, and the mean absolute logprob
difference over the common prefix (the tokens before the first divergence). A faster arm that changes
outputs then shows it next to its speed.

Plain Python: no pytest, no server access (the caller posts the payload).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from pytest_kvcache.engines.tokenizer_check import first_difference

#: Agreement requests per shape and boot: two, so a boot's own nondeterminism shows too.
REQUESTS = 2


def agreement_payload(model: str, prompt: str, max_tokens: int) -> dict[str, Any]:
    """A non-streamed greedy chat request that returns every generated token's id and logprob."""
    return {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "stream": False,
        "temperature": 0.0,
        "max_tokens": max_tokens,
        "min_tokens": max_tokens,
        "ignore_eos": True,
        "logprobs": True,
        "top_logprobs": 0,
        "return_tokens_as_token_ids": True,
    }


@dataclass(frozen=True)
class Tokens:
    """One response's generated token ids and their logprobs (same length)."""

    ids: tuple[int, ...]
    logprobs: tuple[float, ...]


def _token_id(token: Any) -> int | None:
    if isinstance(token, str) and token.startswith("token_id:"):
        try:
            return int(token.split(":", 1)[1])
        except ValueError:
            return None
    return None


def parse_response(body: Any) -> Tokens:
    """The token ids and logprobs of a chat completion; ValueError says why they are not there."""
    try:
        content = body["choices"][0]["logprobs"]["content"]
    except (KeyError, IndexError, TypeError):
        raise ValueError("the response carries no logprobs (choices[0].logprobs.content)") from None
    if not isinstance(content, list):
        raise ValueError("choices[0].logprobs.content is not a list")
    ids: list[int] = []
    logprobs: list[float] = []
    for i, entry in enumerate(content):
        token_id = _token_id(entry.get("token") if isinstance(entry, dict) else None)
        if token_id is None and isinstance(entry, dict) and isinstance(entry.get("id"), int):
            token_id = entry["id"]  # llama-server gives every logprob entry its token id
        if token_id is None:
            raise ValueError(f"token {i} is not 'token_id:N' (the server ignored return_tokens_as_token_ids)")
        logprob = entry.get("logprob")
        ids.append(token_id)
        logprobs.append(float(logprob) if isinstance(logprob, int | float) else float("nan"))
    return Tokens(tuple(ids), tuple(logprobs))


def compare_pair(a: Tokens, b: Tokens) -> dict[str, Any]:
    """One pair: identical or not, first divergence index, mean |Δ logprob| over the common prefix."""
    at = first_difference(a.ids, b.ids)
    prefix = min(len(a.ids), len(b.ids)) if at is None else at
    diffs = np.abs(np.asarray(a.logprobs[:prefix]) - np.asarray(b.logprobs[:prefix]))
    diffs = diffs[np.isfinite(diffs)]
    return {
        "identical": at is None,
        "first_divergence": at,
        "length": max(len(a.ids), len(b.ids)),
        "common_prefix": prefix,
        "mean_abs_logprob_diff": float(diffs.mean()) if diffs.size else None,
        "max_abs_logprob_diff": float(diffs.max()) if diffs.size else None,
    }


def summarize(pairs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Share identical, mean first-divergence index (over diverging pairs), mean |Δ logprob| (over pairs)."""
    if not pairs:
        return {"pairs": 0, "identical_share": None, "mean_first_divergence": None, "mean_abs_logprob_diff": None}
    diverging = [p["first_divergence"] for p in pairs if p["first_divergence"] is not None]
    lp = [p["mean_abs_logprob_diff"] for p in pairs if p["mean_abs_logprob_diff"] is not None]
    return {
        "pairs": len(pairs),
        "identical_share": sum(1 for p in pairs if p["identical"]) / len(pairs),
        "mean_first_divergence": float(np.mean(diverging)) if diverging else None,
        "mean_abs_logprob_diff": float(np.mean(lp)) if lp else None,
        "max_abs_logprob_diff": max((p["max_abs_logprob_diff"] or 0.0) for p in pairs) if lp else None,
        "length": max(p["length"] for p in pairs),
    }
