"""Capacity probe: how many long-context sessions an arm sustains under a latency SLO, at each depth.

A *session* holds a context of D tokens (its first turn: a salted haystack sized to the depth with the server's
own tokenizer, as the prefill probe's) and then sends turn after turn, each its whole context so far plus a
new user message, a think time after the previous turn ended. Its prefix stays cached only while the KV cache
holds it: once N sessions' contexts no longer fit, turns are evicted between turns, their prompts are prefilled
from scratch and TTFT climbs. The probe steps N up (doubling) until the SLO breaks, then bisects between the
last level that met it and the first that did not, then tries that knee and the levels either side of it again
(2 trials each by default): the **capacity** is the largest N that met it, each level judged over all its
trials' turns. From the same trials, the **KV-residency knee**: the largest N whose prefix-cache hit rate stayed
at least half (the cache still holds the sessions' prefixes), searched the same way — past the SLO's knee where
compute broke the SLO first.

Everything here is plain Python (no pytest): the SLO and its judgement of a trial, the search, the knee and
its bootstrap, the requests of a session. ``suite/test_capacity.py`` runs the trials through the many-stream
client (`pytest_kvcache.fanout.Fanout.sessions`); ``report/capacity.py`` reads the records back.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from pytest_kvcache.config.grammars import Slo
from pytest_kvcache.fanout_plan import SessionPlan
from pytest_kvcache.metrics.prometheus import Scrape, engine_delta
from pytest_kvcache.probes import registry
from pytest_kvcache.probes.prefill import haystack, salt_for
from pytest_kvcache.probes.registry import depth_label

#: Warmup turns (turn 0: the whole context prefilled) in flight at once per client process: enough to keep an
#: engine's prefill busy, few enough that none waits past its first-token limit behind the others.
WARM_CONCURRENCY = 8

#: The stand-in for the model's reply in every later turn's context: fixed, so every arm gets byte-identical
#: requests (a model's own replies would differ between arms and change the contexts' sizes).
ASSISTANT = "Done: I ran the step, read its output and noted what changed. Next I will check the {k}-th result."
USER = "Turn {k} of session {salt}: run the next check, then tell me in one line what it found."


# ------------------------------------------------------------------------------------------ one turn


@dataclass(frozen=True)
class TurnTimes:
    """What the SLO reads of one measured turn: TTFT, mean inter-token latency (its decode window over the
    tokens after the first chunk) and tokens. A failed turn did not meet any bound: its times are inf."""

    ttft_s: float
    itl_s: float
    tokens: int
    ok: bool


def turn_times(sample: Mapping[str, Any]) -> TurnTimes:
    """A measured turn's times from its record's ``sample`` (``Sample.to_dict``)."""
    first, last = sample.get("first_token_s"), sample.get("last_token_s")
    tokens = int(sample.get("completion_tokens") or 0)
    if not sample.get("ok") or first is None:
        return TurnTimes(math.inf, math.inf, 0, False)
    after = tokens - int(sample.get("first_chunk_tokens") or 1)
    itl = (float(last) - float(first)) / after if last is not None and after > 0 else 0.0
    return TurnTimes(float(first), itl, tokens, True)


def nearest_rank(values: Sequence[float] | np.ndarray, q: float, axis: int = -1) -> Any:
    """The q-th percentile by nearest rank (the smallest value with at least q% of the values at or below it),
    the usual percentile of an SLO; works with inf (a failed turn)."""
    return np.percentile(np.asarray(values, dtype=float), q, axis=axis, method="inverted_cdf")


@dataclass
class TrialFigures:
    """One trial judged against its SLO."""

    turns: int
    failed: int
    ttft_p50_s: float | None
    ttft_p95_s: float | None
    itl_p50_s: float | None
    itl_p95_s: float | None
    #: completion tokens of the turns that met every bound of the SLO, per second of the window
    goodput_tps: float
    good_turns: int
    meets: bool
    #: the SLO terms the trial broke, with their values (``ttft_p95 0.41 s > 0.2 s``)
    broken: list[str] = field(default_factory=list)
    #: every SLO term's value over the trial (``{"ttft_p95": 0.41}``; None: a failed turn decided it)
    terms: dict[str, float | None] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _finite(value: float) -> float | None:
    return float(value) if math.isfinite(value) else None


def judge(turns: Sequence[TurnTimes], slo: Slo, window_s: float) -> TrialFigures:
    """A trial's figures and verdict: every SLO term over its measured turns (a failed turn counts as inf), and
    the goodput. A trial without a measured turn does not meet the SLO."""
    ttft = np.asarray([t.ttft_s for t in turns], dtype=float)
    itl = np.asarray([t.itl_s for t in turns], dtype=float)
    broken: list[str] = []
    terms: dict[str, float | None] = {}
    for term in slo.terms:
        values = ttft if term.metric == "ttft" else itl
        if not values.size:
            broken.append(f"{term.name}: no measured turn")
            terms[term.name] = None
            continue
        value = float(nearest_rank(values, term.quantile))
        terms[term.name] = _finite(value)
        if value > term.limit_s:
            shown = "a failed turn" if not math.isfinite(value) else f"{value:.3g} s"
            broken.append(f"{term.name} {shown} > {term.limit_s:g} s")
    good = [t for t in turns if t.ok and t.ttft_s <= slo.limit("ttft") and t.itl_s <= slo.limit("itl")]
    ok_ttft = [t.ttft_s for t in turns if t.ok]
    ok_itl = [t.itl_s for t in turns if t.ok]

    def pct(values: list[float], q: float) -> float | None:
        return _finite(float(nearest_rank(values, q))) if values else None

    return TrialFigures(
        turns=len(turns),
        failed=sum(1 for t in turns if not t.ok),
        ttft_p50_s=pct(ok_ttft, 50),
        ttft_p95_s=pct(ok_ttft, 95),
        itl_p50_s=pct(ok_itl, 50),
        itl_p95_s=pct(ok_itl, 95),
        goodput_tps=sum(t.tokens for t in good) / window_s if window_s > 0 else 0.0,
        good_turns=len(good),
        meets=not broken,
        broken=broken,
        terms=terms,
    )


def meets_many(
    ttft: np.ndarray, itl: np.ndarray, slo: Slo
) -> np.ndarray:  # (replicates, turns) arrays → (replicates,) booleans
    """:func:`judge`'s verdict for many resampled trials at once (rows of ``ttft`` and ``itl``)."""
    ok = np.ones(ttft.shape[0], dtype=bool)
    if ttft.shape[1] == 0:
        return np.zeros(ttft.shape[0], dtype=bool)
    for term in slo.terms:
        values = ttft if term.metric == "ttft" else itl
        ok &= nearest_rank(values, term.quantile, axis=1) <= term.limit_s
    return ok


