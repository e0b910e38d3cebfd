"""Each boot's capacity search read back from its trial records (:class:`Search`: its levels, their verdicts over
all their trials, the knee) and as one frame row per boot and depth."""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from pytest_kvcache import stats
from pytest_kvcache.config.grammars import Slo, parse_slo
from pytest_kvcache.model.records import Record
from pytest_kvcache.probes import capacity as probe
from pytest_kvcache.probes.registry import depth_label

if TYPE_CHECKING:
    pass


PROBE = "capacity"
METRIC = "capacity"
#: The KV-residency knee's metric: the sessions whose prefixes the cache holds (hit rate at least half).
RESIDENCY_METRIC = "kv_residency"
#: A knee whose prefix-cache hit rate fell by more than this (absolute) from the last level that met the SLO
#: to the first that broke it (or whose engine preempted requests there) is "kv"-bound; else "compute"-bound. A
#: p95 bound breaks once ~5% of turns are prefilled from scratch: a drop of 5 points can break it.
KV_BOUND_DROP = 0.05
#: Trials the knee and each level either side of it need before a one-boot interval is printed.
MIN_TRIALS = 2


@dataclass
class Trial:
    """One trial of a search: its level, its measured turns and what the probe recorded of the engine."""

    index: int
    sessions: int
    step: str
    window_s: float
    slo: Slo
    ttft: np.ndarray
    itl: np.ndarray
    tokens: np.ndarray
    context_tokens: float | None
    info: dict[str, Any]
    client_cached: int
    client_prompt: int
    excluded_reason: str | None = None
    #: per measured turn (aligned with ``ttft``): its cached and prompt tokens (both 0 where the turn failed or
    #: its usage stated no cached tokens)
    cached: np.ndarray = field(default_factory=lambda: np.zeros(0))
    prompt: np.ndarray = field(default_factory=lambda: np.zeros(0))

    @cached_property
    def figures(self) -> probe.TrialFigures:
        return _judge(self.ttft, self.itl, self.tokens, self.slo, self.window_s)

    @property
    def counts(self) -> probe.HitCounts:
        """The trial's prefix-cache figures: the engine's counters over the window, the turns' usage."""
        engine = self.info.get("engine") or {}
        queries, hits = engine.get("prefix_cache_queries"), engine.get("prefix_cache_hits")
        number = (int, float)
        return probe.HitCounts(
            hits=float(hits) if isinstance(hits, number) and not isinstance(hits, bool) else None,
            queries=float(queries) if isinstance(queries, number) and not isinstance(queries, bool) else None,
            cached=self.client_cached,
            prompt=self.client_prompt,
        )

    @property
    def hit_rate(self) -> tuple[float | None, str | None]:
        """The prefix-cache hit rate of the window: the engine's counters, else the turns' cached tokens."""
        return probe.hit_rate([self.counts])

    def resample(self, rng: np.random.Generator, count: int) -> np.ndarray:
        """``count`` resamples of the trial's measured turns (indices, replicates × turns)."""
        return rng.integers(0, self.ttft.size, size=(count, self.ttft.size))

    def goodput_ci(self, seed: int, count: int = 1000) -> tuple[float | None, float | None]:
        n = self.ttft.size
        if n < 2:
            return None, None
        rng = np.random.default_rng([seed, self.index, self.sessions])
        idx = rng.integers(0, n, size=(count, n))
        found = probe.goodput_many(self.ttft[idx], self.itl[idx], self.tokens[idx], self.slo, self.window_s)
        tail = 100 * (1 - stats.CONFIDENCE) / 2
        lo, hi = np.percentile(found, [tail, 100 - tail])
        return float(lo), float(hi)


def _judge(ttft: np.ndarray, itl: np.ndarray, tokens: np.ndarray, slo: Slo, window_s: float) -> probe.TrialFigures:
    turns = [
        probe.TurnTimes(float(t), float(i), int(n), bool(math.isfinite(t)))
        for t, i, n in zip(ttft, itl, tokens, strict=True)
    ]
    return probe.judge(turns, slo, window_s)


