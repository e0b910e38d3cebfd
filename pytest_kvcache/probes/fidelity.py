"""Fidelity at depth: what an arm does to the model's output distribution, teacher-forced.

A fixed long text (committed, sha256-checked) is tokenized once per boot by the engine itself and sent,
as token ids, to ``/v1/completions`` with ``prompt_logprobs``: the engine returns, for every position of
the prompt, the logprob of the actual next token and its top-k alternatives. The same ids go to every arm,
so positions line up. At each depth D of ``--kv-fidelity-depths`` a *window* of the last ``window``
positions before D is kept (one request, as deep as the deepest depth, serves every depth: attention is
causal, so position p sees the same context whatever comes after it).

Per position the baseline arm and another arm are compared:

- ``logprob_drift``: |Δ logprob| of the actual token (nats);
- ``nll_delta``: the arm's negative log-likelihood minus the baseline's (nats; > 0 means the arm finds the
  text less likely);
- ``kl_topk``: KL(baseline ‖ arm) over the partition {tokens both sides returned} ∪ {everything else},
  a lower bound of the true KL (coarsening a distribution can only shrink a KL divergence).

Positions are averaged in blocks of ``BLOCK`` (neighbouring positions are correlated). The report's CIs
replicate over texts (``report.fidelity``): scores are deterministic across boots, so four texts of different
kinds are committed — prose, code, JSON Lines data and HTML markup. Plain Python: no pytest, no server access
(the probe test posts the payload).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

import numpy as np

from pytest_kvcache.model.records import FidelityWindowData
from pytest_kvcache.probes.registry import depth_label

__all__ = [
    "BLOCK",
    "TEXTS",
    "Window",
    "block_metrics",
    "compare_windows",
    "depth_label",
    "forced_payload",
    "forced_windows",
    "ids_sha256",
    "load_text",
    "parse_forced",
    "parse_prompt_logprobs",
    "payload",
    "windows",
]

#: The committed texts (``pytest_kvcache/data/fidelity/NAME-v1.txt``): English prose, Python code, JSON Lines
#: records (the Unicode character database) and HTML (pydoc's pages of standard-library modules).
TEXTS = ("prose", "code", "data", "markup")
TEXT_VERSION = "v1"
#: Positions per block (the report averages each text's blocks; its CIs are over texts).
BLOCK = 32
#: Decimals kept of each stored logprob (1e-6 nats is far below any drift worth reporting).
DECIMALS = 6
#: A probability floor for the KL's "everything else" bucket (logprobs of the top-k can sum past 1 by rounding).
_FLOOR = 1e-12


class TextError(ValueError):
    """A fidelity text that is unknown or whose bytes do not match its committed sha256."""


@dataclass(frozen=True)
class Text:
    name: str
    text: str
    sha256: str


@cache
def load_text(name: str) -> Text:
    """One committed text, its bytes checked against the sha256 beside it."""
    if name not in TEXTS:
        raise TextError(f"unknown fidelity text {name!r}; known: {', '.join(TEXTS)}")
    folder = resources.files("pytest_kvcache") / "data" / "fidelity"
    file = folder / f"{name}-{TEXT_VERSION}.txt"
    data = file.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    recorded = (folder / f"{name}-{TEXT_VERSION}.txt.sha256").read_text().split()[0]
    if digest != recorded:
        raise TextError(
            f"{file}: content sha256 {digest[:12]}… differs from the recorded {recorded[:12]}…; "
            "regenerate it with fixtures/make_fidelity_texts.py (a changed text is a new version)"
        )
    return Text(name, data.decode("utf-8"), digest)


def ids_sha256(ids: Sequence[int]) -> str:
    """The identity of a token-id sequence: arms are compared only on the same ids."""
    return hashlib.sha256(",".join(map(str, ids)).encode()).hexdigest()


def payload(model: str, ids: Sequence[int], top_k: int) -> dict[str, Any]:
    """A non-streamed completion over ``ids`` that returns every prompt position's logprobs (and top-k)."""
    return {
        "model": model,
        "prompt": list(ids),
        "max_tokens": 1,
        "temperature": 0.0,
        "prompt_logprobs": top_k,
        "stream": False,
    }