def goodput_many(ttft: np.ndarray, itl: np.ndarray, tokens: np.ndarray, slo: Slo, window_s: float) -> np.ndarray:
    """:func:`judge`'s goodput for many resampled trials at once."""
    good = (ttft <= slo.limit("ttft")) & (itl <= slo.limit("itl")) & np.isfinite(ttft)
    return (tokens * good).sum(axis=1) / window_s if window_s > 0 else np.zeros(ttft.shape[0])


# ------------------------------------------------------------------------------------------ the search

Step = Literal["up", "bisect", "confirm"]

#: Trials each level next to the knee (knee − 1, knee, knee + 1) gets before the capacity's interval is printed
#: (``--kv-capacity-trials``): a level tried once shows no spread of its own verdict.
TRIALS = 2
#: How many times the re-trials may move the knee and have the neighbourhood re-centred on the new one; past
#: that the search stops where it is (the report says whether the final knee's neighbours were tried enough).
RECENTRES = 1


#: A level **holds** its sessions' KV when the prefix-cache hit rate over its measured turns is at least this: the
#: cache still keeps most of every session's prefix between its turns. The **KV-residency knee** is the largest
#: level such that it and every level tried below it hold (:func:`knee` over those verdicts).
RESIDENCY = 0.5


@dataclass
class _Knee:
    """One knee's search (the SLO's or the KV residency's) over the trials a :class:`Search` shares: stepping up,
    bisecting, then confirming the knee and its neighbours (``counts``: every level's trials, shared)."""

    start: int
    limit: int
    trials: int
    verdicts: dict[int, bool] = field(default_factory=dict)
    centre: int | None = None
    recentred: int = 0

    def _searching(self) -> int | None:
        passed, failed = knee(self.verdicts)
        if failed is None:  # still stepping up
            if not self.verdicts:
                return min(self.start, self.limit)
            top = max(self.verdicts)
            return None if top >= self.limit else min(2 * top, self.limit)
        if failed - passed <= 1:
            return None
        return (passed + failed) // 2

    def next(self, counts: Mapping[int, int]) -> int | None:
        if self.centre is None:
            found = self._searching()
            if found is not None or self.trials <= 1 or not self.verdicts:
                return found
            self.centre = self.knee
        if self.knee != self.centre:  # the re-trials moved the knee
            if self.recentred >= RECENTRES:
                return None
            found = self._searching()  # a gap the move opened (levels never tried below the new knee): bisected
            if found is not None:
                return found
            self.recentred += 1
            self.centre = self.knee
        return next((n for n in neighbours(self.centre, self.limit) if counts.get(n, 0) < self.trials), None)

    @property
    def knee(self) -> int:
        return knee(self.verdicts)[0]

    @property
    def censored(self) -> bool:
        return bool(self.verdicts) and knee(self.verdicts)[1] is None


