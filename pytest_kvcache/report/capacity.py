"""The capacity probe in the report: each boot's search at each depth as one frame row (its capacity), the
capacity's bootstrap CI, the section (a capacity table, every trial, notes), one sentence per arm and a
goodput-vs-sessions plot per depth.

A level's verdict is taken over all its trials: the SLO's terms over every measured turn of the trials at that
level, pooled (the search judged it so when it tried the level again). The capacity is the knee the search
reads from those verdicts; its bracket is the last level that met the SLO and the first that broke it.

How the CI is built (docs/probes/capacity.md): a replicate resamples every trial's measured turns (with
replacement, as many as it had), judges each level over its resampled trials again and reads the knee from
those verdicts as the search did (the largest level such that it and every level below it met the SLO). A
replicate's knee is always a level that was tried (or 0): where the SLO broke between two levels is not
measured, and no replicate draws a value in between. The capacity's CI is the percentiles (nearest rank) of
the replicates' knees; a ratio between arms is the ratio of their knees in the same replicates. At one boot
the interval is printed only when the knee and the levels either side of it were tried at least
``MIN_TRIALS`` times each (``--kv-capacity-trials``): an older run's search, one trial a level, has no interval.
With several boots a replicate also resamples the boots (whole blocks, paired between arms, under
pytest-xdist), and the arm's knee is the mean over its boots.

The KV-residency knee (metric ``kv_residency``) is read the same way from each level's residency verdict (its
prefix-cache hit rate over all its trials at least half): its replicates resample the turns' cached tokens
(``Level.holds_many``), its ratio is the two arms' residency knees in the same replicates, and
:func:`knee_bound` reads from both knees what bound the SLO's.

Plain Python (numpy, pandas): reads records only.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import pandas as pd

from pytest_kvcache import stats
from pytest_kvcache.config.budget import fmt_bytes
from pytest_kvcache.metrics import catalogue
from pytest_kvcache.model import (
    CapacityRow,
    CapacitySection,
    CapacityTrialRow,
    Comparison,
    DeltaRow,
    Evidence,
    Json,
    Record,
)
from pytest_kvcache.model.evidence import kv_capacity_tokens
from pytest_kvcache.probes import capacity as probe
from pytest_kvcache.probes.registry import depth_label
from pytest_kvcache.report import deciding
from pytest_kvcache.report.outputs.formats import _md_table
from pytest_kvcache.report.points import MIN_BOOTS_FOR_BOOT_CI, point_sort, provisional_note

if TYPE_CHECKING:
    from matplotlib.figure import Figure

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
    slo: probe.Slo
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


def _judge(
    ttft: np.ndarray, itl: np.ndarray, tokens: np.ndarray, slo: probe.Slo, window_s: float
) -> probe.TrialFigures:
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
            slo = probe.parse_slo(str(info.get("slo")))
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


# ------------------------------------------------------------------------------------------ statistics


def _units(group: pd.DataFrame, metric: str = METRIC) -> list[tuple[object, Search]]:
    """(block, search) of every boot in a frame slice that has a judged search (with a knee for ``metric``: the
    residency knee needs a hit rate)."""
    if group.empty or "search" not in group:
        return []
    out = []
    for _, row in group.iterrows():
        found = row.get("search")
        if isinstance(found, Search) and found.judged and bool(row.get("valid")) and found.knee_of(metric) is not None:
            out.append((row.get("block", 0) if "block" in group else 0, found))
    return out


def _knee(s: Search, metric: str) -> float:
    return float(s.knee_of(metric) or 0)


def _resample(
    base: list[tuple[object, np.ndarray]], arm: list[tuple[object, np.ndarray]], rng: np.random.Generator
) -> np.ndarray:
    """Replicates of the ratio of the arms' knees (boots × replicates arrays): whole blocks paired between the
    arms when both sides carry the same two or more blocks (pytest-xdist), else each side's boots resampled."""
    count = base[0][1].size
    blocks = sorted({b for b, _ in base} & {b for b, _ in arm}, key=str)
    if len(blocks) >= 2 and all(b not in (0, None) for b, _ in [*base, *arm]):
        per_block = []
        for block in blocks:
            b = np.mean([d for k, d in base if k == block], axis=0)
            a = np.mean([d for k, d in arm if k == block], axis=0)
            per_block.append(a / np.where(b > 0, b, np.nan))
        table = np.stack(per_block)
        picks = rng.integers(0, len(blocks), size=(count, len(blocks)))
        return np.asarray(np.nanmean(table[picks, np.arange(count)[:, None]], axis=1))

    def side(units: list[tuple[object, np.ndarray]]) -> np.ndarray:
        table = np.stack([d for _, d in units])
        if len(units) == 1:
            return np.asarray(table[0])
        picks = rng.integers(0, len(units), size=(count, len(units)))
        return np.asarray(table[picks, np.arange(count)[:, None]].mean(axis=1))

    b, a = side(base), side(arm)
    return np.asarray(a / np.where(b > 0, b, np.nan))