@dataclass
class Level:
    """One level of a search and its judged trials: its verdict and figures over all their measured turns."""

    sessions: int
    trials: list[Trial]

    @cached_property
    def figures(self) -> probe.TrialFigures:
        """The SLO's terms over every measured turn of the level's trials (the goodput over their windows)."""
        return _judge(
            np.concatenate([t.ttft for t in self.trials]),
            np.concatenate([t.itl for t in self.trials]),
            np.concatenate([t.tokens for t in self.trials]),
            self.trials[0].slo,
            sum(t.window_s for t in self.trials),
        )

    @property
    def hit_rate(self) -> tuple[float | None, str | None]:
        """The prefix-cache hit rate over the level's windows: the engine's counters, else the turns' usage."""
        return probe.hit_rate([t.counts for t in self.trials])

    @property
    def holds(self) -> bool | None:
        """Whether the cache holds the level's sessions: its hit rate at least ``probe.RESIDENCY`` (None:
        unknown)."""
        return probe.holds(self.hit_rate[0])

    def holds_many(self, rng: np.random.Generator, count: int) -> np.ndarray:
        """The level's residency verdict over ``count`` replicates. With the turns' usage (every trial's), each
        trial's measured turns resampled as the SLO's replicates resample them, the hit rate their cached tokens
        of their prompt tokens — shifted by the level's own engine-minus-usage difference where the level's rate
        is the engine's (on vLLM the two agree to the token); without it, the level's trials resampled (their
        counters summed)."""
        rate, source = self.hit_rate
        if rate is None:
            return np.zeros(count, dtype=bool)
        usage = [t for t in self.trials if t.prompt.size and t.prompt.sum() > 0]
        if len(usage) == len(self.trials):
            picks = [t.resample(rng, count) for t in usage]
            cached = sum((t.cached[idx].sum(axis=1) for t, idx in zip(usage, picks, strict=True)), np.zeros(count))
            prompt = sum((t.prompt[idx].sum(axis=1) for t, idx in zip(usage, picks, strict=True)), np.zeros(count))
            observed = sum(t.client_cached for t in usage) / sum(t.client_prompt for t in usage)
            shift = rate - observed if source == "/metrics" else 0.0
            found = np.divide(cached, prompt, out=np.zeros(count), where=prompt > 0) + shift
            return np.asarray(found >= probe.RESIDENCY)
        parts = [t.counts for t in self.trials]
        engine = source == "/metrics"
        hits = np.asarray([float((p.hits if engine else p.cached) or 0) for p in parts])
        queries = np.asarray([float((p.queries if engine else p.prompt) or 0) for p in parts])
        idx = rng.integers(0, len(parts), size=(count, len(parts)))
        total = queries[idx].sum(axis=1)
        return np.asarray(
            np.divide(hits[idx].sum(axis=1), total, out=np.zeros(count), where=total > 0) >= probe.RESIDENCY
        )

    @property
    def kv_usage_max(self) -> float | None:
        found = [x for t in self.trials if (x := _num(t.info.get("kv_usage_max"))) is not None]
        return max(found) if found else None

    @property
    def preemptions(self) -> float | None:
        """Preemptions over the level's windows (None: no trial had the counter)."""
        found = [x for t in self.trials if (x := _num((t.info.get("engine") or {}).get("preemptions"))) is not None]
        return float(sum(found)) if found else None

    def meets_many(self, rng: np.random.Generator, count: int) -> np.ndarray:
        """The level's verdict over ``count`` replicates: each trial's measured turns resampled (as many as it
        had), the level judged over them together."""
        if not sum(t.ttft.size for t in self.trials):
            return np.zeros(count, dtype=bool)
        picks = [(t, t.resample(rng, count)) for t in self.trials if t.ttft.size]
        ttft = np.concatenate([t.ttft[idx] for t, idx in picks], axis=1)
        itl = np.concatenate([t.itl[idx] for t, idx in picks], axis=1)
        return probe.meets_many(ttft, itl, self.trials[0].slo)