@dataclass
class Search:
    """Two knees from one series of trials, each found the same way: the **capacity** (the SLO's knee) and the
    **KV-residency knee** (the sessions whose prefixes the cache still holds: the prefix-cache hit rate at least
    :data:`RESIDENCY`). Each steps the number of sessions up (doubling from ``start``) until a level breaks it,
    then bisects between the last level that held and the first that did not, to one session; never above
    ``limit``. Then **confirm**: try the knee k and its neighbours k + 1 and k − 1 (those from 1 to ``limit``)
    again until each has ``trials`` trials; when the re-trials move the knee, bisect any gap that opens below the
    new knee (as the search did), then re-centre on it (``RECENTRES`` times at most) and confirm there; a knee
    that moves again after that ends that knee's search. ``trials`` 1: the search alone.

    One trial gives both verdicts, and the next level tried is the lower of the two searches' next levels (the
    cheaper trial first; a level one search needs may settle the other's): where the SLO breaks before the cache
    stops holding the sessions (a compute-bound knee), the search goes on stepping up past the SLO's knee until
    the hit rate falls below half or the limit; where the cache breaks first, the SLO's search goes on as alone.
    ``record(n, meets)`` without ``holds`` (no hit rate: a server without counters or usage) searches the SLO's
    knee alone, as before the residency knee existed; so does one trial whose hit rate is unknown.

    ``next()`` is the next level to try (None: done); ``record(n, meets, holds)`` one more trial at ``n`` and the
    level's verdicts over all its trials so far (``judge`` over their measured turns pooled; the hit rate over
    their windows). Assumes that more sessions never do better (a level above a broken one is not tried by that
    knee's search). **Cost**: each knee takes at most about 2·log2(limit) search trials, then (1 + ``RECENTRES``)
    × (3 × ``trials`` + log2(limit)) confirming ones: a search cannot run away. Where the knees coincide (the
    cache sets the SLO's knee) they share their trials, and the residency adds about nothing; where they are far
    apart (compute-bound) it adds its own climb above the SLO's knee — log2 of the gap's doublings, its bisection
    and 3 × ``trials`` re-trials — each a trial of more sessions than the SLO's knee, whose warmups prefill every
    session's context (the dearest trials of the search)."""

    start: int = 1
    limit: int = 64
    trials: int = TRIALS
    #: how many trials each level has had (excluded trials not counted)
    counts: dict[int, int] = field(default_factory=dict)
    slo: _Knee = field(init=False)
    #: the KV-residency knee's search (None: a trial had no hit rate: the SLO's knee alone)
    kv: _Knee | None = field(init=False)

    def __post_init__(self) -> None:
        self.slo = _Knee(self.start, self.limit, self.trials)
        self.kv = _Knee(self.start, self.limit, self.trials)
        self._kv_seen = False

    @property
    def verdicts(self) -> dict[int, bool]:
        """Each level's SLO verdict over every trial there (pooled)."""
        return self.slo.verdicts

    @property
    def holds(self) -> dict[int, bool]:
        """Each level's residency verdict (hit rate at least :data:`RESIDENCY` over its trials); empty when the
        residency is not searched."""
        return self.kv.verdicts if self.kv is not None else {}

    @property
    def centre(self) -> int | None:
        return self.slo.centre

    @property
    def recentred(self) -> int:
        return self.slo.recentred

    def next(self) -> int | None:
        found = [n for n in (self.slo.next(self.counts), self._kv_next()) if n is not None]
        return min(found) if found else None

    def _kv_next(self) -> int | None:
        return self.kv.next(self.counts) if self.kv is not None and self._kv_seen else None

    @property
    def step(self) -> Step:
        """Where the search is: stepping up, bisecting below a level that broke a knee, or confirming a knee.
        Read before the trial: the step of the search (of the two) that asked for the next level."""
        n, kv = self.next(), self.kv if self._kv_seen else None
        mine = self.slo
        if kv is not None and n is not None and self.slo.next(self.counts) != n and kv.next(self.counts) == n:
            mine = kv
        if mine.centre is not None:
            return "confirm"
        return "bisect" if any(not ok for ok in mine.verdicts.values()) else "up"

    def record(self, n: int, meets: bool, holds: bool | None = None) -> None:
        self.slo.verdicts[n] = meets
        self.counts[n] = self.counts.get(n, 0) + 1
        if holds is None:
            self.kv = None  # no hit rate: the residency is not searched
        elif self.kv is not None:
            self.kv.verdicts[n] = holds
            self._kv_seen = True

    @property
    def capacity(self) -> int:
        return self.slo.knee

    @property
    def censored(self) -> bool:
        """No level broke the SLO: the capacity is at least the highest level tried (the limit)."""
        return self.slo.censored

    @property
    def residency(self) -> int | None:
        """The KV-residency knee (None: not searched)."""
        return self.kv.knee if self.kv is not None and self._kv_seen else None