def _percentiles(values: np.ndarray) -> tuple[float | None, float | None]:
    """The 2.5% and 97.5% percentiles by nearest rank: each a replicate's value (a tried level, a ratio of two,
    or a mean of them over boots), never one interpolated between two."""
    values = values[np.isfinite(values)]
    if values.size == 0:
        return None, None
    tail = 100 * (1 - stats.CONFIDENCE) / 2
    lo, hi = np.percentile(values, [tail, 100 - tail], method="inverted_cdf")
    return float(lo), float(hi)


def unmeasured(units: Sequence[tuple[object, Search]], metric: str = METRIC) -> str | None:
    """Why an arm's capacity (or residency knee) has no interval: one boot whose search did not try the knee and
    the levels either side of it ``MIN_TRIALS`` times each (``Search.unmeasured``); None: it has one (several
    boots: over them)."""
    if len(units) != 1:
        return None
    return units[0][1].unmeasured(metric)


def compare(base: pd.DataFrame, other: pd.DataFrame, metric: str, *, seed: int) -> Comparison:
    """``report.frame.compare`` for the capacity: the ratio of the arms' knees (means over boots) and its
    bootstrap CI: the ratio of the two arms' knees in each replicate (turns resampled in every trial, each a
    tried level; boots resampled too). No CI where a one-boot side's knee was not tried enough
    (:func:`unmeasured`; ``ci_note`` says why). From 2 boots on a side, the pooled SD of the log knees
    (``boot_sd``: the run's own spread, ``report.spread``)."""
    bu, au = _units(base, metric), _units(other, metric)
    base_value = float(np.mean([_knee(s, metric) for _, s in bu])) if bu else None
    arm_value = float(np.mean([_knee(s, metric) for _, s in au])) if au else None
    ratio = arm_value / base_value if base_value and arm_value is not None else None
    lo = hi = None
    note = None
    if ratio is not None:
        why = [f"{s.arm}: {said}" for side in (bu, au) if (said := unmeasured(side, metric)) for _, s in side]
        if why:
            note = "no interval: " + "; ".join(why)
        else:
            rng = np.random.default_rng(seed)
            replicates = _resample(
                [(b, s.draws_of(metric, seed)) for b, s in bu], [(b, s.draws_of(metric, seed)) for b, s in au], rng
            )
            lo, hi = _percentiles(replicates)
    method = "boots" if len(bu) >= MIN_BOOTS_FOR_BOOT_CI and len(au) >= MIN_BOOTS_FOR_BOOT_CI else "within-boot"
    verdict = stats.verdict(metric, lo, hi)
    found: Comparison = {
        "baseline_value": base_value,
        "arm_value": arm_value,
        "ratio": ratio,
        "delta_pct": (ratio - 1) * 100 if ratio is not None else None,
        "ci_low": lo,
        "ci_high": hi,
        "paired": False,
        "ci_method": method,
        "n_baseline": sum(int(t.ttft.size) for _, s in bu for t in s.judged),
        "n_arm": sum(int(t.ttft.size) for _, s in au for t in s.judged),
        "boots_baseline": len(bu),
        "boots_arm": len(au),
        "direction": catalogue.direction(metric),
        "verdict": verdict,
        "censored": any(s.censored_of(metric) for _, s in [*bu, *au]),
    }
    if note:
        found["ci_note"] = note
    spread = stats.pooled_log_sd([[_knee(s, metric)] for _, s in bu], [[_knee(s, metric)] for _, s in au])
    if spread is not None:  # the run's own boot-to-boot spread of the knee (report.spread), from 2 boots on a side
        found["boot_sd"], found["boot_df"] = spread
    if method == "within-boot" and verdict != "inconclusive":
        found["provisional"] = provisional_note(max(1, min(len(bu), len(au))))
    return found


def capacity_ci(
    group: pd.DataFrame, seed: int, metric: str = METRIC
) -> tuple[float | None, float | None, float | None, str]:
    """An arm's capacity (or residency knee: ``metric``; mean over its boots), its CI (nearest-rank percentiles
    of the replicates' knees, boots resampled too; none where :func:`unmeasured` says why) and the CI's method,
    for the section and absolute gates (``capacity[capacity@2k]: >= 6``)."""
    units = _units(group, metric)
    if not units:
        return None, None, None, "within-boot"
    value = float(np.mean([_knee(s, metric) for _, s in units]))
    method = "boots" if len(units) >= MIN_BOOTS_FOR_BOOT_CI else "within-boot"
    if unmeasured(units, metric):
        return value, None, None, method
    table = np.stack([s.draws_of(metric, seed) for _, s in units])
    if len(units) > 1:
        rng = np.random.default_rng(seed)
        picks = rng.integers(0, len(units), size=(table.shape[1], len(units)))
        table = table[picks, np.arange(table.shape[1])[:, None]].T
    lo, hi = _percentiles(table.mean(axis=0))
    return value, lo, hi, method


# ------------------------------------------------------------------------------------------ the section


def _num(value: Any) -> float | None:
    """A finite number, from a number or its text (``/metrics`` labels are text); None otherwise."""
    try:
        found = float(value) if isinstance(value, int | float | str) else math.nan
    except ValueError:
        return None
    return found if math.isfinite(found) else None