@dataclass(frozen=True)
class Window:
    """Positions ``start`` .. ``start + len(logprob) - 1`` of one scored prompt: the actual token's logprob
    at each, and the top-k alternatives (ids and logprobs, by rank) where the engine returned them."""

    depth: int
    start: int
    ids: tuple[int, ...]
    logprob: tuple[float, ...]
    top_ids: tuple[tuple[int, ...], ...]
    top_logprobs: tuple[tuple[float, ...], ...]

    def to_dict(self) -> FidelityWindowData:
        return {
            "depth": self.depth,
            "start": self.start,
            "ids": list(self.ids),
            "logprob": list(self.logprob),
            "top_ids": [list(t) for t in self.top_ids],
            "top_logprobs": [list(t) for t in self.top_logprobs],
        }

    @classmethod
    def from_dict(cls, data: FidelityWindowData | Mapping[str, Any]) -> Window:
        """A stored window; ValueError when it is malformed (a key missing, lengths that disagree)."""
        try:
            window = cls(
                depth=int(data["depth"]),
                start=int(data["start"]),
                ids=tuple(int(i) for i in data["ids"]),
                logprob=tuple(float(x) for x in data["logprob"]),
                top_ids=tuple(tuple(int(i) for i in t) for t in data.get("top_ids") or []),
                top_logprobs=tuple(tuple(float(x) for x in t) for t in data.get("top_logprobs") or []),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"malformed fidelity window: {type(exc).__name__}: {exc}") from None
        n = len(window.ids)
        tops = (len(window.top_ids), len(window.top_logprobs))
        if len(window.logprob) != n or (any(tops) and tops != (n, n)):
            raise ValueError(f"malformed fidelity window at depth {window.depth}: lengths differ")
        if any(len(i) != len(lp) for i, lp in zip(window.top_ids, window.top_logprobs, strict=True)):
            raise ValueError(f"malformed fidelity window at depth {window.depth}: top-k ids and logprobs differ")
        return window


def parse_prompt_logprobs(body: Any, ids: Sequence[int], top_k: int) -> list[tuple[float, list[tuple[int, float]]]]:
    """Per prompt position p ≥ 1: (logprob of ``ids[p]``, [(id, logprob) of the top-k by rank]).

    vLLM answers ``choices[0].prompt_logprobs``: ``None`` for position 0, then one ``{"<id>": {"logprob",
    "rank", …}}`` per position, holding the actual token and the top-k. ValueError says what is missing.
    """
    try:
        entries = body["choices"][0]["prompt_logprobs"]
    except (KeyError, IndexError, TypeError):
        raise ValueError(
            "the response carries no choices[0].prompt_logprobs (the engine ignored prompt_logprobs)"
        ) from None
    if not isinstance(entries, list):
        raise ValueError("choices[0].prompt_logprobs is not a list (the engine ignored prompt_logprobs)")
    if len(entries) != len(ids):
        raise ValueError(f"{len(entries)} prompt_logprobs entries for a prompt of {len(ids)} tokens")
    found: list[tuple[float, list[tuple[int, float]]]] = []
    for p in range(1, len(ids)):
        entry = entries[p]
        if not isinstance(entry, dict):
            raise ValueError(f"prompt_logprobs[{p}] is not an object")
        ranked: list[tuple[int, int, float]] = []
        actual: float | None = None
        for key, value in entry.items():
            try:
                token = int(key)
                logprob = float(value["logprob"]) if isinstance(value, dict) else float(value)
            except (TypeError, ValueError, KeyError):
                raise ValueError(
                    f"prompt_logprobs[{p}] has an entry {key!r} that is not '<token id>: logprob'"
                ) from None
            rank = value.get("rank") if isinstance(value, dict) else None
            if token == ids[p]:
                actual = logprob
            if isinstance(rank, int) and 1 <= rank <= top_k:
                ranked.append((rank, token, logprob))
        if actual is None:
            raise ValueError(f"prompt_logprobs[{p}] lacks the prompt's own token {ids[p]}")
        if not math.isfinite(actual):
            raise ValueError(f"prompt_logprobs[{p}]: the prompt's own token {ids[p]} has logprob {actual}")
        ranked.sort()
        found.append((actual, [(token, lp) for _, token, lp in ranked[:top_k]]))
    return found


def windows(
    ids: Sequence[int],
    scored: Sequence[tuple[float, Sequence[tuple[int, float]]]],
    depths: Sequence[int],
    window: int,
) -> tuple[list[Window], list[int]]:
    """The scored positions kept at each depth (the last ``window`` before it) and the depths the prompt
    is too short for. ``scored[i]`` is position ``i + 1`` of ``ids``."""
    kept: list[Window] = []
    short: list[int] = []
    n = len(scored) + 1  # prompt tokens
    for depth in depths:
        if depth > n:
            short.append(depth)
            continue
        start = max(1, depth - window)
        rows = scored[start - 1 : depth - 1]
        kept.append(
            Window(
                depth=depth,
                start=start,
                ids=tuple(int(t) for t in ids[start:depth]),
                logprob=tuple(round(lp, DECIMALS) for lp, _ in rows),
                top_ids=tuple(tuple(t for t, _ in top) for _, top in rows),
                top_logprobs=tuple(tuple(round(lp, DECIMALS) for _, lp in top) for _, top in rows),
            )
        )
    return kept, short


def forced_payload(ids: Sequence[int], position: int, top_k: int) -> dict[str, Any]:
    """llama-server's ``/completion`` asked for the distribution at ``position``: the prompt is the ids
    before it, the one generated token is forced to ``ids[position]`` (a logit bias the sampler applies
    after the logprobs are taken: ``n_probs`` reports the raw softmax), and the prompt cache keeps the
    prefix, so each step evaluates one token."""
    return {
        "prompt": [int(t) for t in ids[:position]],
        "n_predict": 1,
        "n_probs": max(1, top_k),
        "temperature": 0.0,
        "logit_bias": [[int(ids[position]), 1e4]],
        "cache_prompt": True,
    }


