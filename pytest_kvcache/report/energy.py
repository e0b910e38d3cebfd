"""Energy per token: joules per output token over each request's decode window and per prompt token over its
prefill window, on each boot's own cards, from NVML's total-energy counter (``energy.jsonl``, written by
``pytest_kvcache.gpu.energy.EnergyMeter``) — or, on a card without the counter, from its power samples
(``gpu.jsonl``).

How a figure is made (docs/metrics.md defines it by formula):

1. Each card's trace becomes a cumulative energy curve: the counter's steps (each dated to the middle of the
   two meter reads that saw it move), or the trapezoid integral of the power samples. The energy of a window
   is the curve interpolated linearly at the window's two edges, summed over the boot's cards.
2. The curve's resolution is its step: the median time between the counter's steps (~100 ms on an H200), or
   between power samples (250 ms at the default 4 Hz). An edge can misplace up to about half a step of energy,
   so one short window's reading means nothing (a 12 ms TTFT window reads 0 mJ straight off the counter). A
   boot's point is reported only when its windows add up to ``MIN_STEPS_TOTAL`` steps and last
   ``MIN_STEPS_MEAN`` steps on average (an edge's error then stays under a tenth of a window's energy);
   otherwise its energy metrics are left out and the section says why.
3. Per boot and point, the figure is Σ joules / Σ tokens over its windows. The frame carries one value per
   request, ``joules_i / mean tokens`` of its boot and point, whose mean over the boot is exactly that ratio —
   so the report's usual machinery (summary, deltas with CIs over requests or over boots, gates, noise bands,
   stored-run comparisons) treats energy like any other metric, without ever dividing one window alone.

A concurrency trial's ``energy_per_token`` is over the trial's span (first send to last ``[DONE]``) and all
its streams' tokens: the streams' windows overlap, so no request owns a share of them.

Plain Python: no pytest; reads nothing itself (``report.load`` hands it the lines).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, cast

import numpy as np
import pandas as pd

from pytest_kvcache.metrics import catalogue
from pytest_kvcache.metrics.catalogue import joules_text
from pytest_kvcache.model.base import Json
from pytest_kvcache.model.evidence import Evidence
from pytest_kvcache.model.report import EnergyRow, EnergySection
from pytest_kvcache.probes.registry import ProbeSpec
from pytest_kvcache.report.points import point_sort, spec_of

#: Each energy metric's window of a request (``probes.registry.ENERGY_METRICS``).
WINDOW_OF = {"energy_per_token": "decode", "energy_per_prompt_token": "prefill"}
#: A boot's point is reported when its windows add up to this many steps of the energy curve …
MIN_STEPS_TOTAL = 10
#: … and last this many steps on average: an edge misplaces at most ~½ step of energy, under 1/10 of a window.
MIN_STEPS_MEAN = 5
#: Frame columns of a request's two windows (absolute unix seconds, tokens) and their joules.
WINDOW_COLUMNS = tuple(
    f"{kind}_{part}" for kind in ("prefill", "decode") for part in ("t0_unix_s", "t1_unix_s", "tokens")
)

Source = Literal["counter", "power"]


# ------------------------------------------------------------------------------------------ windows


def request_windows(sample: Mapping[str, Any]) -> dict[str, float | None]:
    """A streamed request's prefill window (send → first token; the prompt tokens it prefilled, cached ones
    left out) and decode window (first → last token; the tokens after the first token chunk), as
    ``WINDOW_COLUMNS``. A window the request did not have (failed, one token, no decode window) is None."""
    out: dict[str, float | None] = dict.fromkeys(WINDOW_COLUMNS)
    send, first, last = sample.get("send_unix_s"), sample.get("first_token_s"), sample.get("last_token_s")
    completion = sample.get("completion_tokens") or 0
    if not sample.get("ok") or send is None or first is None:
        return out
    prompt = sample.get("prompt_tokens")
    if prompt is not None and first > 0:
        prefilled = int(prompt) - int(sample.get("cached_tokens") or 0)
        if prefilled > 0:
            out.update(prefill_t0_unix_s=send, prefill_t1_unix_s=send + first, prefill_tokens=float(prefilled))
    usage = sample.get("token_clock") == "usage" and sample.get("first_chunk_tokens")
    decoded = completion - (int(sample.get("first_chunk_tokens") or 1) if usage else 1)
    if last is not None and last > first and decoded > 0:
        out.update(decode_t0_unix_s=send + first, decode_t1_unix_s=send + last, decode_tokens=float(decoded))
    return out


def trial_windows(starts: Sequence[float], ends: Sequence[float], tokens: int) -> dict[str, float | None]:
    """A concurrency trial: its span (first send → last ``[DONE]``) and all its streams' tokens, as the decode
    window (``energy_per_token`` of the trial); no prefill window."""
    out: dict[str, float | None] = dict.fromkeys(WINDOW_COLUMNS)
    if starts and ends and tokens > 0 and max(ends) > min(starts):
        out.update(decode_t0_unix_s=min(starts), decode_t1_unix_s=max(ends), decode_tokens=float(tokens))
    return out


# ------------------------------------------------------------------------------------------ traces


@dataclass(frozen=True)
class CardTrace:
    """One card's cumulative energy over time (joules from the trace's start), and its resolution."""

    card: str
    source: Source
    t_unix_s: np.ndarray
    joules: np.ndarray
    #: the curve's step: the median time between counter steps, or between power samples
    step_s: float | None
    #: the counter: the median time between the two reads that dated a step (a step's time is ± half of it)
    read_gap_s: float | None = None

    def between(self, t0: np.ndarray, t1: np.ndarray) -> np.ndarray:
        """The energy of each window [t0, t1] (J); NaN where the trace does not cover it."""
        if self.t_unix_s.size < 2:
            return np.full(np.shape(t0), np.nan)
        e0 = np.interp(t0, self.t_unix_s, self.joules)
        e1 = np.interp(t1, self.t_unix_s, self.joules)
        covered = (t0 >= self.t_unix_s[0]) & (t1 <= self.t_unix_s[-1])
        return np.where(covered, e1 - e0, np.nan)


def counter_trace(card: str, lines: Iterable[Mapping[str, Any]]) -> CardTrace:
    """The counter's steps of one card (``energy.jsonl`` lines), as a cumulative curve. A first reading is left
    out (its time says nothing of when the counter moved); a counter that goes back (the driver reloaded)
    continues from where it was."""
    points = sorted(
        (float(line["t_unix_s"]), int(line["energy_mj"]), line.get("read_gap_s"))
        for line in lines
        if line.get("card") == card and line.get("energy_mj") is not None and not line.get("first")
    )
    times: list[float] = []
    values: list[int] = []
    offset, last = 0, None
    gaps = [float(g) for _, _, g in points if isinstance(g, int | float)]
    for at, mj, _ in points:
        if last is not None and mj < last:
            offset += last - mj
        last = mj
        if times and at <= times[-1]:
            continue
        times.append(at)
        values.append(mj + offset)
    t = np.asarray(times, dtype=float)
    joules = (np.asarray(values, dtype=float) - (values[0] if values else 0.0)) / 1000.0
    step = float(np.median(np.diff(t))) if t.size >= 3 else None
    return CardTrace(card, "counter", t, joules, step, float(np.median(gaps)) if gaps else None)


def power_trace(card: str, samples: Iterable[Mapping[str, Any]]) -> CardTrace:
    """One card's power samples (``gpu.jsonl``) integrated (trapezoids) into a cumulative curve."""
    points = sorted(
        (float(s["t_unix_s"]), float(s["power_w"]))
        for s in samples
        if s.get("card") == card and s.get("power_w") is not None and s.get("t_unix_s") is not None
    )
    t = np.asarray([p[0] for p in points], dtype=float)
    watts = np.asarray([p[1] for p in points], dtype=float)
    joules = np.concatenate([[0.0], np.cumsum(np.diff(t) * (watts[:-1] + watts[1:]) / 2)]) if t.size else t
    step = float(np.median(np.diff(t))) if t.size >= 2 else None
    return CardTrace(card, "power", t, joules, step)


