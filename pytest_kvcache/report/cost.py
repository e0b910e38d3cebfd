"""What the verdict cost: the run's device time (wall time × the cards it held), split into booting, measuring
and waiting, with what the engine's compile cache saved — and, per open gate, how many more boots would
decide it when the gate's result carries that estimate (``boots_to_decide``).

* **total** — the run's wall time (``run.json``: ``started_unix_s`` → ``updated_unix_s``, its last write) × the
  cards its boots used (the union of every boot's own cards; under pytest-xdist, every lane's);
* **booting** — each boot from its start (GPU checks and settling included) until it is ready and checked
  (``ready_unix_s``; older runs: the start + ``ready_s``), plus its stop (``stopping_unix_s`` →
  ``stopped_unix_s``), × the boot's cards;
* **measuring** — while a boot is up, the time some request was in flight (the union of every recorded
  request's send → ``[DONE]``, warm-ups included, and the fidelity, agreement and retrieval requests' wall time), × its
  cards;
* **waiting** — the rest: cards held while nothing booted or streamed (between requests and tests, the
  self-check, the report, a lane idle while another finishes).

Without a GPU the same split is given in seconds of wall time. Plain Python: no pytest.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, cast

import numpy as np

from pytest_kvcache.model.base import Json
from pytest_kvcache.model.evidence import Evidence
from pytest_kvcache.model.report import BootEntry, CostSection
from pytest_kvcache.report import judging, multiplicity
from pytest_kvcache.report.load import RunData


def _cards(evidence: Evidence) -> list[str]:
    before = evidence.get("gpu_before") or {}
    return [str(c.get("uuid")) for c in before.get("cards") or [] if c.get("uuid")] if before.get("gpu") else []


def _num(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _union_s(spans: Sequence[tuple[float, float]]) -> float:
    """Seconds covered by the union of ``spans``."""
    total, end = 0.0, float("-inf")
    for t0, t1 in sorted(spans):
        if t1 <= end:
            continue
        total += t1 - max(t0, end)
        end = t1
    return total


@dataclass(frozen=True)
class BootTime:
    """One boot's life in seconds, and its cards."""

    boot: str
    arm: str | None
    cards: int
    booting_s: float
    stopping_s: float
    measuring_s: float

    def to_dict(self) -> dict[str, Json]:
        return cast(dict[str, Json], asdict(self))


def boot_times(run: RunData) -> list[BootTime]:
    """Per boot that started: its cards and its seconds of booting, stopping and measuring."""
    spans: dict[str, list[tuple[float, float]]] = {}
    for r in run.records:
        sample = r.get("sample") or {}
        t0, dur = _num(sample.get("send_unix_s")), _num(sample.get("end_s"))
        if t0 is not None and t0 > 0:
            spans.setdefault(str(r.get("boot")), []).append((t0, t0 + (dur if dur is not None else 0.0)))
    extra: dict[str, float] = {}
    for entry in [*run.fidelity, *run.agreement, *run.retrieval]:
        wall = _num(entry.get("wall_s"))
        if wall is not None:
            extra[str(entry.get("boot"))] = extra.get(str(entry.get("boot")), 0.0) + wall
    out: list[BootTime] = []
    for boot, evidence in run.evidence.items():
        started = _num(evidence.get("started_unix_s"))
        if started is None:
            continue
        ready = _num(evidence.get("ready_unix_s"))
        if ready is None and (ready_s := _num(evidence.get("ready_s"))) is not None:
            ready = started + ready_s
        stopped = _num(evidence.get("stopped_unix_s"))
        stopping = _num(evidence.get("stopping_unix_s"))
        if ready is None:  # never became ready (failed): its whole life was booting
            ready = stopped if stopped is not None else started
        stop_s = max(0.0, stopped - stopping) if stopped is not None and stopping is not None else 0.0
        measuring = _union_s(spans.get(boot, [])) + extra.get(boot, 0.0)
        end = stopping if stopping is not None else stopped
        if end is not None:  # measuring cannot outlast the boot's life
            measuring = min(measuring, max(0.0, end - ready))
        arm = (evidence.get("arm") or {}).get("name")
        out.append(BootTime(boot, arm, len(_cards(evidence)), max(0.0, ready - started), stop_s, measuring))
    return out


def compile_saving_s(boots: Sequence[BootEntry], cards: Mapping[str, int]) -> float | None:
    """Device-seconds the compile cache saved: each boot that loaded it, against the mean time to ready of the
    boots that compiled (its own arm's, else the run's), × its cards. None when no boot of the run compiled or
    none loaded the cache."""
    ran = [b for b in boots if b.get("ready_s") is not None]
    compiled = [b for b in ran if b.get("compile_cache") == "miss"]
    cached = [b for b in ran if b.get("compile_cache") == "hit"]
    if not compiled or not cached:
        return None
    everyone = float(np.mean([float(b["ready_s"] or 0.0) for b in compiled]))
    saved = 0.0
    for b in cached:
        own = [float(c["ready_s"] or 0.0) for c in compiled if c["arm"] == b["arm"]]
        reference = float(np.mean(own)) if own else everyone
        saved += max(0.0, reference - float(b["ready_s"] or 0.0)) * max(1, cards.get(b["boot"], 0))
    return saved