def parse_forced(body: Any, token: int, top_k: int) -> tuple[float, list[tuple[int, float]]]:
    """(logprob of ``token``, [(id, logprob) of the top-k]) from a forced ``/completion`` answer."""
    try:
        entry = body["completion_probabilities"][0]
        chosen, logprob = int(entry["id"]), float(entry["logprob"])
        top = [(int(t["id"]), float(t["logprob"])) for t in entry.get("top_logprobs") or []]
    except (KeyError, IndexError, TypeError, ValueError):
        raise ValueError("the response carries no completion_probabilities[0] with id and logprob") from None
    if chosen != token:
        raise ValueError(f"the forced token {token} was not generated (got {chosen}): logit_bias was ignored")
    if not math.isfinite(logprob):
        raise ValueError(f"token {token} has logprob {logprob}")
    return logprob, top[:top_k]


def forced_windows(
    ids: Sequence[int],
    depths: Sequence[int],
    window: int,
    top_k: int,
    score: Callable[[int], tuple[float, list[tuple[int, float]]]],
) -> tuple[list[Window], list[int]]:
    """The windows of :func:`windows`, scored one position at a time by ``score(position)`` (llama-server:
    :func:`forced_payload`), deepest last so that the prompt cache only ever grows."""
    kept: list[Window] = []
    short: list[int] = []
    done: dict[int, tuple[float, list[tuple[int, float]]]] = {}
    for depth in sorted(depths):
        if depth > len(ids):
            short.append(depth)
            continue
        start = max(1, depth - window)
        rows = []
        for position in range(start, depth):
            if position not in done:
                done[position] = score(position)
            rows.append(done[position])
        kept.append(
            Window(
                depth=depth,
                start=start,
                ids=tuple(int(t) for t in ids[start:depth]),
                logprob=tuple(round(lp, DECIMALS) for lp, _ in rows),
                top_ids=tuple(tuple(t for t, _ in top) for _, top in rows) if top_k else (),
                top_logprobs=tuple(tuple(round(lp, DECIMALS) for _, lp in top) for _, top in rows) if top_k else (),
            )
        )
    return kept, short


def _kl_coarse(base: Mapping[int, float], arm: Mapping[int, float]) -> float | None:
    """KL(base ‖ arm) over {tokens both sides returned} ∪ {the rest}; None when they share no token."""
    shared = [t for t in base if t in arm]
    if not shared:
        return None
    # math (libm), not numpy: numpy's exp/log take another SIMD path on AVX-512 than on AVX2, and a report
    # re-rendered on another host must read the same last digits
    p = [math.exp(base[t]) for t in shared]
    q = [math.exp(arm[t]) for t in shared]
    p_rest = max(_FLOOR, 1.0 - math.fsum(p))
    q_rest = max(_FLOOR, 1.0 - math.fsum(q))
    terms = [pi * (base[t] - arm[t]) for pi, t in zip(p, shared, strict=True)]
    kl = math.fsum(terms) + p_rest * (math.log(p_rest) - math.log(q_rest))
    return max(0.0, kl)


def compare_windows(base: Window, arm: Window) -> dict[str, np.ndarray]:
    """Per position of two windows over the same ids: |Δ logprob|, Δ NLL and the top-k KL (NaN where the
    engine returned no top-k). ValueError when the windows do not cover the same tokens."""
    if (base.depth, base.start, base.ids) != (arm.depth, arm.start, arm.ids):
        raise ValueError(
            f"windows differ: depth {base.depth} from {base.start} ({len(base.ids)} positions) vs "
            f"depth {arm.depth} from {arm.start} ({len(arm.ids)} positions), or their token ids do"
        )
    b = np.asarray(base.logprob, dtype=float)
    a = np.asarray(arm.logprob, dtype=float)
    kl = np.full(b.size, np.nan)
    if any(base.top_ids) and any(arm.top_ids):
        for i, token in enumerate(base.ids):
            # the actual token's logprob is known on both sides: it joins the partition
            p = {**dict(zip(base.top_ids[i], base.top_logprobs[i], strict=True)), token: float(b[i])}
            q = {**dict(zip(arm.top_ids[i], arm.top_logprobs[i], strict=True)), token: float(a[i])}
            value = _kl_coarse(p, q)
            kl[i] = np.nan if value is None else value
    return {"logprob_drift": np.abs(a - b), "nll_delta": b - a, "kl_topk": kl}


def block_metrics(per_position: Mapping[str, np.ndarray], block: int = BLOCK) -> list[dict[str, float | None]]:
    """Means over consecutive blocks of ``block`` positions (a last, shorter block counts if at least half
    full)."""
    n = len(next(iter(per_position.values()))) if per_position else 0
    out: list[dict[str, float | None]] = []
    for start in range(0, n, block):
        end = min(n, start + block)
        if end - start < max(1, block // 2) and start > 0:
            break
        row: dict[str, float | None] = {}
        for name, values in per_position.items():
            part = values[start:end]
            part = part[np.isfinite(part)]
            row[name] = float(part.mean()) if part.size else None
        out.append(row)
    return out