@dataclass(frozen=True)
class Energy:
    """A run's energy traces per card, each boot's cards, and how the meter ran."""

    cards: dict[str, CardTrace] = field(default_factory=dict)
    boot_cards: dict[str, list[str]] = field(default_factory=dict)
    meter_hz: float | None = None
    #: cards without the counter → NVML's error (their energy comes from the power samples)
    unsupported: dict[str, str] = field(default_factory=dict)

    @classmethod
    def build(
        cls,
        lines: Sequence[Mapping[str, Any]],
        power_samples: Callable[[], Sequence[Mapping[str, Any]]],
        evidence: Mapping[str, Evidence],
    ) -> Energy:
        """From ``energy.jsonl``'s lines, the power samples (read only when a card needs them) and every boot's
        evidence (its cards: ``gpu_before``)."""
        boot_cards = {
            boot: [str(c.get("uuid")) for c in (e.get("gpu_before") or {}).get("cards") or [] if c.get("uuid")]
            for boot, e in evidence.items()
        }
        hz = next((float(line["hz"]) for line in lines if line.get("kind") == "meter" and line.get("hz")), None)
        unsupported = {
            str(line.get("card")): str(line.get("error") or "not supported")
            for line in lines
            if line.get("kind") == "unsupported"
        }
        wanted = {card for cards in boot_cards.values() for card in cards}
        metered = {str(line.get("card")) for line in lines if line.get("energy_mj") is not None}
        cards = {card: counter_trace(card, lines) for card in sorted(wanted & metered) if card not in unsupported}
        fallback = sorted(card for card in wanted if card not in cards)
        if fallback:
            samples = power_samples()
            for card in fallback:
                trace = power_trace(card, samples)
                if trace.t_unix_s.size >= 2:
                    cards[card] = trace
        return cls(cards=cards, boot_cards=boot_cards, meter_hz=hz, unsupported=unsupported)

    def traces_of(self, boot: str) -> list[CardTrace] | None:
        """The traces of a boot's cards; None when the boot has no card or one of its cards has no trace."""
        cards = self.boot_cards.get(boot) or []
        found = [self.cards[c] for c in cards if c in self.cards]
        return found if cards and len(found) == len(cards) else None

    def step_s(self, boot: str) -> float | None:
        """The coarsest step among a boot's cards' curves: the resolution of its energy figures."""
        traces = self.traces_of(boot) or []
        steps = [t.step_s for t in traces if t.step_s is not None]
        return max(steps) if steps and len(steps) == len(traces) else None

    def source(self, boot: str) -> str | None:
        kinds = sorted({t.source for t in self.traces_of(boot) or []})
        return "+".join(kinds) if kinds else None