def section(run: RunData, boots: Sequence[BootEntry]) -> CostSection | None:
    """``report["cost"]``: the run's device time and its split (None before any boot started)."""
    times = boot_times(run)
    started, updated = _num(run.meta.get("started_unix_s")), _num(run.meta.get("updated_unix_s"))
    if not times or started is None or updated is None:
        return None
    cards = sorted({c for e in run.evidence.values() for c in _cards(e)})
    per_boot = {t.boot: t.cards for t in times}
    gpu = bool(cards)

    def weighted(seconds: float, t: BootTime) -> float:
        return seconds * (t.cards if gpu else 1)

    wall = max(0.0, updated - started)
    stopping = math.fsum(weighted(t.stopping_s, t) for t in times)
    booting = math.fsum(weighted(t.booting_s, t) for t in times) + stopping
    measuring = math.fsum(weighted(t.measuring_s, t) for t in times)
    total = max(wall * (len(cards) if gpu else 1), booting + measuring)  # clocks may disagree by a rounding
    return {
        "unit": "GPU-s" if gpu else "s",
        "cards": len(cards),
        "wall_s": wall,
        "total": total,
        "booting": booting,
        "stopping": stopping,
        "measuring": measuring,
        "waiting": max(0.0, total - booting - measuring),
        "boots": len(times),
        "compile_cache_saved": compile_saving_s(boots, per_boot if gpu else {}),
        "per_boot": [t.to_dict() for t in times],
    }


def _amount(value: float, unit: str) -> str:
    if unit == "s":
        return f"{value / 60:.1f} min" if value >= 600 else f"{value:,.0f} s"
    return f"{value:,.0f} {unit}"


def cost_line(cost: Mapping[str, Any] | None) -> str | None:
    """The first-screen sentence: what the verdict cost and where it went."""
    if not cost or not cost.get("total"):
        return None
    unit, total = str(cost["unit"]), float(cost["total"])

    def share(key: str) -> str:
        return f"{100 * float(cost[key]) / total:.0f}%"

    wall = float(cost["wall_s"])
    minutes = f"{wall / 60:.1f} min" if wall >= 60 else f"{wall:.0f} s"
    head = (
        f"Cost: {_amount(total, unit)} ({cost['cards']} card{'s' if cost['cards'] != 1 else ''} × {minutes})"
        if unit != "s"
        else f"Cost: {minutes} of wall time (no GPU recorded)"
    )
    saved = cost.get("compile_cache_saved")
    cache = f"; the compile cache saved {_amount(float(saved), unit)}" if saved else ""
    stops = f", stops {_amount(float(cost['stopping']), unit)}" if float(cost.get("stopping") or 0) >= 0.5 else ""
    return (
        f"{head}: booting {_amount(float(cost['booting']), unit)} ({share('booting')}, {cost['boots']} "
        f"boot{'s' if cost['boots'] != 1 else ''}{stops}{cache}), measuring {_amount(float(cost['measuring']), unit)} "
        f"({share('measuring')}), waiting {_amount(float(cost['waiting']), unit)} ({share('waiting')})."
    )


def _boots_text(value: object) -> str | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int | float):
        n = float(value)
        return f"~{n:g} more boot{'' if n == 1 else 's'} per arm would decide it"
    if isinstance(value, Mapping):
        inner = value.get("boots", value.get("per_arm"))
        if isinstance(inner, int | float) and not isinstance(inner, bool):
            return _boots_text(inner)
        return "; ".join(f"{k} {v}" for k, v in value.items())
    return str(value)


def open_gate_lines(gates: Sequence[Mapping[str, Any]]) -> list[str]:
    """Per open (inconclusive) gate that carries ``boots_to_decide``: how many more boots per arm would likely
    decide it (None: none within reach — the estimate sits on the threshold —, or no CI to start from)."""
    out = []
    for g in gates:
        if g.get("outcome") != "inconclusive" or "boots_to_decide" not in g:
            continue
        text = _boots_text(g.get("boots_to_decide"))
        out.append(
            f"Open gate {g.get('name')}: {text or 'more boots are not likely to decide it (or it has no CI yet)'}."
        )
    return out


def first_screen(report: Mapping[str, Any]) -> list[str]:
    """The cost sentence, the open gates' boots to decide, whether the baseline can judge quality, the spreads the
    within-boot verdicts were judged with (each with its source), and how many comparisons the verdicts are
    corrected for (Holm), for the top of every output."""
    line = cost_line(report.get("cost"))
    return (
        ([line] if line else [])
        + open_gate_lines(report.get("gates") or [])
        + judging.lines(report.get("baseline_check"))
        + spread_lines(report.get("bands"))
        + multiplicity.lines(report.get("deltas"))
    )


def spread_lines(used: Mapping[str, Any] | None) -> list[str]:
    """One line per kind of boot-to-boot spread the within-boot verdicts were judged with, naming its source."""
    spreads = (used or {}).get("spreads") or {}
    return [f"Within-boot verdicts judged with {text}." for text in spreads.values()]
