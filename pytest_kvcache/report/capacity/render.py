"""The capacity section as text and pictures: its tables, setup line and notes in Markdown, and the goodput-vs-
sessions plot per depth."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import pandas as pd

from pytest_kvcache.config.budget import fmt_bytes
from pytest_kvcache.config.grammars import Slo, SloTerm, parse_slo
from pytest_kvcache.model.sections import CapacityRow, CapacitySection
from pytest_kvcache.report.capacity.search import count
from pytest_kvcache.report.capacity.section import _ci, _pct
from pytest_kvcache.report.outputs.formats import Column, _md_table, columns

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def table(section: CapacitySection | None) -> tuple[list[str], list[list[str]]]:
    """The capacity table: per depth and arm, sessions [CI], its bracket (the last level met, the first broken,
    their trials), the ratio of the knees to the baseline's, the KV each arm had, the figures at the knee (over
    its trials) and past it."""
    return columns(section["rows"] if section else [], COLUMNS)


def _kv_cell(r: CapacityRow) -> str:
    tokens, budget = r.get("kv_tokens"), r.get("kv_budget_bytes")
    return (f"{tokens:,}" if tokens else "–") + (f" ({fmt_bytes(budget)})" if budget else "")


def _at_capacity_cell(r: CapacityRow) -> str:
    at = r.get("at_capacity") or {}
    goodput = f"{at['goodput_tps']:.0f} tok/s" if at.get("goodput_tps") is not None else "–"
    return " / ".join([_ms(at.get("ttft_p95_s")), _ms(at.get("itl_p95_s")), goodput, _pct(at.get("hit_rate"))])


def _first_broken_cell(r: CapacityRow) -> str:
    broke = r.get("first_broken") or {}
    preemptions = broke.get("preemptions")
    return ", ".join(
        [
            str(broke.get("sessions")) if broke.get("sessions") else "none",
            _ms(cast("float | None", broke.get("ttft_p95_s"))),
            _pct(broke.get("hit_rate")),
            f"{preemptions:.0f}" if isinstance(preemptions, int | float) else "–",
        ]
    )


def _resident_cell(r: CapacityRow) -> str:
    """The residency knee, its CI and its bracket, as the table shows them."""
    if r.get("residency") is None:
        return "–"
    said = _sessions(
        r["residency"], r.get("residency_ci"), r.get("residency_censored"), r.get("residency_interval_note")
    )
    return said + (f" ({r['residency_bracket']})" if r.get("residency_bracket") else "")


def _sessions(knee: float | None, ci: Sequence[float | None] | None, censored: Any, note: Any) -> str:
    """A knee in sessions: "≥" where no level broke, its CI, or why it has none."""
    lo, hi = ci or [None, None]
    return (
        ("≥ " if censored else "") + count(knee) + (_ci(lo, hi) if lo is not None else " (no interval)" if note else "")
    )


def _ratio_cell(ratio: float | None, ci: Sequence[float | None] | None) -> str:
    if ratio is None:
        return "–"
    lo, hi = ci or [None, None]
    return f"{ratio:.2f}×" + (_ci(lo, hi, ".2f") if lo is not None else " (no interval)")


def _ms(value: float | None) -> str:
    if value is None:
        return "–"
    return f"{value:.2f} s" if value >= 1 else f"{value * 1000:.0f} ms"


COLUMNS: tuple[Column, ...] = (
    ("Depth", lambda r: r["point"]),
    ("Arm", lambda r: r["arm"]),
    (
        "Sessions [95% CI]",
        lambda r: _sessions(r.get("capacity"), r.get("capacity_ci"), r.get("censored"), r.get("interval_note")),
    ),
    ("Met – broke (trials)", lambda r: str(r.get("bracket") or "–")),
    ("vs baseline: knees' ratio [95% CI]", lambda r: _ratio_cell(r.get("ratio"), r.get("ratio_ci"))),
    ("KV-resident sessions [95% CI] (held – fell below half)", _resident_cell),
    (
        "vs baseline: residency ratio [95% CI]",
        lambda r: _ratio_cell(r.get("residency_ratio"), r.get("residency_ratio_ci")),
    ),
    ("KV tokens (budget)", _kv_cell),
    ("At capacity: TTFT p95 / ITL p95 / goodput / hit rate", _at_capacity_cell),
    ("First level over: sessions, TTFT p95, hit rate, preemptions", _first_broken_cell),
    ("Knee bound by", lambda r: str(r.get("knee_cause") or "unknown")),
)


def trials_table(section: CapacitySection | None) -> tuple[list[str], list[list[str]]]:
    """Every trial of every search, in order."""
    return columns(section["trials"] if section else [], TRIAL_COLUMNS)


def _verdict_cell(t: Mapping[str, Any]) -> str:
    if t.get("excluded_reason"):
        return f"excluded: {t['excluded_reason']}"
    return str(t["verdict"]) + (f": {'; '.join(t['broken'])}" if t.get("broken") else "")


TRIAL_COLUMNS: tuple[Column, ...] = (
    ("Boot", lambda t: t["boot"]),
    ("Depth", lambda t: t["point"]),
    ("Trial", lambda t: str(t["trial"])),
    ("Sessions", lambda t: str(t["sessions"])),
    ("Step", lambda t: t["step"]),
    ("Verdict", _verdict_cell),
    ("Turns (failed)", lambda t: f"{t['turns']} ({t['failed']})"),
    ("Context", lambda t: f"{t['context_tokens']:,.0f}" if t.get("context_tokens") is not None else "–"),
    ("TTFT p50 / p95", lambda t: f"{_ms(t.get('ttft_p50_s'))} / {_ms(t.get('ttft_p95_s'))}"),
    ("ITL p50 / p95", lambda t: f"{_ms(t.get('itl_p50_s'))} / {_ms(t.get('itl_p95_s'))}"),
    (
        "Goodput tok/s [95% CI]",
        lambda t: (
            (f"{t['goodput_tps']:.0f}" if t.get("goodput_tps") is not None else "–")
            + _ci(*(t.get("goodput_ci") or [None, None]))
        ),
    ),
    ("Hit rate", lambda t: _pct(t.get("hit_rate")) + (" (usage)" if t.get("hit_rate_source") == "usage" else "")),
    ("Preemptions", lambda t: str(t["preemptions"]) if t.get("preemptions") is not None else "–"),
    ("KV usage mean / max", lambda t: f"{_pct(t.get('kv_usage_mean'))} / {_pct(t.get('kv_usage_max'))}"),
)


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
        slo = parse_slo(str(found["config"].get("slo")))
    except ValueError:
        slo = Slo(())
    arms = [a["name"] for a in report.get("arms") or []]
    trials = pd.DataFrame([t for t in found["trials"] if t["verdict"] != "excluded"])
    out: dict[str, Figure] = {}
    if trials.empty:
        return out
    for point in dict.fromkeys(trials["point"]):
        at = trials[trials["point"] == point]
        panels: list[SloTerm | None] = [None, *slo.terms]  # None: goodput
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


def _level(group: pd.DataFrame, term: SloTerm | None) -> float:
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