# ------------------------------------------------------------------------------------------ the frame


def judge_unit(window_s: Sequence[float], step_s: float | None) -> str | None:
    """Why the windows of one boot's point cannot be given an energy figure (None: they can)."""
    n = len(window_s)
    if step_s is None or step_s <= 0:
        return "no energy trace on this boot's cards"
    if n == 0:
        return "no window with a measured energy"
    total = float(np.sum(window_s))
    if total < MIN_STEPS_TOTAL * step_s:
        return (
            f"windows add up to {_seconds(total)}, under {MIN_STEPS_TOTAL} steps of {_seconds(step_s)} "
            f"({_seconds(MIN_STEPS_TOTAL * step_s)})"
        )
    if total / n < MIN_STEPS_MEAN * step_s:
        return (
            f"windows last {_seconds(total / n)} on average, under {MIN_STEPS_MEAN} steps of {_seconds(step_s)} "
            f"({_seconds(MIN_STEPS_MEAN * step_s)})"
        )
    return None


def _seconds(value: float) -> str:
    return f"{value:.2f} s" if value >= 1 else f"{value * 1000:.0f} ms"


def with_energy(data: pd.DataFrame, energy: Energy) -> pd.DataFrame:
    """The report frame with each request's window joules (``decode_j``, ``prefill_j``) and the energy metrics
    (``energy_per_token``, ``energy_per_prompt_token``) where its boot's point passes :func:`judge_unit`."""
    if data.empty or "decode_t0_unix_s" not in data or not energy.cards:
        return data
    data = data.copy()
    for kind in ("prefill", "decode"):
        joules = np.full(len(data), np.nan)
        t0 = pd.to_numeric(data[f"{kind}_t0_unix_s"], errors="coerce").to_numpy(dtype=float)
        t1 = pd.to_numeric(data[f"{kind}_t1_unix_s"], errors="coerce").to_numpy(dtype=float)
        valid = data["valid"].to_numpy(dtype=bool) & np.isfinite(t0) & np.isfinite(t1)
        for boot in data.loc[valid, "boot"].unique():
            traces = energy.traces_of(str(boot))
            if not traces:
                continue
            mask = valid & (data["boot"] == boot).to_numpy()
            joules[mask] = np.sum([trace.between(t0[mask], t1[mask]) for trace in traces], axis=0)
        data[f"{kind}_j"] = joules
    for metric, kind in WINDOW_OF.items():
        values = np.full(len(data), np.nan)
        for (boot, _probe, _point), group in data.groupby(["boot", "probe", "point"], sort=False):
            joules = group[f"{kind}_j"].to_numpy(dtype=float)
            tokens = pd.to_numeric(group[f"{kind}_tokens"], errors="coerce").to_numpy(dtype=float)
            ok = np.isfinite(joules) & np.isfinite(tokens) & (tokens > 0)
            span = _spans(group, kind)[ok]
            if not ok.any() or judge_unit(span.tolist(), energy.step_s(str(boot))) is not None:
                continue
            mean_tokens = float(tokens[ok].mean())
            positions = data.index.get_indexer(group.index[ok])
            values[positions] = joules[ok] / mean_tokens
        data[metric] = pd.Series(values, index=data.index).astype(object).where(np.isfinite(values), None)
    return data