@dataclass
class Search:
    """One boot's search at one depth."""

    arm: str
    boot: str
    point: str
    depth: int
    trials: list[Trial] = field(default_factory=list)

    @property
    def judged(self) -> list[Trial]:
        """The trials that have a verdict (not excluded), in order."""
        return [t for t in sorted(self.trials, key=lambda t: t.index) if t.excluded_reason is None]

    @property
    def levels(self) -> list[Level]:
        """Every level with a judged trial, smallest first: each judged over all its trials."""
        found: dict[int, list[Trial]] = {}
        for trial in self.judged:
            found.setdefault(trial.sessions, []).append(trial)
        return [Level(n, found[n]) for n in sorted(found)]

    @property
    def verdicts(self) -> dict[int, bool]:
        """Each level's verdict over all its trials."""
        return {level.sessions: level.figures.meets for level in self.levels}

    @property
    def counts(self) -> dict[int, int]:
        """Judged trials per level."""
        return {level.sessions: len(level.trials) for level in self.levels}

    @property
    def capacity(self) -> int:
        return probe.knee(self.verdicts)[0]

    @property
    def first_broken(self) -> int | None:
        return probe.knee(self.verdicts)[1]

    @property
    def censored(self) -> bool:
        return bool(self.judged) and self.first_broken is None

    @property
    def holds(self) -> dict[int, bool] | None:
        """Each level's residency verdict (its hit rate over all its trials at least ``probe.RESIDENCY``); None
        when a level's hit rate is unknown (no counters, no usage): then there is no residency knee."""
        found = {level.sessions: level.holds for level in self.levels}
        if not found or any(v is None for v in found.values()):
            return None
        return {n: bool(v) for n, v in found.items()}

    @property
    def residency(self) -> int | None:
        """The KV-residency knee: the largest level such that it and every level tried below it held (None:
        no hit rate)."""
        holds = self.holds
        return None if holds is None else probe.knee(holds)[0]

    @property
    def residency_broken(self) -> int | None:
        """The first level tried above the residency knee, where the hit rate fell below half (None: none did)."""
        holds = self.holds
        return None if holds is None else probe.knee(holds)[1]

    @property
    def residency_censored(self) -> bool:
        return self.residency is not None and self.residency_broken is None

    def knee_of(self, metric: str) -> int | None:
        """The knee a metric reads: the capacity (``capacity``) or the KV-residency knee (``kv_residency``)."""
        return self.residency if metric == RESIDENCY_METRIC else self.capacity

    def censored_of(self, metric: str) -> bool:
        return self.residency_censored if metric == RESIDENCY_METRIC else self.censored

    @property
    def limit(self) -> int | None:
        """The search's most sessions (``--kv-capacity-max-sessions``), as its trials recorded it (None: a run
        made before they did)."""
        found = [t.info.get("max_sessions") for t in self.trials]
        return next((int(x) for x in found if isinstance(x, int | float) and not isinstance(x, bool)), None)

    def level_at(self, sessions: int | None) -> Level | None:
        return next((level for level in self.levels if level.sessions == sessions), None)

    def unmeasured(self, metric: str = METRIC) -> str | None:
        """Why this search alone gives the capacity (or the residency knee: ``metric``) no interval: the knee or a
        level either side of it (from 1 to the limit) was tried fewer than ``MIN_TRIALS`` times; None: each was
        tried enough."""
        counts = self.counts
        found = self.knee_of(metric)
        if found is None:
            return "no prefix-cache hit rate"
        short = [n for n in probe.neighbours(found, self.limit) if counts.get(n, 0) < MIN_TRIALS]
        if not short:
            return None
        parts: dict[int, list[int]] = {}
        for n in sorted(short):
            parts.setdefault(counts.get(n, 0), []).append(n)
        said = "; ".join(
            f"{_levels(ns)} {'never tried' if k == 0 else 'tried once' if k == 1 else f'tried {k} times'}"
            for k, ns in sorted(parts.items())
        )
        return f"the knee and the levels either side of it need {MIN_TRIALS} trials each ({said})"

    def bracket(self, metric: str = METRIC) -> dict[str, Any]:
        """The last level that met the SLO and the first that broke it, with their trials (``kv_residency``: the
        last level whose sessions the cache held and the first where the hit rate fell below half)."""
        counts = self.counts
        if metric == RESIDENCY_METRIC:
            met, broke = self.residency or 0, self.residency_broken
        else:
            met, broke = self.capacity, self.first_broken
        return {
            "boot": self.boot,
            "met": met,
            "broke": broke,
            "trials": {str(n): counts.get(n, 0) for n in sorted({met, *([broke] if broke else [])}) if n},
        }

    def _knee_draws(self, seed: int, count: int, salt: str, verdicts: Callable[..., np.ndarray]) -> np.ndarray:
        """The knee of ``count`` bootstrap replicates from each level's resampled verdicts (``verdicts``:
        ``Level.meets_many`` or ``Level.holds_many``), each a level that was tried (or 0; see the module docstring);
        seeded by the run seed, the boot, the point and ``salt``, so the same folder gives the same CI."""
        rng = np.random.default_rng([seed, zlib.crc32(f"{self.boot}@{self.point}{salt}".encode())])
        levels = self.levels
        if not levels:
            return np.zeros(count)
        verdict = np.stack([verdicts(level, rng, count) for level in levels], axis=1)
        return probe.knee_draws([level.sessions for level in levels], verdict)

    def draws(self, seed: int, count: int = stats.BOOTSTRAP_SAMPLES) -> np.ndarray:
        """The SLO knee of ``count`` bootstrap replicates."""
        return self._knee_draws(seed, count, "", Level.meets_many)

    def residency_draws(self, seed: int, count: int = stats.BOOTSTRAP_SAMPLES) -> np.ndarray:
        """The residency knee of ``count`` bootstrap replicates: each level's hit rate over its resampled turns
        (``Level.holds_many``), the knee read as :func:`probe.knee` reads it."""
        return self._knee_draws(seed, count, ":kv", Level.holds_many)

    def draws_of(self, metric: str, seed: int) -> np.ndarray:
        return self.residency_draws(seed) if metric == RESIDENCY_METRIC else self.draws(seed)