def trial_row(s: Search, t: Trial, seed: int) -> CapacityTrialRow:
    fig = t.figures
    hit, source = t.hit_rate
    lo, hi = t.goodput_ci(seed)
    engine = t.info.get("engine") or {}
    verdict = "excluded" if t.excluded_reason else "meets" if fig.meets else "breaks"
    return {
        "arm": s.arm,
        "boot": s.boot,
        "point": s.point,
        "depth": s.depth,
        "trial": t.index,
        "sessions": t.sessions,
        "step": t.step,
        "verdict": verdict,
        "turns": fig.turns,
        "failed": fig.failed,
        "context_tokens": t.context_tokens,
        "ttft_p50_s": fig.ttft_p50_s,
        "ttft_p95_s": fig.ttft_p95_s,
        "itl_p50_s": fig.itl_p50_s,
        "itl_p95_s": fig.itl_p95_s,
        "goodput_tps": fig.goodput_tps,
        "goodput_ci": [lo, hi],
        "hit_rate": hit,
        "hit_rate_source": source,
        "preemptions": int(engine["preemptions"]) if isinstance(engine.get("preemptions"), int | float) else None,
        "kv_usage_mean": _num(t.info.get("kv_usage_mean")),
        "kv_usage_max": _num(t.info.get("kv_usage_max")),
        "excluded_reason": t.excluded_reason,
        "broken": fig.broken,
        "slo_values": fig.terms,
    }


def _dropped(at: Level | None, broke: Level | None) -> bool | None:
    """Whether the hit rate fell by more than ``KV_BOUND_DROP`` from the capacity to the first level over (or the
    engine preempted more there, per trial); None: a rate unknown."""
    if at is None or broke is None:
        return None
    before, after = at.hit_rate[0], broke.hit_rate[0]
    if before is None or after is None:
        return None
    preempted = [level.preemptions for level in (at, broke)]
    more = (
        preempted[0] is not None
        and preempted[1] is not None
        and preempted[1] / len(broke.trials) > preempted[0] / len(at.trials)  # per trial: levels differ in trials
    )
    return before - after > KV_BOUND_DROP or more


def knee_bound(s: Search | None) -> tuple[str, str]:
    """What bound the SLO's knee, as a cause (``kv``, ``compute``, ``unknown``) and in words, from the two knees
    (S: the capacity, broke at S + …; R: the residency knee, the hit rate below half at R_b):

    - the SLO broke at a level the cache still held (S_b ≤ R): ``compute`` — "the cache held them; re-prefill or
      decode broke the SLO" — unless the hit rate still fell by more than ``KV_BOUND_DROP`` from S to S_b (or
      the engine preempted more there): then ``kv``, the part of the prefixes evicted broke it;
    - the SLO was met at a level the cache no longer held (S ≥ R_b): ``compute`` — re-prefilling what missed kept
      the SLO up past the cache's knee, until the compute ran out;
    - else the SLO broke where the cache stopped holding the sessions: ``kv`` — "the cache holds R sessions".

    Without a hit rate the cause is the hit-rate drop alone (``unknown`` without one); with no level over the
    SLO, ``unknown``."""
    if s is None or s.first_broken is None:
        return "unknown", ""
    at, broke = s.level_at(s.capacity), s.level_at(s.first_broken)
    drop = _dropped(at, broke)
    r, r_broke = s.residency, s.residency_broken
    capacity, first = s.capacity, s.first_broken
    fell = ""
    if at is not None and broke is not None and drop is not None:
        fell = f"the hit rate went from {_pct(at.hit_rate[0])} at {capacity} to {_pct(broke.hit_rate[0])} at {first}"
    if r is None:
        if drop is None:
            return "unknown", ""
        return ("kv", f"KV ({fell})") if drop else ("compute", f"compute ({fell})")
    if first <= r:
        if drop:
            return "kv", f"KV (the cache holds {r} sessions, but {fell}: re-prefilling what it lost broke the SLO)"
        held = f"{_pct(broke.hit_rate[0])} hits at {first}" if broke is not None else f"at {first}"
        return "compute", f"compute (the cache held them, {held}; re-prefill or decode broke the SLO)"
    if r_broke is not None and capacity >= r_broke:
        return "compute", (
            f"compute (the cache holds {r} sessions; past them re-prefill kept the SLO up to {capacity} sessions)"
        )
    return "kv", f"KV (the cache holds {r} sessions)"