def _spans(group: pd.DataFrame, kind: str) -> np.ndarray:
    t0 = pd.to_numeric(group[f"{kind}_t0_unix_s"], errors="coerce").to_numpy(dtype=float)
    t1 = pd.to_numeric(group[f"{kind}_t1_unix_s"], errors="coerce").to_numpy(dtype=float)
    return cast(np.ndarray, t1 - t0)


# ------------------------------------------------------------------------------------------ the section


def how_measured(energy: Energy) -> dict[str, Json]:
    """The energy's method per card: source, step (resolution), dating of the steps, NVML's refusal."""
    cards: list[Json] = []
    for card, trace in sorted(energy.cards.items()):
        cards.append(
            {
                "card": card,
                "source": trace.source,
                "step_s": trace.step_s,
                "read_gap_s": trace.read_gap_s,
                "points": int(trace.t_unix_s.size),
                "error": energy.unsupported.get(card),
            }
        )
    for card, error in sorted(energy.unsupported.items()):
        if card not in energy.cards:
            cards.append(
                {"card": card, "source": None, "step_s": None, "read_gap_s": None, "points": 0, "error": error}
            )
    return {
        "meter_hz": energy.meter_hz,
        "min_steps_total": MIN_STEPS_TOTAL,
        "min_steps_mean": MIN_STEPS_MEAN,
        "cards": cards,
    }


