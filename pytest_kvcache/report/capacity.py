"""The capacity probe in the report: each boot's search at each depth as one frame row (its capacity), the
capacity's bootstrap CI, the section (a capacity table, every trial, notes), one sentence per arm and a
goodput-vs-sessions plot per depth.

How the CI is built (docs/probes/capacity.md): a replicate resamples every trial's measured turns (with
replacement, as many as it had), judges each trial against its SLO again and reads the knee from the
resampled verdicts as the search did (the largest level such that it and every level below it met the SLO).
Where the SLO broke between that level and the next one tried is not measured: the replicate draws its
continuous knee uniformly in between. The capacity's CI is the percentiles of the replicates' whole capacities;
a ratio between arms is the ratio of their continuous knees, so a one-session step of the search shows in it.
With several boots a replicate also resamples the boots (whole blocks, paired between arms, under
pytest-xdist), and the arm's knee is the mean over its boots.

Plain Python (numpy, pandas): reads records only.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import pandas as pd

from pytest_kvcache import stats
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
from pytest_kvcache.probes import capacity as probe
from pytest_kvcache.probes.registry import depth_label

if TYPE_CHECKING:
    from matplotlib.figure import Figure

PROBE = "capacity"
METRIC = "capacity"
#: A knee whose prefix-cache hit rate fell by more than this (absolute) from the last level that met the SLO
#: to the first that broke it (or whose engine preempted requests there) is "kv"-bound; else "compute"-bound. A
#: p95 bound breaks once ~5% of turns are prefilled from scratch: a drop of 5 points can break it.
KV_BOUND_DROP = 0.05


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

    @cached_property
    def figures(self) -> probe.TrialFigures:
        turns = [
            probe.TurnTimes(float(t), float(i), int(n), bool(math.isfinite(t)))
            for t, i, n in zip(self.ttft, self.itl, self.tokens, strict=True)
        ]
        return probe.judge(turns, self.slo, self.window_s)

    @property
    def hit_rate(self) -> tuple[float | None, str | None]:
        """The prefix-cache hit rate of the window: the engine's counters, else the turns' cached tokens."""
        engine = self.info.get("engine") or {}
        queries, hits = engine.get("prefix_cache_queries"), engine.get("prefix_cache_hits")
        if isinstance(queries, int | float) and isinstance(hits, int | float) and queries > 0:
            return float(hits) / float(queries), "/metrics"
        if self.client_prompt > 0:
            return self.client_cached / self.client_prompt, "usage"
        return None, None

    def meets_many(self, rng: np.random.Generator, count: int) -> np.ndarray:
        """The trial's verdict over ``count`` resamples of its measured turns."""
        n = self.ttft.size
        if n == 0:
            return np.zeros(count, dtype=bool)
        idx = rng.integers(0, n, size=(count, n))
        return probe.meets_many(self.ttft[idx], self.itl[idx], self.slo)

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
        """The trials that have a verdict (not excluded), the last one of a level that was tried again."""
        found: dict[int, Trial] = {}
        for trial in sorted(self.trials, key=lambda t: t.index):
            if trial.excluded_reason is None:
                found[trial.sessions] = trial
        return [found[n] for n in sorted(found)]

    @property
    def verdicts(self) -> dict[int, bool]:
        return {t.sessions: t.figures.meets for t in self.judged}

    @property
    def capacity(self) -> int:
        return probe.knee(self.verdicts)[0]

    @property
    def first_broken(self) -> int | None:
        return probe.knee(self.verdicts)[1]

    @property
    def censored(self) -> bool:
        return bool(self.judged) and self.first_broken is None

    def trial_at(self, sessions: int | None) -> Trial | None:
        return next((t for t in self.judged if t.sessions == sessions), None)

    def draws(self, seed: int, count: int = stats.BOOTSTRAP_SAMPLES) -> tuple[np.ndarray, np.ndarray]:
        """(whole capacity, continuous knee) of ``count`` bootstrap replicates (see the module docstring);
        seeded by the run seed, the boot and the point, so the same folder gives the same CI."""
        rng = np.random.default_rng([seed, zlib.crc32(f"{self.boot}@{self.point}".encode())])
        judged = self.judged
        if not judged:
            empty = np.zeros(count)
            return empty, empty
        meets = np.stack([t.meets_many(rng, count) for t in judged], axis=1)
        return probe.knee_draws([t.sessions for t in judged], meets, rng)


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
        cached = [int((r.get("sample") or {}).get("cached_tokens") or 0) for r in turns if r.get("ok")]
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
                client_cached=sum(cached),
                client_prompt=sum(prompts),
                excluded_reason="; ".join(reasons) or None,
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
                "search": s,
            }
        )
    return rows