@dataclass(frozen=True)
class HitCounts:
    """What one trial says of the prefix cache over its measured turns: the engine's counters' deltas (None: a
    server without them) and the turns' own usage (``cached_tokens`` of ``prompt_tokens``)."""

    hits: float | None
    queries: float | None
    cached: int
    prompt: int


def hit_rate(parts: Sequence[HitCounts]) -> tuple[float | None, str | None]:
    """The prefix-cache hit rate over trials together, and its source: the engine's counters summed when every
    trial has them (``/metrics``), else the turns' cached tokens of their prompt tokens (``usage``); (None, None)
    without either."""
    if parts and all(p.hits is not None and p.queries is not None for p in parts):
        queries = sum(float(p.queries or 0) for p in parts)
        if queries > 0:
            return sum(float(p.hits or 0) for p in parts) / queries, "/metrics"
    prompt = sum(p.prompt for p in parts)
    if prompt > 0:
        return sum(p.cached for p in parts) / prompt, "usage"
    return None, None


def holds(rate: float | None) -> bool | None:
    """Whether a level's hit rate says the cache holds its sessions (at least :data:`RESIDENCY`); None: unknown."""
    return None if rate is None else bool(rate >= RESIDENCY)


def neighbours(level: int, limit: int | None = None) -> list[int]:
    """A knee's level, the one above and the one below, those from 1 to ``limit`` (None: no limit known)."""
    return [n for n in (level, level + 1, level - 1) if n >= 1 and (limit is None or n <= limit)]


def knee(verdicts: Mapping[int, bool]) -> tuple[int, int | None]:
    """(the capacity: the largest level such that it and every level tried below it met the SLO, 0 if the
    smallest tried did not; the first level tried above it, which broke it — None when none did)."""
    passed = 0
    for n in sorted(verdicts):
        if not verdicts[n]:
            return passed, n
        passed = n
    return passed, None


def knee_draws(levels: Sequence[int], meets: np.ndarray) -> np.ndarray:
    """Bootstrap replicates of the knee from resampled verdicts (``meets``: replicates × levels, levels sorted):
    each replicate's capacity read as :func:`knee` reads it — always a level that was tried (or 0), never a
    value between two levels: where the SLO broke between them is not measured."""
    count = meets.shape[0]
    passed = np.zeros(count)
    alive = np.ones(count, dtype=bool)
    for j, n in enumerate(levels):
        alive &= meets[:, j]
        passed[alive] = n
    return passed


# ------------------------------------------------------------------------------------------ the engine


@dataclass
class EngineWatch:
    """A sessions trial's monitor (`pytest_kvcache.fanout.Monitor`): reads the engine's ``/metrics`` when the
    window opens, every tick in it and when the last turn ended — the counters' deltas over the measured turns
    (prefix-cache queries and hits, preemptions, tokens) and the KV usage, running and waiting requests seen.
    ``scrape`` returns None for a server without vLLM's counters; the trial then has no engine figures."""

    scrape: Callable[[], Scrape | None]
    #: the engine kind's counters (``Kind.counters``: name in records → sample name)
    counters: Mapping[str, str]
    start: Scrape | None = None
    delta: dict[str, object] | None = None
    usage: list[float] = field(default_factory=list)
    running: list[float] = field(default_factory=list)
    waiting: list[float] = field(default_factory=list)

    def __call__(self, event: str) -> None:
        if event == "start" or (event in ("tick", "end") and self.start is not None):
            found = self.scrape()
            if found is None:
                return
            self.start = self.start or found
            for name, into in (
                ("vllm:kv_cache_usage_perc", self.usage),
                ("vllm:num_requests_running", self.running),
                ("vllm:num_requests_waiting", self.waiting),
            ):
                value = found.total(name)
                if value is None and name == "vllm:kv_cache_usage_perc":
                    value = found.total("vllm:gpu_cache_usage_perc")  # vLLM before 0.10
                if value is not None:
                    into.append(value)
        elif event == "done" and self.start is not None and (found := self.scrape()) is not None:
            self.delta = engine_delta(self.start, found, self.counters)

    def info(self) -> dict[str, Any]:
        return {
            "engine": self.delta,
            "kv_usage_mean": float(np.mean(self.usage)) if self.usage else None,
            "kv_usage_max": max(self.usage) if self.usage else None,
            "running_max": max(self.running) if self.running else None,
            "waiting_max": max(self.waiting) if self.waiting else None,
        }