def method_line(how: Mapping[str, Any]) -> str | None:
    """How the energy was measured, in one sentence (None: nothing was)."""
    cards = [c for c in how.get("cards") or [] if isinstance(c, dict)]
    if not cards:
        return None
    counter = [c for c in cards if c.get("source") == "counter"]
    power = [c for c in cards if c.get("source") == "power"]
    parts = []
    if counter:
        steps = [float(c["step_s"]) for c in counter if c.get("step_s")]
        gaps = [float(c["read_gap_s"]) for c in counter if c.get("read_gap_s")]
        step = f", which moved in steps of {_seconds(float(np.median(steps)))} (median)" if steps else ""
        dated = f", which dates each step to ±{_seconds(float(np.median(gaps)) / 2)}" if gaps else ""
        hz = how.get("meter_hz")
        parts.append(
            f"NVML's total-energy counter on {len(counter)} card(s){step}, read at {hz:g} Hz{dated}"
            if hz
            else f"NVML's total-energy counter on {len(counter)} card(s){step}"
        )
    if power:
        steps = [float(c["step_s"]) for c in power if c.get("step_s")]
        every_ = f" taken every {_seconds(float(np.median(steps)))}" if steps else ""
        why = next((str(c["error"]) for c in power if c.get("error")), "")
        without = (
            f"without the counter (NVML: {why})"
            if why
            else "whose counter this run did not read (no energy.jsonl: recorded before the energy meter)"
        )
        parts.append(
            f"the power samples{every_} integrated on {len(power)} card(s) {without} — NVML's power reading is "
            "smoothed and lags (on an H200, over 3 s of load, it averaged 12% under the counter)"
        )
    return (
        "Energy per token: "
        + "; ".join(parts)
        + f"; each window's energy interpolated at its edges on the boot's own cards; a boot's point is reported "
        f"when its windows add up to {how.get('min_steps_total')} steps and last {how.get('min_steps_mean')} "
        "steps on average (one short window is never divided alone)."
    )


def section(data: pd.DataFrame, energy: Energy, arms: Sequence[str], specs: Mapping[str, ProbeSpec]) -> EnergySection:
    """The report's energy section: how it was measured (``how``, ``line``); per arm, probe, point and energy
    metric of the probe, the joules, tokens, window time, mean power and J/token over the boots whose windows
    were long enough (``rows``, each with ``reason`` for the boots left out); and, in a few lines, the points
    that got no figure at all and why (``not_reported``)."""
    how = how_measured(energy)
    rows: list[EnergyRow] = []
    if not data.empty and "decode_j" in data:
        order = {arm: i for i, arm in enumerate(arms)}
        keys = data[["arm", "probe", "point"]].drop_duplicates().itertuples(index=False)

        def key(k: tuple[object, ...]) -> tuple[int, int, str, tuple[int, float, str]]:
            return (spec_of(str(k[1]), specs).order, order.get(str(k[0]), 99), str(k[1]), point_sort(str(k[2])))

        for arm, probe, point in sorted(keys, key=key):
            spec = spec_of(str(probe), specs)
            at = data[(data["arm"] == arm) & (data["probe"] == probe) & (data["point"] == point) & data["valid"]]
            for metric, kind in WINDOW_OF.items():
                if metric not in spec.metrics:
                    continue
                row = _row(at, energy, kind)
                if row is not None:
                    where = {"arm": str(arm), "probe": str(probe), "point": str(point), "metric": metric}
                    rows.append(cast(EnergyRow, {**where, **row}))
    return {"how": how, "line": method_line(how), "rows": rows, "not_reported": not_reported(rows)}


def not_reported(rows: Sequence[EnergyRow]) -> list[str]:
    """One line per probe and metric naming the points no boot of an arm got a figure at, with the first
    reason (the table keeps only the points with a figure)."""
    out = []
    groups: dict[tuple[str, str, str], list[EnergyRow]] = {}
    for r in rows:
        if r.get("joules_per_token") is None:
            groups.setdefault((str(r["probe"]), str(r["metric"]), str(r["arm"])), []).append(r)
    for (probe, metric, arm), missing in groups.items():
        points = ", ".join(str(r["point"]) for r in missing)
        reason = str(missing[0].get("reason") or "no window")
        out.append(f"{metric} not reported for {arm} at {probe} {points} (e.g. {reason})")
    return out