# ------------------------------------------------------------------------------------------ statistics


def _units(group: pd.DataFrame) -> list[tuple[object, Search]]:
    """(block, search) of every boot in a frame slice that has a judged search."""
    if group.empty or "search" not in group:
        return []
    out = []
    for _, row in group.iterrows():
        found = row.get("search")
        if isinstance(found, Search) and found.judged and bool(row.get("valid")):
            out.append((row.get("block", 0) if "block" in group else 0, found))
    return out


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
    values = values[np.isfinite(values)]
    if values.size == 0:
        return None, None
    tail = 100 * (1 - stats.CONFIDENCE) / 2
    lo, hi = np.percentile(values, [tail, 100 - tail])
    return float(lo), float(hi)


def compare(base: pd.DataFrame, other: pd.DataFrame, metric: str, *, seed: int) -> Comparison:
    """``report.frame.compare`` for the capacity: the ratio of the arms' capacities (means over boots) and its
    bootstrap CI over turns, the search's resolution and boots (see the module docstring)."""
    from pytest_kvcache.report.frame import MIN_BOOTS_FOR_BOOT_CI, provisional_note

    bu, au = _units(base), _units(other)
    base_value = float(np.mean([s.capacity for _, s in bu])) if bu else None
    arm_value = float(np.mean([s.capacity for _, s in au])) if au else None
    ratio = arm_value / base_value if base_value and arm_value is not None else None
    lo = hi = None
    if ratio is not None:
        rng = np.random.default_rng(seed)
        replicates = _resample([(b, s.draws(seed)[1]) for b, s in bu], [(b, s.draws(seed)[1]) for b, s in au], rng)
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
        "censored": any(s.censored for _, s in [*bu, *au]),
    }
    if method == "within-boot" and verdict != "inconclusive":
        found["provisional"] = provisional_note(max(1, min(len(bu), len(au))))
    return found


def capacity_ci(group: pd.DataFrame, seed: int) -> tuple[float | None, float | None, float | None, str]:
    """An arm's capacity (mean over its boots), its CI (percentiles of the replicates' whole capacities, boots
    resampled too) and the CI's method, for the section and absolute gates (``capacity[capacity@2k]: >= 6``)."""
    from pytest_kvcache.report.frame import MIN_BOOTS_FOR_BOOT_CI

    units = _units(group)
    if not units:
        return None, None, None, "within-boot"
    value = float(np.mean([s.capacity for _, s in units]))
    table = np.stack([s.draws(seed)[0] for _, s in units])
    if len(units) > 1:
        rng = np.random.default_rng(seed)
        picks = rng.integers(0, len(units), size=(table.shape[1], len(units)))
        table = table[picks, np.arange(table.shape[1])[:, None]].T
    lo, hi = _percentiles(table.mean(axis=0))
    return value, lo, hi, "boots" if len(units) >= MIN_BOOTS_FOR_BOOT_CI else "within-boot"


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


def _knee_cause(at: Trial | None, broke: Trial | None) -> str:
    if at is None or broke is None:
        return "unknown"
    before, after = at.hit_rate[0], broke.hit_rate[0]
    if before is None or after is None:
        return "unknown"
    preempted = [(t.info.get("engine") or {}).get("preemptions") for t in (at, broke)]
    more = all(isinstance(p, int | float) for p in preempted) and float(preempted[1] or 0) > float(preempted[0] or 0)
    return "kv" if before - after > KV_BOUND_DROP or more else "compute"