def section(
    data: pd.DataFrame,
    arms: Sequence[str],
    deltas: Sequence[DeltaRow],
    evidence: Mapping[str, Evidence],
    settings: Mapping[str, Json],
    seed: int,
) -> CapacitySection:
    """The report's capacity section: per arm and depth the capacity, its bracket and its CI, the ratio to the
    baseline (the delta the gates judge), the KV each arm had, the figures at the knee; every trial; notes."""
    config: dict[str, Json] = {
        key: settings.get(key)
        for key in (
            "slo",
            "capacity_depths",
            "capacity_think_s",
            "capacity_window_s",
            "capacity_max_tokens",
            "capacity_max_sessions",
            "capacity_start",
            "capacity_trials",
            "cache_bytes",
        )
    }
    out: CapacitySection = {"config": config, "rows": [], "trials": [], "notes": []}
    sub = data[data["probe"] == PROBE] if not data.empty and "probe" in data else pd.DataFrame()
    if sub.empty:
        return out
    ratios = {(d["arm"], d["point"]): d for d in deltas if d["probe"] == PROBE and d["metric"] == METRIC}
    kv_ratios = {(d["arm"], d["point"]): d for d in deltas if d["probe"] == PROBE and d["metric"] == RESIDENCY_METRIC}

    for point in sorted(sub["point"].unique(), key=point_sort):
        for arm in arms:
            group = sub[(sub["point"] == point) & (sub["arm"] == arm)]
            found = _units(group)
            units = [s for _, s in found]
            all_searches = [s for s in group["search"] if isinstance(s, Search)] if "search" in group else []
            for s in all_searches:
                out["trials"] += [trial_row(s, t, seed) for t in sorted(s.trials, key=lambda t: t.index)]
            if not all_searches:
                continue
            value, lo, hi, method = capacity_ci(group, seed)
            held, held_lo, held_hi, _ = capacity_ci(group, seed, RESIDENCY_METRIC)
            tokens = [kv_capacity_tokens(evidence[s.boot]) for s in all_searches if s.boot in evidence]
            budgets = [
                _num((evidence[s.boot].get("cache_config") or {}).get("kv_cache_memory_bytes"))
                for s in all_searches
                if s.boot in evidence
            ]
            first = units[0] if units else None
            at = first.level_at(first.capacity) if first else None
            broke = first.level_at(first.first_broken) if first else None
            delta = ratios.get((arm, point))
            kv_delta = kv_ratios.get((arm, point))
            brackets = [cast("dict[str, Json]", s.bracket()) for s in units]
            resident = [s for _, s in _units(group, RESIDENCY_METRIC)]
            kv_brackets = [cast("dict[str, Json]", s.bracket(RESIDENCY_METRIC)) for s in resident]
            cause, bound = knee_bound(first)
            row: CapacityRow = {
                "arm": arm,
                "point": str(point),
                "depth": all_searches[0].depth,
                "boots": len(units),
                "capacity": value,
                "capacity_ci": [lo, hi],
                "censored": any(s.censored for s in units),
                "ratio": delta.get("ratio") if delta else None,
                "ratio_ci": [delta.get("ci_low"), delta.get("ci_high")] if delta else [None, None],
                "ci_method": method,
                "brackets": brackets,
                "bracket": bracket_text(brackets),
                "kv_tokens": int(np.mean([t for t in tokens if t])) if any(tokens) else None,
                "kv_budget_bytes": int(b) if (b := next((x for x in budgets if x), None)) else None,
                "trials": sum(len(s.trials) for s in all_searches),
                "knee_cause": cause,
                "knee_bound": bound,
                "residency": held,
                "residency_ci": [held_lo, held_hi],
                "residency_censored": any(s.residency_censored for s in resident),
                "residency_brackets": kv_brackets,
                "residency_bracket": bracket_text(
                    kv_brackets, held="held", fell="hit rate below half", none_fell="none below half"
                ),
                "residency_ratio": kv_delta.get("ratio") if kv_delta else None,
                "residency_ratio_ci": [kv_delta.get("ci_low"), kv_delta.get("ci_high")] if kv_delta else [None, None],
                "at_capacity": _figures(at),
                "first_broken": {"sessions": broke.sessions if broke else None, **_figures(broke)},
            }
            if (why := unmeasured(found)) is not None:
                row["interval_note"] = why
            if resident and (why := unmeasured(_units(group, RESIDENCY_METRIC), RESIDENCY_METRIC)) is not None:
                row["residency_interval_note"] = why
            if broke is not None:
                row["first_broken"]["broken"] = cast(Json, broke.figures.broken)
            out["rows"].append(row)
    out["notes"] = _notes(out["rows"], out["trials"])
    return out


def _figures(level: Level | None) -> dict[str, float | None]:
    """A level's figures over all its trials: the SLO's percentiles and goodput over their turns, the hit rate
    over their windows, the largest KV usage seen, the preemptions summed."""
    if level is None:
        return {}
    fig = level.figures
    return {
        "ttft_p95_s": fig.ttft_p95_s,
        "itl_p95_s": fig.itl_p95_s,
        "goodput_tps": fig.goodput_tps,
        "hit_rate": level.hit_rate[0],
        "kv_usage_max": level.kv_usage_max,
        "preemptions": level.preemptions,
    }


def _notes(rows: Sequence[CapacityRow], trials: Sequence[CapacityTrialRow]) -> list[str]:
    notes = []
    excluded = [t for t in trials if t["verdict"] == "excluded"]
    if excluded:
        named = "; ".join(
            f"{t['boot']} {t['point']} {t['sessions']} sessions ({t['excluded_reason']})" for t in excluded[:4]
        )
        notes.append(f"{len(excluded)} capacity trial(s) excluded and tried again: {named}")
    for r in rows:
        if r.get("interval_note"):
            notes.append(
                f"{r['arm']} at {r['point']}: no interval for its capacity or its ratio — {r['interval_note']}"
            )
        if r.get("censored"):
            notes.append(
                f"{r['arm']} at {r['point']}: no level tried broke the SLO; its capacity is at least "
                f"{count(r.get('capacity'))} (--kv-capacity-max-sessions)"
            )
        if r.get("residency_censored"):
            notes.append(
                f"{r['arm']} at {r['point']}: the hit rate never fell below half; the cache holds at least "
                f"{count(r.get('residency'))} sessions (--kv-capacity-max-sessions)"
            )
        if r.get("residency_interval_note"):
            notes.append(
                f"{r['arm']} at {r['point']}: no interval for its KV-residency knee — {r['residency_interval_note']}"
            )
        if r.get("knee_bound"):
            notes.append(f"{r['arm']} at {r['point']}: the knee is bound by {r['knee_bound']}")
    return notes