def _row(at: pd.DataFrame, energy: Energy, kind: str) -> dict[str, Json] | None:
    """One arm's point and window over its boots (None: it has no such window)."""
    joules_col, tokens_col = f"{kind}_j", f"{kind}_tokens"
    tokens_all = pd.to_numeric(at[tokens_col], errors="coerce")
    if not tokens_all.notna().any():
        return None
    reported: list[tuple[float, float, float, int]] = []  # (joules, tokens, seconds, windows) per reported boot
    reasons: dict[str, str] = {}
    boots = 0
    sources = set()
    steps = []
    for boot, group in at.groupby("boot", sort=False):
        tokens = pd.to_numeric(group[tokens_col], errors="coerce").to_numpy(dtype=float)
        if not np.isfinite(tokens).any():
            continue
        boots += 1
        joules = group[joules_col].to_numpy(dtype=float)
        ok = np.isfinite(joules) & np.isfinite(tokens) & (tokens > 0)
        span = _spans(group, kind)[ok]
        step = energy.step_s(str(boot))
        if step is not None:
            steps.append(step)
        if source := energy.source(str(boot)):
            sources.add(source)
        why = judge_unit(span.tolist(), step)
        if why is not None:
            reasons[str(boot)] = why
            continue
        reported.append((float(joules[ok].sum()), float(tokens[ok].sum()), float(span.sum()), int(ok.sum())))
    if not boots:
        return None
    total_j = math.fsum(r[0] for r in reported)
    total_tokens = math.fsum(r[1] for r in reported)
    seconds = math.fsum(r[2] for r in reported)
    per_boot = [r[0] / r[1] for r in reported if r[1] > 0]
    return {
        "window": "trial" if kind == "decode" and "streams" in at and at["streams"].notna().any() else kind,
        "boots": boots,
        "boots_reported": len(reported),
        "windows": sum(r[3] for r in reported),
        "window_s": seconds if reported else None,
        "joules": total_j if reported else None,
        "tokens": total_tokens if reported else None,
        "joules_per_token": float(np.mean(per_boot)) if per_boot else None,
        "mean_power_w": total_j / seconds if reported and seconds > 0 else None,
        "source": "+".join(sorted(sources)) or None,
        "step_s": max(steps) if steps else None,
        "reason": "; ".join(f"{b}: {r}" for b, r in reasons.items()) or None,
    }


def per_what(metric: str) -> str:
    """What an energy metric is per, from its catalogue unit (``J/prompt token`` → ``prompt token``)."""
    return catalogue.get(metric).unit.partition("/")[2] or "token"


def table(report_energy: EnergySection | None) -> tuple[list[str], list[list[str]]]:
    """The energy rows that have a figure, as a table (report.md, report.html, the terminal)."""
    header = ["Arm", "Probe", "Point", "Window", "Boots", "Windows (time)", "Energy", "Mean power", "Per token"]
    rows = []
    for r in report_energy["rows"] if report_energy else []:
        if r.get("joules_per_token") is None:
            continue
        seconds = r.get("window_s")
        power = r.get("mean_power_w")
        unit = per_what(r["metric"])
        boots = f"{r['boots_reported']} of {r['boots']}"
        if r.get("reason"):
            boots += f" ({r['reason']})"
        rows.append(
            [
                str(r["arm"]),
                str(r["probe"]),
                str(r["point"]),
                str(r["window"]),
                boots,
                f"{r['windows']} ({seconds:.2f} s)" if seconds is not None else "–",
                joules_text(r.get("joules")),
                f"{power:.0f} W" if power is not None else "–",
                f"{joules_text(r.get('joules_per_token'))}/{unit}",
            ]
        )
    return header, rows