def section(
    data: pd.DataFrame,
    arms: Sequence[str],
    deltas: Sequence[DeltaRow],
    evidence: Mapping[str, Evidence],
    settings: Mapping[str, Json],
    seed: int,
) -> CapacitySection:
    """The report's capacity section: per arm and depth the capacity and its CI, the ratio to the baseline (the
    delta the gates judge), the KV each arm had, the figures at the knee; every trial; notes."""
    from pytest_kvcache.model.evidence import kv_capacity_tokens

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
            "cache_bytes",
        )
    }
    out: CapacitySection = {"config": config, "rows": [], "trials": [], "notes": []}
    sub = data[data["probe"] == PROBE] if not data.empty and "probe" in data else pd.DataFrame()
    if sub.empty:
        return out
    ratios = {(d["arm"], d["point"]): d for d in deltas if d["probe"] == PROBE and d["metric"] == METRIC}
    from pytest_kvcache.report.frame import point_sort

    for point in sorted(sub["point"].unique(), key=point_sort):
        for arm in arms:
            group = sub[(sub["point"] == point) & (sub["arm"] == arm)]
            units = [s for _, s in _units(group)]
            all_searches = [s for s in group["search"] if isinstance(s, Search)] if "search" in group else []
            for s in all_searches:
                out["trials"] += [trial_row(s, t, seed) for t in sorted(s.trials, key=lambda t: t.index)]
            if not all_searches:
                continue
            value, lo, hi, method = capacity_ci(group, seed)
            tokens = [kv_capacity_tokens(evidence[s.boot]) for s in all_searches if s.boot in evidence]
            budgets = [
                _num((evidence[s.boot].get("cache_config") or {}).get("kv_cache_memory_bytes"))
                for s in all_searches
                if s.boot in evidence
            ]
            first = units[0] if units else None
            at = first.trial_at(first.capacity) if first else None
            broke = first.trial_at(first.first_broken) if first else None
            delta = ratios.get((arm, point))
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
                "kv_tokens": int(np.mean([t for t in tokens if t])) if any(tokens) else None,
                "kv_budget_bytes": int(b) if (b := next((x for x in budgets if x), None)) else None,
                "trials": sum(len(s.trials) for s in all_searches),
                "knee_cause": _knee_cause(at, broke),
                "at_capacity": _figures(at),
                "first_broken": {"sessions": broke.sessions if broke else None, **_figures(broke)},
            }
            if broke is not None:
                row["first_broken"]["broken"] = cast(Json, broke.figures.broken)
            out["rows"].append(row)
    out["notes"] = _notes(out["rows"], out["trials"])
    return out