#: How many times in a row a trial that was excluded (a saturated client, a busy host) is tried again.
RETRIES = 2

#: Failures that an overloaded engine causes: they count as turns that missed the SLO. Any other failure (an
#: HTTP error, a dropped connection) is a problem of the setup, and fails the test.
OVERLOAD = frozenset({"first_token_timeout", "timeout", "stall"})


# ------------------------------------------------------------------------------------------ the sessions


def think_times(seed: int, depth: int, trial: int, session: int, turns: int, mean_s: float) -> tuple[float, ...]:
    """A session's waits: turn 1 waits uniform(0, mean) from the window's opening (the sessions' first measured
    turns spread over one think time), every later turn uniform(0.5, 1.5) × mean after the previous one ended.
    Seeded by the run seed and the session's place: the same in every arm."""
    rng = random.Random(f"{seed}:capacity:{depth}:{trial}:{session}")
    waits = [0.0, rng.uniform(0.0, mean_s)]
    waits += [rng.uniform(0.5, 1.5) * mean_s for _ in range(max(0, turns - 2))]
    return tuple(waits[:turns])


def turns_for(window_s: float, think_s: float) -> int:
    """How many turns a session can send in a window (each at least half a think time after the last), plus
    its warmup."""
    return 2 + math.ceil(window_s / max(0.5 * think_s, 1e-3))


def session_plan(
    payload: Mapping[str, Any],
    first: str,
    salt: str,
    turns: int,
    think_s: Sequence[float],
) -> SessionPlan:
    """One session's requests as JSON pieces (`SessionPlan`): ``payload`` is a chat request without its
    messages (the probe's sampling, ``max_tokens``, stream options, adapted to the server); turn 0 asks about
    ``first`` (the context), turn k adds the stand-in reply to turn k − 1 and a new user message."""
    marker = "\u0000messages\u0000"
    text = json.dumps({**payload, "messages": marker})
    head, tail = text.split(json.dumps(marker), 1)
    pieces = [json.dumps({"role": "user", "content": first}).encode()]
    for k in range(1, turns):
        reply = json.dumps({"role": "assistant", "content": ASSISTANT.format(k=k)})
        ask = json.dumps({"role": "user", "content": USER.format(k=k, salt=salt)})
        pieces.append(f",{reply},{ask}".encode())
    head_bytes, tail_bytes = (head + "[").encode(), ("]" + tail).encode()
    return SessionPlan(head=head_bytes, turns=tuple(pieces), tail=tail_bytes, think_s=tuple(think_s))


def session_salt(seed: int, depth: int, trial: int, session: int) -> str:
    """A session's salt: in every sentence of its context, so no two sessions (or trials) share a cached block."""
    return salt_for(seed, "capacity", depth, trial, session)


def context(salt: str, repeats: int, pad_words: int) -> str:
    """A session's context: the prefill probe's haystack, sized once per depth (``prefill.size_prompt``)."""
    return haystack(salt, repeats, pad_words)


def plan(settings: Any) -> str:
    """The capacity probe's setup, said once before anything boots."""
    st = settings
    cpu = registry.on_embedded_cpu(st) and st.capacity_depths == st.embedded_spec.capacity_depths
    kv = "each arm's own KV cache (no --kv-cache-bytes)" if st.cache_bytes is None else "the KV budget below"
    depths = ",".join(depth_label(d) for d in st.capacity_depths)
    return (
        f"capacity{' sized for the CPU' if cpu else ''}: depths {depths}, "
        f"SLO {st.slo}, think {st.capacity_think_s:g} s, {st.capacity_window_s:g} s measured per trial, "
        f"{st.capacity_max_tokens} tokens a turn, {st.capacity_start} to at most {st.capacity_max_sessions} sessions; "
        f"{kv}"
    )


registry.with_plan("capacity", plan)
