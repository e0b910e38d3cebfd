"""Teacher-forced scores of a prompt, as an engine kind gives them (``Kind.score_prompt``): the fidelity probe asks
its arm's kind for a :class:`PromptScorer` — how its server tokenizes a text, scores every position of a prompt
of token ids (the logprob of the prompt's own next token and the top-k alternatives) and continues a prompt
greedily — and keeps the scored positions before each depth as a :class:`Window`. vLLM scores a whole prompt in
one request (``prompt_logprobs``); llama-server, one forced one-token continuation a position on its prompt cache.
A kind without a scorer gives no fidelity figures (the probe says so and skips). Plain Python: no pytest.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from pytest_kvcache.model.base import Json
from pytest_kvcache.model.records import FidelityWindowData

#: Decimals kept of each stored logprob (1e-6 nats is far below any drift worth reporting).
DECIMALS = 6

#: One scored position: the logprob of the prompt's own token there, and the top-k (id, logprob) by rank.
Scored = tuple[float, list[tuple[int, float]]]


class PromptClient(Protocol):
    """What a scorer calls on the arm's server (the measuring client, ``run.measure.ArmClient``)."""

    def post_json(self, path: str, body: dict[str, Any], timeout_s: float | None = None) -> Any: ...

    def post_unstreamed(self, path: str, body: dict[str, Any], prompt_tokens: int) -> Any: ...

    def post_measured(
        self, path: str, body: dict[str, Any], timeout_s: float
    ) -> tuple[Any, float, dict[str, Json] | None]: ...


@dataclass
class PromptScores:
    """A scored prompt: ``score(position)`` for positions 1 … len(ids) − 1, asked in increasing order.
    ``wall_s`` and ``engine``: the one measured request that scored it all (its wall time and engine counter
    deltas); None where each position is a request of its own (``requests`` counts them as they are made), timed by
    the caller. ``method``: how it scored, in words, where it is not one prompt-logprobs request."""

    score: Callable[[int], Scored]
    wall_s: float | None = None
    engine: dict[str, Json] | None = None
    method: str | None = None
    requests: int = 0


class PromptScorer(ABC):
    """How one kind of server scores a prompt teacher-forced; HTTP, transport and ``ValueError`` (an answer that
    lacks what was asked) propagate."""

    #: its greedy continuation runs over the prompt its cache holds (the first depth's tokens), not a fixed prefix
    greedy_on_cache: bool = False

    @abstractmethod
    def tokenize(self, client: PromptClient, model: str, text: str) -> list[int]:
        """The text's token ids as the server tokenizes it, without special tokens."""

    @abstractmethod
    def score(self, client: PromptClient, model: str, ids: Sequence[int], top_k: int, timeout_s: float) -> PromptScores:
        """Every position of ``ids`` scored, or a scorer that scores them as they are asked for."""

    @abstractmethod
    def greedy(self, client: PromptClient, model: str, ids: Sequence[int], tokens: int) -> str:
        """``tokens`` greedy tokens after ``ids``, as text."""


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


def windows(
    ids: Sequence[int], depths: Sequence[int], window: int, top_k: int, score: Callable[[int], Scored]
) -> tuple[list[Window], list[int]]:
    """The scored positions kept at each depth (the last ``window`` before it) and the depths the prompt is too
    short for; ``score(position)`` is asked once a position, deepest depth last (a prompt cache only grows)."""
    kept: list[Window] = []
    short: list[int] = []
    done: dict[int, Scored] = {}
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