def _pct(value: object) -> str:
    return f"{100 * float(cast(float, value)):.0f}%" if isinstance(value, int | float) else "–"


def count(value: float | None) -> str:
    """A capacity as it reads: ``7``, or ``6.7`` when boots disagree (a mean)."""
    if value is None:
        return "–"
    return f"{value:.0f}" if abs(value - round(value)) < 1e-9 else f"{value:.1f}"


def _ci(lo: float | None, hi: float | None, digits: str = ".0f") -> str:
    return f" [{lo:{digits}}, {hi:{digits}}]" if lo is not None and hi is not None else ""


def _span(values: Sequence[Any]) -> str:
    """``[6, 7, 6]`` → "6–7"; ``[6, 6]`` → "6"."""
    found = sorted({int(v) for v in values})
    return str(found[0]) if len(found) == 1 else f"{found[0]}–{found[-1]}"


def bracket_text(
    brackets: Sequence[Mapping[str, Any]], held: str = "met", fell: str = "broke", none_fell: str = "none broke"
) -> str:
    """The last level that met the SLO and the first that broke it, in words: one boot "met at 6, broke at 7; 2
    trials each" (or "2 and 3 trials"; "none met" when the first level broke, "none broke" when none did),
    several boots "met at 6–7, broke at 7–8 over 3 boots". ``held``/``fell``/``none_fell`` name the two sides
    (for the residency knee: "held at 7, hit rate below half at 8"; "none below half")."""
    if not brackets:
        return ""
    if len(brackets) > 1:
        mets = [b.get("met") or 0 for b in brackets]
        brokes = [b["broke"] for b in brackets if b.get("broke")]
        first = f"{held} at {_span(mets)}" if any(mets) else f"none {held}"
        if any(not m for m in mets) and any(mets):
            first = f"{held} at {_span([m for m in mets if m])} (none in {sum(not m for m in mets)})"
        over = f"{fell} at {_span(brokes)}" if brokes else none_fell
        if brokes and len(brokes) < len(brackets):
            over += f" (none in {len(brackets) - len(brokes)})"
        return f"{first}, {over} over {len(brackets)} boots"
    b = brackets[0]
    met, broke = b.get("met") or 0, b.get("broke")
    trials = {int(k): int(v) for k, v in (b.get("trials") or {}).items()}
    words = [f"{held} at {met}" if met else f"none {held}", f"{fell} at {broke}" if broke else none_fell]
    counts = [trials.get(n, 0) for n in (met, broke) if n]
    if len(counts) == 2 and counts[0] != counts[1]:
        tried = f"{counts[0]} and {counts[1]} trials"
    elif counts:
        tried = f"{counts[0]} trial{'' if counts[0] == 1 else 's'}{' each' if len(counts) == 2 else ''}"
    else:
        tried = ""
    return ", ".join(words) + (f"; {tried}" if tried else "")


def _ratio_text(r: CapacityRow, delta: Mapping[str, Any] | None, prefix: str = "") -> str:
    """The ratio of the knees with the interval that judged it: within boots widened by the capacity's spread
    (``report.spread``), else its own CI; "no interval" where a side's knee was not tried enough. ``prefix``
    ``residency_``: the residency knees' ratio."""
    ratio = cast("float | None", r.get(f"{prefix}ratio"))
    if ratio is None:  # compared, with a knee of 0; or not compared (a run recorded before its metric existed)
        return "no ratio (0 sessions)" if delta is not None else "no ratio"
    lo, hi = cast("list[float | None]", r.get(f"{prefix}ratio_ci") or [None, None])
    if lo is None or hi is None:
        return f"{ratio:.2f}× (no interval)"
    if delta is not None and deciding.widened(delta):
        dlo, dhi, _ = deciding.deciding(delta)
        short = str((delta.get("spread") or {}).get("text") or "a boot-to-boot spread").split(" (", 1)[0]
        within = f"[{lo:.2f}, {hi:.2f}] within boots"
        return f"{ratio:.2f}× [{dlo:.2f}, {dhi:.2f}] (the knees' ratio, {within}, widened by {short})"
    return f"{ratio:.2f}×{_ci(lo, hi, '.2f')}"


