"""The report's capacity section (a row per arm and depth, every trial, notes) and its first-screen sentences."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import pandas as pd

from pytest_kvcache.model.base import Json
from pytest_kvcache.model.evidence import Evidence, kv_capacity_tokens
from pytest_kvcache.model.report import DeltaRow
from pytest_kvcache.model.sections import CapacityRow, CapacitySection, CapacityTrialRow
from pytest_kvcache.report import deciding
from pytest_kvcache.report.points import point_sort

if TYPE_CHECKING:
    pass
from pytest_kvcache.report.capacity.search import (
    KV_BOUND_DROP,
    METRIC,
    PROBE,
    RESIDENCY_METRIC,
    Level,
    Search,
    Trial,
    _num,
    count,
)
from pytest_kvcache.report.capacity.statistics import _units, capacity_ci, unmeasured


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

    def knee(r: CapacityRow, unit: str = "", prefix: str = "") -> str:  # prefix "residency_": the residency knee
        row = cast("dict[str, Any]", r)
        lo, hi = row.get(f"{prefix}{'ci' if prefix else 'capacity_ci'}") or [None, None]
        at_least = "≥ " if row.get(f"{prefix}censored") else ""
        said = [str(row.get(f"{prefix}bracket") or "")] + (["no interval"] if row.get(f"{prefix}interval_note") else [])
        bracket = "; ".join(x for x in said if x)
        value = row.get(prefix.rstrip("_") or "capacity")
        return f"{at_least}{count(value)}{_ci(lo, hi)}{unit}" + (f" ({bracket})" if bracket else "")

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
            text = knee(r, f" session{'s' if r.get('capacity') != 1 else ''} at {r['point']}")
            other = by.get((base, r["point"])) if base and arm != base else None
            if other is not None:
                delta = delta_of(arm, r["point"], METRIC)
                text += f" vs {base}'s {knee(other)}: {_ratio_text(r, delta)}"
                if delta and delta.get("provisional"):
                    notes.add(str(delta["provisional"]))
            if r.get("residency") is not None:  # the KV-residency knee beside it, and what bound the SLO's knee
                text += f"; its cache holds {knee(r, ' sessions', 'residency_')}"
                if other is not None and other.get("residency") is not None:
                    kv_delta = delta_of(arm, r["point"], RESIDENCY_METRIC)
                    text += f" vs {base}'s {knee(other, '', 'residency_')}: {_ratio_text(r, kv_delta, 'residency_')}"
            if r.get("knee_bound"):
                text += f"; knee bound by {r['knee_bound']}"
            parts.append(text)
        tail = f" — provisional ({sorted(notes)[0]})" if notes else ""
        out.append(f"{arm} sustains " + "; ".join(parts) + f" under {slo}{tail}.")
    return out