def _figures(trial: Trial | None) -> dict[str, float | None]:
    if trial is None:
        return {}
    fig = trial.figures
    return {
        "ttft_p95_s": fig.ttft_p95_s,
        "itl_p95_s": fig.itl_p95_s,
        "goodput_tps": fig.goodput_tps,
        "hit_rate": trial.hit_rate[0],
        "kv_usage_max": _num(trial.info.get("kv_usage_max")),
        "preemptions": _num((trial.info.get("engine") or {}).get("preemptions")),
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
        if r.get("censored"):
            notes.append(
                f"{r['arm']} at {r['point']}: no level tried broke the SLO; its capacity is at least "
                f"{count(r.get('capacity'))} (--kv-capacity-max-sessions)"
            )
        cause = r.get("knee_cause")
        at, broke = r.get("at_capacity") or {}, r.get("first_broken") or {}
        if cause in ("kv", "compute") and at.get("hit_rate") is not None and broke.get("hit_rate") is not None:
            how = "the KV cache: the prefix-cache hit rate fell" if cause == "kv" else "compute: the hit rate went"
            notes.append(
                f"{r['arm']} at {r['point']}: the knee is bound by {how} from {_pct(at.get('hit_rate'))} at "
                f"{count(r.get('capacity'))} sessions to {_pct(broke.get('hit_rate'))} at {broke.get('sessions')}"
            )
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


def sentences(section: CapacitySection, arms: Sequence[str], deltas: Sequence[DeltaRow]) -> list[str]:
    """One sentence per arm: ``fp8 sustains 7 [6, 8] sessions at 16k vs auto's 3 [3, 4]: 2.33× [1.75, 2.67]``
    (each depth, under the SLO; provisional when the CI is within one boot per arm)."""
    rows = section["rows"]
    slo = section["config"].get("slo")
    out = []
    by = {(r["arm"], r["point"]): r for r in rows}

    def sessions(r: CapacityRow) -> str:
        lo, hi = r.get("capacity_ci") or [None, None]
        at_least = "≥ " if r.get("censored") else ""
        return f"{at_least}{count(r.get('capacity'))}{_ci(lo, hi)}"

    base = arms[0] if arms else None
    for arm in arms:
        mine = [r for r in rows if r["arm"] == arm]
        if not mine or (arm == base and len(arms) > 1):
            continue
        parts = []
        notes = set()
        for r in mine:
            text = f"{sessions(r)} session{'s' if r.get('capacity') != 1 else ''} at {r['point']}"
            other = by.get((base, r["point"])) if base and arm != base else None
            if other is not None:
                ratio = r.get("ratio")
                lo, hi = r.get("ratio_ci") or [None, None]
                shown = f"{ratio:.2f}×{_ci(lo, hi, '.2f')}" if ratio is not None else "no ratio (0 sessions)"
                text += f" vs {base}'s {sessions(other)}: {shown}"
                delta = next(
                    (d for d in deltas if d["probe"] == PROBE and d["arm"] == arm and d["point"] == r["point"]), None
                )
                if delta and delta.get("provisional"):
                    notes.add(str(delta["provisional"]))
            parts.append(text)
        tail = f" — provisional ({sorted(notes)[0]})" if notes else ""
        out.append(f"{arm} sustains " + "; ".join(parts) + f" under {slo}{tail}.")
    return out


# ------------------------------------------------------------------------------------------ tables


def table(section: CapacitySection | None) -> tuple[list[str], list[list[str]]]:
    """The capacity table: per depth and arm, sessions [CI], the ratio to the baseline, the KV each arm had, the
    figures at the knee and past it."""
    header = [
        "Depth",
        "Arm",
        "Sessions [95% CI]",
        "vs baseline [95% CI]",
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
            from pytest_kvcache.config.budget import fmt_bytes

            kv += f" ({fmt_bytes(budget)})"
        rows.append(
            [
                r["point"],
                r["arm"],
                ("≥ " if r.get("censored") else "") + count(r.get("capacity")) + _ci(lo, hi),
                f"{ratio:.2f}×{_ci(rlo, rhi, '.2f')}" if ratio is not None else "–",
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
        from pytest_kvcache.config.budget import fmt_bytes

        kv = f"a KV budget of {fmt_bytes(budget)} per arm"
    return (
        f"SLO {c.get('slo')} over each trial's measured turns; sessions stepped up from {c.get('capacity_start')} "
        f"(doubling, at most {c.get('capacity_max_sessions')}) then bisected; each trial measured for "
        f"{c.get('capacity_window_s')} s after its sessions are warm, think time {c.get('capacity_think_s')} s "
        f"(uniform ±50%), {c.get('capacity_max_tokens')} tokens a turn; {kv}."
    )


NOTE = (
    "Capacity: the largest number of concurrent sessions whose measured turns met every term of the SLO, at that "
    "number and every smaller one tried. CI: turns resampled within each trial (and boots), each trial judged "
    "again, the knee read as the search did; a ratio uses the knee drawn between the last level that met the SLO "
    "and the first that broke it (docs/probes/capacity.md). Goodput: tokens/s of the turns that met the SLO."
)


def lines(report: Mapping[str, Any]) -> list[str]:
    """report.md's capacity section."""
    found = cast("CapacitySection | None", report.get("capacity"))
    if not found or not found["rows"]:
        return []
    from pytest_kvcache.report.outputs.markdown import _md_table

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
    "NOTE",
    "PROBE",
    "Search",
    "Trial",
    "capacity_ci",
    "caption",
    "compare",
    "count",
    "figures",
    "frame_rows",
    "lines",
    "searches",
    "section",
    "sentences",
    "setup_line",
    "table",
    "trials_table",
]