def sentences(section: CapacitySection, arms: Sequence[str], deltas: Sequence[DeltaRow]) -> list[str]:
    """One sentence per arm: ``fp8 sustains 7 [6, 8] sessions at 16k (met at 7, broke at 8; 2 trials each) vs
    auto's 3 [3, 4] (met at 3, broke at 4; 2 trials each): 2.33× [1.75, 3.10] (…)`` (each depth, under the SLO;
    the ratio with the interval that judged it; provisional when that is within one boot per arm), then where
    the engine has a hit rate the KV-residency knee beside it, with its ratio to the baseline's, and what bound the
    SLO's knee: ``…; its cache holds 14 [14, 14] sessions (held at 14, hit rate below half at 15; 2 trials each)
    vs auto's 7 [7, 7] (…): 2.00× [1.31, 3.06] (…); knee bound by compute (the cache held them, 93% hits at 10;
    re-prefill or decode broke the SLO)``."""
    rows = section["rows"]
    slo = section["config"].get("slo")
    out = []
    by = {(r["arm"], r["point"]): r for r in rows}

    def sessions(r: CapacityRow, unit: str = "") -> str:
        lo, hi = r.get("capacity_ci") or [None, None]
        at_least = "≥ " if r.get("censored") else ""
        said = [str(r.get("bracket") or "")] + (["no interval"] if r.get("interval_note") else [])
        bracket = "; ".join(x for x in said if x)
        return f"{at_least}{count(r.get('capacity'))}{_ci(lo, hi)}{unit}" + (f" ({bracket})" if bracket else "")

    def resident(r: CapacityRow, unit: str = "") -> str:
        lo, hi = r.get("residency_ci") or [None, None]
        at_least = "≥ " if r.get("residency_censored") else ""
        said = [str(r.get("residency_bracket") or "")] + (["no interval"] if r.get("residency_interval_note") else [])
        bracket = "; ".join(x for x in said if x)
        return f"{at_least}{count(r.get('residency'))}{_ci(lo, hi)}{unit}" + (f" ({bracket})" if bracket else "")

    def delta_of(arm: str, point: str, metric: str) -> DeltaRow | None:
        return next(
            (
                d
                for d in deltas
                if d["probe"] == PROBE and d["arm"] == arm and d["point"] == point and d["metric"] == metric
            ),
            None,
        )

    base = arms[0] if arms else None
    for arm in arms:
        mine = [r for r in rows if r["arm"] == arm]
        if not mine or (arm == base and len(arms) > 1):
            continue
        parts = []
        notes = set()
        for r in mine:
            text = sessions(r, f" session{'s' if r.get('capacity') != 1 else ''} at {r['point']}")
            other = by.get((base, r["point"])) if base and arm != base else None
            if other is not None:
                delta = delta_of(arm, r["point"], METRIC)
                text += f" vs {base}'s {sessions(other)}: {_ratio_text(r, delta)}"
                if delta and delta.get("provisional"):
                    notes.add(str(delta["provisional"]))
            if r.get("residency") is not None:  # the KV-residency knee beside it, and what bound the SLO's knee
                text += f"; its cache holds {resident(r, ' sessions')}"
                if other is not None and other.get("residency") is not None:
                    kv_delta = delta_of(arm, r["point"], RESIDENCY_METRIC)
                    text += f" vs {base}'s {resident(other)}: {_ratio_text(r, kv_delta, 'residency_')}"
            if r.get("knee_bound"):
                text += f"; knee bound by {r['knee_bound']}"
            parts.append(text)
        tail = f" — provisional ({sorted(notes)[0]})" if notes else ""
        out.append(f"{arm} sustains " + "; ".join(parts) + f" under {slo}{tail}.")
    return out


# ------------------------------------------------------------------------------------------ tables


def table(section: CapacitySection | None) -> tuple[list[str], list[list[str]]]:
    """The capacity table: per depth and arm, sessions [CI], its bracket (the last level met, the first broken,
    their trials), the ratio of the knees to the baseline's, the KV each arm had, the figures at the knee (over
    its trials) and past it."""
    header = [
        "Depth",
        "Arm",
        "Sessions [95% CI]",
        "Met – broke (trials)",
        "vs baseline: knees' ratio [95% CI]",
        "KV-resident sessions [95% CI] (held – fell below half)",
        "vs baseline: residency ratio [95% CI]",
        "KV tokens (budget)",
        "At capacity: TTFT p95 / ITL p95 / goodput / hit rate",
        "First level over: sessions, TTFT p95, hit rate, preemptions",
        "Knee bound by",
    ]
    rows = []
    for r in section["rows"] if section else []:
        lo, hi = r.get("capacity_ci") or [None, None]
        ratio, (rlo, rhi) = r.get("ratio"), (r.get("ratio_ci") or [None, None])
        at, broke = r.get("at_capacity") or {}, r.get("first_broken") or {}
        budget = r.get("kv_budget_bytes")
        tokens = r.get("kv_tokens")
        kv = f"{tokens:,}" if tokens else "–"
        if budget:
            kv += f" ({fmt_bytes(budget)})"
        rows.append(
            [
                r["point"],
                r["arm"],
                ("≥ " if r.get("censored") else "")
                + count(r.get("capacity"))
                + (_ci(lo, hi) if lo is not None else " (no interval)" if r.get("interval_note") else ""),
                str(r.get("bracket") or "–"),
                (f"{ratio:.2f}×" + (_ci(rlo, rhi, ".2f") if rlo is not None else " (no interval)"))
                if ratio is not None
                else "–",
                _resident_cell(r),
                _ratio_cell(r.get("residency_ratio"), r.get("residency_ratio_ci")),
                kv,
                " / ".join(
                    [
                        _ms(at.get("ttft_p95_s")),
                        _ms(at.get("itl_p95_s")),
                        f"{at['goodput_tps']:.0f} tok/s" if at.get("goodput_tps") is not None else "–",
                        _pct(at.get("hit_rate")),
                    ]
                ),
                ", ".join(
                    [
                        str(broke.get("sessions")) if broke.get("sessions") else "none",
                        _ms(cast("float | None", broke.get("ttft_p95_s"))),
                        _pct(broke.get("hit_rate")),
                        f"{broke['preemptions']:.0f}" if isinstance(broke.get("preemptions"), int | float) else "–",
                    ]
                ),
                str(r.get("knee_cause") or "unknown"),
            ]
        )
    return header, rows