def _levels(found: Sequence[int]) -> str:
    """``[5]`` → "5", ``[5, 7]`` → "5 and 7"."""
    text = [str(n) for n in found]
    return text[0] if len(text) == 1 else f"{', '.join(text[:-1])} and {text[-1]}"


def searches(records: Sequence[Record]) -> list[Search]:
    """Every boot's searches, from the capacity probe's measured turns (in record order)."""
    found: dict[tuple[str, str], Search] = {}
    trials: dict[tuple[str, str, int], list[Record]] = {}
    for r in records:
        if r.get("probe") != PROBE or r.get("phase") != "measured" or r.get("depth") is None:
            continue
        depth = int(cast(int, r.get("depth")))
        key = (str(r.get("boot")), depth_label(depth))
        found.setdefault(key, Search(str(r.get("arm")), key[0], key[1], depth))
        trials.setdefault((*key, int(r.get("index") or 0)), []).append(r)
    for (boot, point, index), turns in trials.items():
        info: dict[str, Any] = dict(turns[0].get("capacity") or {})
        try:
            slo = parse_slo(str(info.get("slo")))
        except ValueError:
            continue  # not a record this version wrote
        times = [probe.turn_times(r.get("sample") or {}) for r in turns]
        prompts = [int((r.get("sample") or {}).get("prompt_tokens") or 0) for r in turns if r.get("ok")]
        # the turns' own cache figures: a turn whose usage stated its cached tokens (0 where it failed or did not)
        samples = [r.get("sample") or {} for r in turns]
        stated = np.asarray(
            [bool(r.get("ok")) and x.get("cached_tokens") is not None for r, x in zip(turns, samples, strict=True)]
        )
        usage = np.asarray([[x.get("cached_tokens") or 0, x.get("prompt_tokens") or 0] for x in samples], dtype=float)
        turn_cached, turn_prompt = np.where(stated[:, None], usage.reshape(-1, 2), 0.0).T
        reasons = sorted({str(r.get("excluded_reason")) for r in turns if r.get("ok") and r.get("excluded_reason")})
        if info.get("verdict") == "excluded" and not reasons:
            reasons = [str(info.get("excluded_reason") or "excluded")]
        found[(boot, point)].trials.append(
            Trial(
                index=index,
                sessions=int(info.get("sessions") or 0),
                step=str(info.get("step") or "up"),
                window_s=float(info.get("window_s") or 0.0),
                slo=slo,
                ttft=np.asarray([t.ttft_s for t in times], dtype=float),
                itl=np.asarray([t.itl_s for t in times], dtype=float),
                tokens=np.asarray([t.tokens for t in times], dtype=float),
                context_tokens=float(np.mean(prompts)) if prompts else None,
                info=info,
                client_cached=int(turn_cached.sum()),
                client_prompt=int(turn_prompt.sum()),
                excluded_reason="; ".join(reasons) or None,
                cached=turn_cached,
                prompt=turn_prompt,
            )
        )
    return list(found.values())


def frame_rows(records: Sequence[Record]) -> list[dict[str, object]]:
    """The report frame's capacity rows: one per boot and depth, its capacity the metric (``search`` holds the
    search, for the CIs)."""
    rows: list[dict[str, object]] = []
    for s in searches(records):
        valid = bool(s.judged)
        rows.append(
            {
                "arm": s.arm,
                "boot": s.boot,
                "probe": PROBE,
                "point": s.point,
                "depth": s.depth,
                "index": None,
                "pair": None,
                "valid": valid,
                "flagged": any(t.excluded_reason for t in s.trials),
                "excluded_reason": None if valid else "every trial excluded",
                METRIC: float(s.capacity) if valid else None,
                RESIDENCY_METRIC: float(r) if valid and (r := s.residency) is not None else None,
                "search": s,
            }
        )
    return rows


def _num(value: Any) -> float | None:
    """A finite number, from a number or its text (``/metrics`` labels are text); None otherwise."""
    try:
        found = float(value) if isinstance(value, int | float | str) else math.nan
    except ValueError:
        return None
    return found if math.isfinite(found) else None


def count(value: float | None) -> str:
    """A capacity as it reads: ``7``, or ``6.7`` when boots disagree (a mean)."""
    if value is None:
        return "–"
    return f"{value:.0f}" if abs(value - round(value)) < 1e-9 else f"{value:.1f}"