def _resident_cell(r: CapacityRow) -> str:
    """The residency knee, its CI and its bracket, as the table shows them."""
    if r.get("residency") is None:
        return "–"
    lo, hi = r.get("residency_ci") or [None, None]
    said = ("≥ " if r.get("residency_censored") else "") + count(r.get("residency"))
    said += _ci(lo, hi) if lo is not None else " (no interval)" if r.get("residency_interval_note") else ""
    return said + (f" ({r['residency_bracket']})" if r.get("residency_bracket") else "")


def _ratio_cell(ratio: float | None, ci: Sequence[float | None] | None) -> str:
    if ratio is None:
        return "–"
    lo, hi = ci or [None, None]
    return f"{ratio:.2f}×" + (_ci(lo, hi, ".2f") if lo is not None else " (no interval)")


def _ms(value: float | None) -> str:
    if value is None:
        return "–"
    return f"{value:.2f} s" if value >= 1 else f"{value * 1000:.0f} ms"


def trials_table(section: CapacitySection | None) -> tuple[list[str], list[list[str]]]:
    """Every trial of every search, in order."""
    header = [
        "Boot",
        "Depth",
        "Trial",
        "Sessions",
        "Step",
        "Verdict",
        "Turns (failed)",
        "Context",
        "TTFT p50 / p95",
        "ITL p50 / p95",
        "Goodput tok/s [95% CI]",
        "Hit rate",
        "Preemptions",
        "KV usage mean / max",
    ]
    rows = []
    for t in section["trials"] if section else []:
        lo, hi = t.get("goodput_ci") or [None, None]
        verdict = str(t["verdict"]) + (f": {'; '.join(t['broken'])}" if t.get("broken") else "")
        if t.get("excluded_reason"):
            verdict = f"excluded: {t['excluded_reason']}"
        rows.append(
            [
                t["boot"],
                t["point"],
                str(t["trial"]),
                str(t["sessions"]),
                t["step"],
                verdict,
                f"{t['turns']} ({t['failed']})",
                f"{t['context_tokens']:,.0f}" if t.get("context_tokens") is not None else "–",
                f"{_ms(t.get('ttft_p50_s'))} / {_ms(t.get('ttft_p95_s'))}",
                f"{_ms(t.get('itl_p50_s'))} / {_ms(t.get('itl_p95_s'))}",
                (f"{t['goodput_tps']:.0f}" if t.get("goodput_tps") is not None else "–") + _ci(lo, hi),
                _pct(t.get("hit_rate")) + (" (usage)" if t.get("hit_rate_source") == "usage" else ""),
                str(t["preemptions"]) if t.get("preemptions") is not None else "–",
                f"{_pct(t.get('kv_usage_mean'))} / {_pct(t.get('kv_usage_max'))}",
            ]
        )
    return header, rows


def setup_line(section: CapacitySection | None) -> str:
    """The search's setup in one sentence."""
    if not section:
        return ""
    c = section["config"]
    budget = c.get("cache_bytes")
    kv = "each arm's own KV cache (no --kv-cache-bytes)"
    if isinstance(budget, int):
        kv = f"a KV budget of {fmt_bytes(budget)} per arm"
    trials = c.get("capacity_trials")
    confirm = ""
    if isinstance(trials, int) and trials > 1:  # a run made before --kv-capacity-trials had no re-trials
        confirm = f", then each knee and the levels either side of it tried {trials} times each"
    return (
        f"SLO {c.get('slo')} over each level's measured turns; sessions stepped up from {c.get('capacity_start')} "
        f"(doubling, at most {c.get('capacity_max_sessions')}) then bisected, to the SLO's knee and to the KV "
        f"residency's (the prefix-cache hit rate at least half){confirm}; each trial measured for "
        f"{c.get('capacity_window_s')} s after its sessions are warm, think time {c.get('capacity_think_s')} s "
        f"(uniform ±50%), {c.get('capacity_max_tokens')} tokens a turn; {kv}."
    )


NOTE = (
    "Capacity: the largest number of concurrent sessions whose measured turns met every term of the SLO, at that "
    "number and every smaller one tried; a level tried more than once is judged over all its trials' turns. "
    "Met – broke: the last level that met the SLO and the first that broke it — where between them it broke is "
    "not measured. CI: turns resampled within each trial (and boots), each level judged again, the knee read as "
    "the search did: always a level that was tried; at one boot only when the knee and the levels either side of "
    "it were tried twice each. A ratio is the ratio of the two arms' knees in the same replicates "
    "(docs/probes/capacity.md). KV-resident sessions: the largest number whose prefix-cache hit rate (over all "
    "the level's trials) was at least half, at that number and every smaller one tried — found by the same search "
    "and bootstrap. Knee bound by: KV where the SLO broke where the cache stopped holding the sessions (or its hit "
    "rate fell by more than 5 points past the knee), compute where the cache held them. Goodput: tokens/s of the "
    "turns that met the SLO."
)


def lines(report: Mapping[str, Any]) -> list[str]:
    """report.md's capacity section."""
    found = cast("CapacitySection | None", report.get("capacity"))
    if not found or not found["rows"]:
        return []

    out = ["", "## Capacity under the SLO", "", setup_line(found), ""]
    out += _md_table(*table(found))
    out += ["", "Trials:", ""]
    out += _md_table(*trials_table(found))
    out += ["", NOTE]
    out += [f"- {n}" for n in found["notes"]]
    return out


# ------------------------------------------------------------------------------------------ the plot


def figures(report: Mapping[str, Any], plt: Any) -> dict[str, Figure]:
    """``capacity_<depth>.png`` per depth: goodput against sessions (one curve per arm, its CI band, each arm's
    capacity dotted), then each SLO term's value against sessions with the term's bound as a line."""
    found = cast("CapacitySection | None", report.get("capacity"))
    if not found or not found["trials"]:
        return {}
    try:
        slo = probe.parse_slo(str(found["config"].get("slo")))
    except ValueError:
        slo = probe.Slo(())
    arms = [a["name"] for a in report.get("arms") or []]
    trials = pd.DataFrame([t for t in found["trials"] if t["verdict"] != "excluded"])
    out: dict[str, Figure] = {}
    if trials.empty:
        return out
    for point in dict.fromkeys(trials["point"]):
        at = trials[trials["point"] == point]
        panels: list[probe.SloTerm | None] = [None, *slo.terms]  # None: goodput
        fig, axes = plt.subplots(1, len(panels), figsize=(5.4 * len(panels), 3.9), squeeze=False)
        for ax, term in zip(axes[0], panels, strict=True):
            for arm in [a for a in arms if a in set(at["arm"])]:
                grouped = at[at["arm"] == arm].sort_values("sessions").groupby("sessions")
                xs = [float(x) for x in grouped.groups]
                ys = [_level(g, term) for _, g in grouped]
                (line,) = ax.plot(xs, ys, marker="o", label=arm)
                if term is None:
                    lo = [_bound(g["goodput_ci"], 0) for _, g in grouped]
                    hi = [_bound(g["goodput_ci"], 1) for _, g in grouped]
                    ax.fill_between(xs, lo, hi, color=line.get_color(), alpha=0.18, linewidth=0)
                row = next((r for r in found["rows"] if r["arm"] == arm and r["point"] == point), None)
                if row is not None and row.get("capacity"):
                    ax.axvline(float(row["capacity"] or 0), color=line.get_color(), linestyle=":", linewidth=1.2)
            if term is not None:
                ax.axhline(term.limit_s, color="black", linewidth=0.9, linestyle="--", label=f"SLO {term.text()}")
                ax.set_ylabel(f"{term.name} over the trial's turns (s)")
                ax.set_title(f"capacity@{point}: {term.name} (the SLO's bound dashed)")
            else:
                ax.set_ylabel("goodput (tokens/s of turns within the SLO)")
                ax.set_title(f"capacity@{point}: goodput (95% CI band)")
            ax.set_xlabel("concurrent sessions (dotted: each arm's capacity)")
            ax.legend()
        out[f"capacity_{point}.png"] = fig
    return out


def _level(group: pd.DataFrame, term: probe.SloTerm | None) -> float:
    """The mean over a level's trials (boots) of the goodput, or of an SLO term's value (nan: a failed turn)."""
    if term is None:
        values = [float(v) for v in group["goodput_tps"] if v is not None]
    else:
        values = [float((v or {}).get(term.name) or np.nan) for v in group["slo_values"]]
    return float(np.mean(values)) if values else float("nan")


def _bound(cis: Any, side: int) -> float:
    """The widest bound of the trials' goodput CIs at one level (nan when none has a CI)."""
    found = [float(c[side]) for c in cis if c[side] is not None]
    if not found:
        return float("nan")
    return min(found) if side == 0 else max(found)


def caption(name: str) -> str | None:
    if name.startswith("capacity_") and name.endswith(".png"):
        point = name[len("capacity_") : -4]
        return (
            f"Capacity at {point}: goodput against concurrent sessions per arm (95% CI band; dotted: the arm's "
            "capacity), and each SLO term's value against sessions with its bound dashed."
        )
    return None


__all__ = [
    "METRIC",
    "MIN_TRIALS",
    "NOTE",
    "PROBE",
    "RESIDENCY_METRIC",
    "Level",
    "Search",
    "Trial",
    "bracket_text",
    "capacity_ci",
    "caption",
    "compare",
    "count",
    "figures",
    "frame_rows",
    "knee_bound",
    "lines",
    "searches",
    "section",
    "sentences",
    "setup_line",
    "table",
    "trials_table",
    "unmeasured",
]
