"""The report's content as a pure function of a loaded run folder: summary, deltas with CIs, crossovers,
verdicts, boots, confounds, agreement, agentic growth, speculative decoding, fidelity.

``build(run)`` reads nothing itself: :func:`pytest_kvcache.report.load.load` read the folder once. The
bootstrap is seeded with the run's ``--kv-seed``, so the same folder always yields the same report.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any, cast

import numpy as np
import pandas as pd

from pytest_kvcache import stats
from pytest_kvcache.model import (
    REPORT_VERSION,
    AgenticSection,
    AgenticTurn,
    AgreementRow,
    AgreementSection,
    ArmEntry,
    BlockEntry,
    BootEntry,
    BootResult,
    CiStatement,
    ClientLoadSection,
    Confounds,
    CrossoverRow,
    DeltaRow,
    Evidence,
    FlagSummary,
    GpuCardSummary,
    GpuSummary,
    GrowthVerdict,
    PlanEntry,
    Record,
    Report,
    SelfCheckSection,
    SpecDecodeRow,
    SpecDecodeSection,
    SummaryRow,
)
from pytest_kvcache.model.evidence import kv_capacity_tokens, resolved_cache_dtype, speculative
from pytest_kvcache.probes import agreement
from pytest_kvcache.report import bands, confounds, failures, greedy, left_out
from pytest_kvcache.report import capacity as capacity_report
from pytest_kvcache.report import cost as cost_report
from pytest_kvcache.report import energy as energy_report
from pytest_kvcache.report import fidelity as fidelity_report
from pytest_kvcache.report.frame import (
    MIN_BOOTS_FOR_BOOT_CI,
    Specs,
    compare,
    frame,
    metrics_for,
    point_of,
    point_sort,
    spec_of,
    values,
)
from pytest_kvcache.report.load import RunData


def _probes(data: pd.DataFrame, specs: Specs) -> list[str]:
    return sorted(data["probe"].unique(), key=lambda p: (spec_of(p, specs).order, str(p)))


def summary_rows(data: pd.DataFrame, arms: Sequence[str], specs: Specs) -> list[SummaryRow]:
    """n, mean, median, std, CV, min, max per probe × point × metric × arm, over valid measured samples."""
    rows: list[SummaryRow] = []
    if data.empty:
        return rows
    for probe in _probes(data, specs):
        by_probe = data[data["probe"] == probe]
        for point in sorted(by_probe["point"].unique(), key=point_sort):
            at = by_probe[by_probe["point"] == point]
            for metric in metrics_for(spec_of(probe, specs), at):
                for arm in arms:
                    group = at[at["arm"] == arm]
                    if group.empty:
                        continue
                    excluded = group.loc[~group["valid"], "excluded_reason"].dropna().tolist()
                    described = stats.describe(values(group, metric))
                    rows.append(
                        {
                            "probe": probe,
                            "point": point,
                            "metric": metric,
                            "arm": arm,
                            "n": described["n"],
                            "mean": described["mean"],
                            "median": described["median"],
                            "std": described["std"],
                            "cv_pct": described["cv_pct"],
                            "min": described["min"],
                            "max": described["max"],
                            "excluded": len(group) - int(group["valid"].sum()),
                            "excluded_reasons": sorted(set(excluded)),
                        }
                    )
    return rows


def delta_rows(data: pd.DataFrame, arms: Sequence[str], specs: Specs, seed: int) -> list[DeltaRow]:
    """Every arm against the baseline arm, per probe, point and compared metric."""
    rows: list[DeltaRow] = []
    if data.empty or len(arms) < 2:
        return rows
    baseline = arms[0]
    for probe in _probes(data, specs):
        spec = spec_of(probe, specs)
        by_probe = data[data["probe"] == probe]
        for point in sorted(by_probe["point"].unique(), key=point_sort):
            at = by_probe[by_probe["point"] == point]
            base = at[at["arm"] == baseline]
            for metric in metrics_for(spec, at):
                if metric not in spec.compared_metrics or spec.own_section:
                    continue
                for arm in arms[1:]:
                    other = at[at["arm"] == arm]
                    if other.empty and base.empty:
                        continue
                    found = compare(base, other, metric, seed=seed)
                    where = {"arm": arm, "baseline": baseline, "probe": probe, "point": point, "metric": metric}
                    row = cast(DeltaRow, {**where, **found})
                    rows.append(row)
    return rows


def ci_half_width_pct(row: DeltaRow) -> float | None:
    """Half the width of a ratio's CI, in percentage points (None without a CI)."""
    lo, hi = row.get("ci_low"), row.get("ci_high")
    if lo is None or hi is None:
        return None
    return float((hi - lo) / 2 * 100)


def rounds_check(
    records: Sequence[Record],
    arms: Sequence[str],
    specs: Specs,
    target_pct: float | None,
    seed: int,
    gates: Sequence[str] = (),
    blocks: Mapping[str, int] | None = None,
    *,
    platform: bands.Platform = "cpu",
    noise: Mapping[tuple[str, str, str], float] | None = None,
    saved: pd.DataFrame | None = None,
    external: bool = False,
) -> tuple[bool, dict[str, object] | None]:
    """Is another round (block) of boots unnecessary? One rule for every probe — short, prefill, agentic,
    concurrency, a user's — on the same evidence as the report (paired by block under pytest-xdist:
    ``blocks`` maps each boot to its block):

    - every gate is evaluated exactly as the report evaluates it (``report.gates.evaluate``, with the A/A
      noise band, the stored run and the platform's default bands): a round is needed while one of them is
      undecided — its CI straddles the threshold — however narrow; a gate without data is no reason to boot;
    - with ``target_pct`` (``--kv-target-ci``), any other delta of a probe's primary metric is settled when
      its CI half-width ≤ ``target_pct``; a delta without a CI is not settled.

    Returns ``(done, widest)``: what still needs a round (an undecided gate first, else the unsettled delta
    with the widest CI; when all are settled, the widest): ``probe``, ``point``, ``metric``, ``arm``,
    ``half_width_pct`` and ``gate`` (the undecided gate's name, with ``boots_to_decide``).
    """
    from pytest_kvcache.report.gates import GateError, evaluate, parse

    data = frame(records, specs)
    if "boot" in data:  # as the run folder's loader does: the resampling unit and the block of each row
        data["unit"] = data["arm"] if external else data["boot"]
        data["block"] = [(blocks or {}).get(str(b), 0) for b in data["boot"]]
    parsed = []
    for text in gates:
        try:
            parsed.append(parse(text, arms=arms))
        except GateError:
            continue
    results = evaluate(parsed, data, arms, seed=seed, saved=saved, noise=noise, specs=specs, platform=platform)
    open_gates = [
        r for r in results if r["outcome"] == "inconclusive" and (r.get("evidence") or {}).get("kind", "none") != "none"
    ]
    gated = {(g.probe, g.metric) for g in parsed}
    judged: list[tuple[bool, float | None, DeltaRow]] = []
    if target_pct is not None:
        for row in delta_rows(data, arms, specs, seed):
            if spec_of(row["probe"], specs).primary_metric != row["metric"] or (row["probe"], row["metric"]) in gated:
                continue
            width = ci_half_width_pct(row)
            judged.append((width is not None and width <= target_pct, width, row))
    if open_gates:
        gate = open_gates[0]
        lo, hi = gate["ci_low"], gate["ci_high"]
        width = (hi - lo) / 2 * 100 if lo is not None and hi is not None else None
        widest: dict[str, object] = {"gate": gate["name"], "half_width_pct": width}
        widest["boots_to_decide"] = gate.get("boots_to_decide")
        widest["open_gates"] = len(open_gates)
        return False, widest
    if not judged:
        return (bool(parsed), None) if parsed else (False, None)
    unsettled = [j for j in judged if not j[0]] or judged
    _, worst_width, worst = max(unsettled, key=lambda j: float("inf") if j[1] is None else j[1])
    widest = {"probe": worst["probe"], "point": worst["point"], "metric": worst["metric"], "arm": worst["arm"]}
    widest["half_width_pct"] = worst_width
    return all(j[0] for j in judged), widest


def _curve(
    data: pd.DataFrame, probe: str, arm: str, metric: str, specs: Specs
) -> list[tuple[float, dict[str, list[float]], str]]:
    """(x, {boot: values}, point) per point of a curve: x = depth, or the mean prompt tokens of a turn."""
    spec = spec_of(probe, specs)
    sub = data[(data["probe"] == probe) & (data["arm"] == arm)]
    key = "unit" if "unit" in sub else "boot"
    out = []
    for point in sorted(sub["point"].unique(), key=point_sort):
        at = sub[sub["point"] == point]
        if spec.exclude_first_point and at["turn"].iloc[0] == 1:
            continue  # turn 1 is cold: excluded from the curve, as from the growth verdict
        x = float(at["depth"].iloc[0]) if spec.curve_x == "depth" else float(at["prompt_tokens"].dropna().mean())
        found = {str(unit): v for unit, g in at.groupby(key, sort=False) if (v := values(g, metric))}
        if found:
            out.append((x, found, str(point)))
    return out


def _pooled(boots: Mapping[str, list[float]]) -> list[float]:
    return [v for values_ in boots.values() for v in values_]


def _nearest(curve: Mapping[float, object], x: float) -> float:
    return min(curve, key=lambda c: abs(c - x))


def crossover_rows(
    data: pd.DataFrame, arms: Sequence[str], specs: Specs, seed: int, platform: bands.Platform = "cpu"
) -> list[CrossoverRow]:
    """Where each arm's curve (prefill by depth, agentic by prompt tokens) crosses the baseline's, with the
    resampled crossing's CI and share; :func:`judge_crossovers` then decides which are significant. Within
    boots, each resample also moves the curve by a boot effect drawn from the default band (a boot is one
    engine along the whole curve)."""
    rows: list[CrossoverRow] = []
    if data.empty or len(arms) < 2:
        return rows
    key = "unit" if "unit" in data else "boot"
    blocks = (
        {str(u): s for u, s in zip(data[key], data["block"], strict=True)} if "block" in data and key in data else {}
    )
    for spec in sorted(specs.values(), key=lambda s: (s.order, s.name)):
        for metric in spec.curve:
            base_curve = _curve(data, spec.name, arms[0], metric, specs)
            base = {x: found for x, found, _ in base_curve}
            names = {x: point for x, _, point in base_curve}
            for arm in arms[1:]:
                curve = {x: found for x, found, _ in _curve(data, spec.name, arm, metric, specs)}
                xs = [x for x in sorted(base) if x in curve or any(abs(x - c) / max(x, 1) < 0.02 for c in curve)]
                if len(xs) < 2:
                    continue
                arm_vals = [curve[_nearest(curve, x)] for x in xs]
                base_vals = [base[x] for x in xs]
                boots = min(len(set().union(*base_vals)), len(set().union(*arm_vals)))
                if boots >= MIN_BOOTS_FOR_BOOT_CI:  # the same unit as every delta's CI: boots (blocks)
                    found = stats.crossover_boots(xs, base_vals, arm_vals, blocks=blocks, seed=seed)
                else:
                    band = bands.band(metric, platform)
                    per_side = [max(min(len(v) for v in vals), 1) for vals in (base_vals, arm_vals)]
                    boot_sd = band.boot_sd * (1 / per_side[0] + 1 / per_side[1]) ** 0.5 if band else 0.0
                    found = stats.crossover(
                        xs,
                        [_pooled(b) for b in base_vals],
                        [_pooled(a) for a in arm_vals],
                        boot_sd=boot_sd,
                        seed=seed,
                    )
                    found["boot_sd_pct"] = boot_sd * 100
                found["ci_method"] = "boots" if boots >= MIN_BOOTS_FOR_BOOT_CI else "within-boot"
                axis = "depth" if spec.curve_x == "depth" else "prompt tokens"
                row = cast(
                    CrossoverRow,
                    {"arm": arm, "baseline": arms[0], "probe": spec.name, "metric": metric, "axis": axis, "xs": xs},
                )
                row.update(cast(CrossoverRow, found))
                row["point_names"] = [names[x] for x in xs]
                rows.append(row)
    return rows


def judge_crossovers(crossovers: Sequence[CrossoverRow], deltas: Sequence[DeltaRow]) -> None:
    """Which crossings the data carry (in place): a sign change is stated only when a point on each side of
    parity has a CI that excludes it (its delta's verdict, judged as the report judges it: over boots, or
    within boots widened by the band or the A/A noise) or when at least ``stats.CROSSING_SHARE`` of the
    resampled curves cross the same way; otherwise "no significant crossover in the measured range".

    Where points on each side exclude parity, the crossing is placed between them: between the last such
    point on the first side and the first on the other (``bracket``), at the first sign change of the point
    estimates inside that bracket — never at a sign change of the estimates among points that exclude nothing
    before it. A curve whose parity-excluding points change side more than once has no single crossover, and
    says so."""
    for c in crossovers:
        names = list(c.get("point_names") or [])
        by_point = {
            d["point"]: d
            for d in deltas
            if d["arm"] == c["arm"] and d["probe"] == c["probe"] and d["metric"] == c["metric"] and d["point"] in names
        }
        xs = c["xs"]
        span = f"{xs[0]:,.0f}–{xs[-1]:,.0f} {c['axis']}"
        # the points whose CI excludes parity, with the side of parity their ratio is on (+1 above, −1 below)
        sided = [
            (x, 1 if (d.get("ratio") or 1.0) > 1 else -1)
            for x, name in zip(xs, names, strict=False)
            if (d := by_point.get(name)) is not None and d["verdict"] in ("better", "worse")
        ]
        changes = [(a, b) for a, b in itertools.pairwise(sided) if a[1] != b[1]]
        share = float(c.get("share") or 0.0)
        estimate = c.get("estimate")
        if len(changes) > 1:
            c["significant"] = False
            above = ", ".join(f"{x:,.0f}" for x, side in sided if side > 0)
            below = ", ".join(f"{x:,.0f}" for x, side in sided if side < 0)
            c["evidence"] = f"points exclude parity above it at {above} and below it at {below} {c['axis']}"
            c["statement"] = f"changes sign more than once in the measured range ({span}): {c['evidence']}"
            continue
        if changes:
            (x0, _), (x1, _) = changes[0]
            inside = [
                (x, float(ratio))
                for x, name in zip(xs, names, strict=False)
                if x0 <= x <= x1 and (ratio := (by_point.get(name) or {}).get("ratio")) is not None
            ]
            found = stats.first_crossing([x for x, _ in inside], [r for _, r in inside]) if len(inside) >= 2 else None
            c["estimate"] = estimate = found if found is not None else (x0 + x1) / 2
            c["ci_low"], c["ci_high"] = x0, x1
            c["bracket"] = [x0, x1]
            c["significant"] = True
            c["evidence"] = (
                f"a point on each side excludes parity: {x0:,.0f} and {x1:,.0f} {c['axis']} are the nearest such "
                "points on either side"
            )
            c["statement"] = (
                f"crosses 1 between {x0:,.0f} and {x1:,.0f} {c['axis']} (the estimates at ~{estimate:,.0f})"
            )
            continue
        significant = estimate is not None and share >= stats.CROSSING_SHARE
        c["significant"] = significant
        if estimate is None:
            c["evidence"] = "the ratio does not change sign"
            c["statement"] = f"no crossover in the measured range ({span})"
            continue
        if significant:
            c["evidence"] = f"{share:.0%} of resampled curves cross the same way"
            ci = ""
            if c.get("ci_low") is not None:
                ci = f" (95% CI {c['ci_low']:,.0f}–{c.get('ci_high') or 0.0:,.0f})"
            c["statement"] = f"crosses 1 at ~{estimate:,.0f} {c['axis']}{ci}"
        else:
            c["evidence"] = (
                f"only {share:.0%} of resampled curves cross the same way (needs {stats.CROSSING_SHARE:.0%}) and no "
                "point on each side excludes parity"
            )
            c["statement"] = f"no significant crossover in the measured range ({span}): {c['evidence']}"


def _short_k(tokens: float) -> str:
    return f"~{tokens / 1000:.1f}K" if tokens >= 1000 else f"~{tokens:.0f}"


def _provisional(rows: Sequence[DeltaRow]) -> str:
    """' — provisional (…)' when a better/worse among ``rows`` rests on a within-boot CI."""
    notes = sorted({d["provisional"] for d in rows if d.get("provisional")})
    return f" — provisional ({notes[0]})" if notes else ""


def _uncertain(rows: Sequence[DeltaRow]) -> str | None:
    """Why ``rows`` cannot be judged at all: no CI anywhere (one sample a side), else None."""
    if rows and all(d.get("ci_low") is None for d in rows):
        fewest = min(min(d.get("n_baseline", 0), d.get("n_arm", 0)) for d in rows)
        return f"not judged: {fewest} sample(s) a side, no CI (more --kv-runs / --kv-depth-runs, or boots)"
    return None


def _standing(rows: Sequence[DeltaRow], baseline: str) -> str:
    """Where an arm stands along a curve with no stated crossover: the points whose CI puts it ahead of or
    behind the baseline, of all the points judged."""
    ahead = sum(d["verdict"] == "better" for d in rows)
    behind = sum(d["verdict"] == "worse" for d in rows)
    total = len(rows)
    if total and ahead == total:
        return f"ahead of {baseline} at every point"
    if total and behind == total:
        return f"behind {baseline} at every point"
    if behind and not ahead:
        return f"behind {baseline} at {behind} of {total} points, ahead at none"
    if ahead and not behind:
        return f"ahead of {baseline} at {ahead} of {total} points, behind at none"
    if ahead and behind:
        return f"ahead of {baseline} at {ahead} and behind at {behind} of {total} points"
    return f"no point differs from {baseline} beyond its CI"


def verdict_sentences(
    deltas: Sequence[DeltaRow], crossovers: Sequence[CrossoverRow], arms: Sequence[str], specs: Specs
) -> list[str]:
    """Plain sentences from the data, like the seed's verdict: short decode first, then each curve."""
    out = []
    for arm in arms[1:]:
        short = [d for d in deltas if d["arm"] == arm and d["probe"] == "short" and d["metric"] == "decode_tps"]
        if short:
            parts = ", ".join(f"{d['point']} {d['delta_pct']:+.1f}%" for d in short if d["delta_pct"] is not None)
            verdicts = {d["verdict"] for d in short}
            if unjudged := _uncertain(short):
                lead = f"{arm} vs {arms[0]} on short requests is {unjudged}"
            elif verdicts == {"better"}:
                lead = f"{arm} wins short requests on decode_tps"
            elif verdicts == {"worse"}:
                lead = f"{arm} loses short requests on decode_tps"
            else:
                lead = f"{arm} vs {arms[0]} on short requests is not conclusive for every shape"
            out.append(f"{lead} ({parts}){_provisional(short)}.")
        curves = [(s.name, s.curve[0]) for s in sorted(specs.values(), key=lambda s: -s.order) if s.curve]
        for probe, metric in curves:
            cross = [c for c in crossovers if c["arm"] == arm and c["probe"] == probe and c["metric"] == metric]
            rows = [d for d in deltas if d["arm"] == arm and d["probe"] == probe and d["metric"] == metric]
            for c in cross:
                estimate, lo, hi = c.get("estimate"), c.get("ci_low"), c.get("ci_high")
                if estimate is not None and c.get("significant", True) and c.get("bracket"):
                    out.append(
                        f"{arm}'s {probe} {metric} relative to {arms[0]} changes sign between "
                        f"{_short_k(lo or 0.0)} and {_short_k(hi or 0.0)} {c['axis']} (points on each side exclude "
                        f"parity; the estimates cross at {_short_k(estimate)}){_provisional(rows)}."
                    )
                elif estimate is not None and c.get("significant", True):
                    out.append(
                        f"{arm}'s {probe} {metric} relative to {arms[0]} changes sign by "
                        f"{_short_k(estimate)} {c['axis']}"
                        + (f" (95% CI {_short_k(lo)}–{_short_k(hi or 0.0)})" if lo else "")
                        + f"{_provisional(rows)}."
                    )
                else:
                    where = _uncertain(rows) or _standing(rows, arms[0])
                    out.append(f"{arm}'s {probe} {metric}: {c['statement']}; {where}{_provisional(rows)}.")
    return out


# ------------------------------------------------------------------------------------------ arms, boots


def arm_entries(run: RunData, arms: Sequence[str]) -> list[ArmEntry]:
    entries: list[ArmEntry] = []
    plan = run.meta.get("plan") or []
    for i, name in enumerate(arms):
        boots = [str(p.get("boot")) for p in plan if p.get("arm") == name] or [name]
        evidence = {boot: run.evidence[boot] for boot in boots if boot in run.evidence}
        first: Evidence = next(iter(evidence.values()), Evidence())
        log = first.get("log") or {}
        entries.append(
            {
                "name": name,
                "baseline": i == 0,
                "declared": first.get("arm") or {"name": name},
                "resolved": {
                    "cache_dtype": resolved_cache_dtype(first),
                    "kv_cache_size_tokens": kv_capacity_tokens(first),
                    "attention_backend": log.get("attention_backend"),
                    "attention_candidates": log.get("attention_candidates"),
                    "engine_version": first.get("engine_version") or log.get("engine_version"),
                    "max_model_len": first.get("max_model_len"),
                    "served_model": first.get("served_model"),
                    "ready_s": first.get("ready_s"),
                    "status": first.get("status"),
                    "speculative": speculative(first),
                },
                "gpu": gpu_summary(first),
                "boots": boots,
                "evidence": evidence,
            }
        )
    return entries


def missing_evidence_notes(entries: Sequence[ArmEntry]) -> list[str]:
    """What each arm's kind of server cannot show (``--kv-engine``), one line per distinct list."""
    by_list: dict[tuple[str, str], list[str]] = {}
    for entry in entries:
        first: Evidence = next(iter(entry["evidence"].values()), Evidence())
        missing = first.get("evidence_missing") or []
        if missing:
            key = (str(first.get("engine_kind") or "?"), "; ".join(missing))
            by_list.setdefault(key, []).append(entry["name"])
    return [f"evidence missing for {', '.join(n)} ({kind} server): {listed}" for (kind, listed), n in by_list.items()]


def gpu_summary(evidence: Evidence) -> GpuSummary:
    """Per card: power cap before/after the arm, VRAM when ready and before stopping; or why none."""
    before, after = evidence.get("gpu_before") or {}, evidence.get("gpu_after") or {}
    if not before.get("gpu"):
        return {"gpu": False, "reason": before.get("reason")}
    post = {c.get("uuid"): c for c in after.get("cards") or []}
    ready = evidence.get("vram_ready_mib") or {}
    loaded = evidence.get("vram_before_stop_mib") or {}
    cards: list[GpuCardSummary] = []
    for card in before.get("cards") or []:
        uuid = card.get("uuid")
        cards.append(
            {
                "index": card.get("index"),
                "uuid": uuid,
                "name": card.get("name"),
                "power_limit_before_w": card.get("power_limit_w"),
                "power_limit_after_w": (post.get(uuid) or {}).get("power_limit_w"),
                "vram_ready_mib": ready.get(str(uuid)),
                "vram_before_stop_mib": loaded.get(str(uuid)),
                "driver_version": before.get("driver_version"),
            }
        )
    return {"gpu": True, "cards": cards, "changes": evidence.get("gpu_changes") or []}


def boot_entries(run: RunData) -> list[BootEntry]:
    """Every planned boot in run order: position, arm, replicate, whether it ran (or why not)."""
    out: list[BootEntry] = []
    for position, entry in enumerate(run.meta.get("plan") or [], 1):
        boot = str(entry.get("boot"))
        evidence = run.evidence.get(boot) or {}
        out.append(
            {
                "position": position,
                "boot": boot,
                "arm": entry.get("arm"),
                "replicate": entry.get("replicate", 1),
                "extra": bool(entry.get("extra")),
                "status": evidence.get("status") or ("skipped" if entry.get("skipped") else "not booted"),
                "skipped": entry.get("skipped"),
                "ready_s": evidence.get("ready_s"),
                "started_unix_s": evidence.get("started_unix_s"),
                "compile_s": (evidence.get("log") or {}).get("compile_s"),
                "compile_cache": (evidence.get("log") or {}).get("compile_cache"),
                "init_engine_s": (evidence.get("log") or {}).get("init_engine_s"),
            }
        )
    return out


def compile_cache_lines(boots: Sequence[BootEntry]) -> list[str]:
    """What the engine's compile cache saved, per arm: boots that compiled against boots that loaded the
    compiled graphs from the cache (their mean time to ready and torch.compile time). Empty when no arm has
    both kinds of boot (e.g. ``--enforce-eager``, or one boot an arm)."""
    lines = []
    for arm in dict.fromkeys(b["arm"] for b in boots):
        ran = [b for b in boots if b["arm"] == arm and b.get("ready_s") is not None]
        compiled = [b for b in ran if b.get("compile_cache") == "miss"]
        cached = [b for b in ran if b.get("compile_cache") == "hit"]
        if not compiled or not cached:
            continue
        ready_c = float(np.mean([float(b["ready_s"] or 0.0) for b in compiled]))
        ready_h = float(np.mean([float(b["ready_s"] or 0.0) for b in cached]))
        comp = [s for b in compiled if (s := b.get("compile_s")) is not None]
        load = [s for b in cached if (s := b.get("compile_s")) is not None]
        detail = (
            f"; torch.compile {np.mean(comp):.1f} s compiling, {np.mean(load):.1f} s loading" if comp and load else ""
        )
        lines.append(
            f"{arm}: {len(compiled)} boot(s) compiled (ready after {ready_c:.0f} s), {len(cached)} loaded the "
            f"compile cache (ready after {ready_h:.0f} s mean): {ready_c - ready_h:.0f} s saved a boot{detail}."
        )
    return lines


def boot_results(data: pd.DataFrame, boots: Sequence[BootEntry], specs: Specs) -> list[BootResult]:
    """Per boot, per probe point: the probe's primary metric (mean and n of valid samples)."""
    rows: list[BootResult] = []
    if data.empty:
        return rows
    for boot in boots:
        mine = data[data["boot"] == boot["boot"]]
        for probe in _probes(mine, specs):
            if spec_of(probe, specs).own_section:
                continue  # differences from the baseline: in their own section, not a boot's figure
            metric = spec_of(probe, specs).primary_metric
            by_probe = mine[mine["probe"] == probe]
            for point in sorted(by_probe["point"].unique(), key=point_sort):
                found = values(by_probe[by_probe["point"] == point], metric)
                if found:
                    rows.append(
                        {
                            "boot": boot["boot"],
                            "arm": boot["arm"],
                            "position": boot["position"],
                            "probe": probe,
                            "point": point,
                            "metric": metric,
                            "mean": float(np.mean(found)),
                            "n": len(found),
                        }
                    )
    return rows


def block_entries(run: RunData) -> list[BlockEntry]:
    """The blocks of a pytest-xdist run, from the controller's ``run.json`` (plan and lanes) and each boot's
    evidence: lane, its workers, host and cards, the cards' models and driver, the engine version, the boots
    in the order they ran, and what became of the block (complete, lost with the worker that died, …)."""
    lanes = {int(entry.get("lane") or 0): entry for entry in run.meta.get("lanes") or []}
    if not lanes:
        return []
    by_block: dict[int, list[PlanEntry]] = {}
    for entry in run.meta.get("plan") or []:
        by_block.setdefault(int(entry.get("block") or entry.get("replicate") or 1), []).append(entry)
    out: list[BlockEntry] = []
    for number, entries in sorted(by_block.items()):
        lane = int(entries[0].get("lane") or 0)
        info = lanes.get(lane, {})
        evidence = [run.evidence.get(str(e.get("boot"))) or {} for e in entries]
        ran = [e for e in evidence if e.get("status") in ("ready", "stopped")]
        before: dict[str, Any] = next(
            (dict(e.get("gpu_before") or {}) for e in ran if (e.get("gpu_before") or {}).get("gpu")), {}
        )
        lost = [str(e["lost"]) for e in entries if e.get("lost")]
        skipped = [e for e in entries if e.get("skipped")]
        failed = [e for e in evidence if e.get("status") == "failed"]
        if lost:
            status = f"lost: {lost[0]}"
        elif skipped and len(skipped) == len(entries):
            status = "skipped (adaptive)"
        elif failed:
            status = f"failed: {', '.join(str(e.get('boot')) for e in failed)} did not boot"
        elif len(ran) == len(entries):
            status = "complete"
        else:
            status = "incomplete"
        out.append(
            {
                "block": number,
                "lane": lane,
                "workers": [str(w) for w in info.get("workers") or []],
                "host": info.get("host"),
                "gpus": info.get("gpus"),
                "gpu_models": sorted({str(c.get("name")) for c in before.get("cards") or [] if c.get("name")}),
                "driver": before.get("driver_version"),
                "engine_version": next((str(e["engine_version"]) for e in ran if e.get("engine_version")), None),
                "boots": [str(e.get("boot")) for e in entries],
                "status": status,
            }
        )
    return out


def adaptive_text(run: RunData, boots: Sequence[BootEntry]) -> str | None:
    """How many boots the adaptive rounds added and why (from ``sampling.jsonl``'s round decisions), or None
    when the plan held no adaptive round."""
    extra = [b for b in boots if b.get("extra")]
    if not extra:
        return None
    budget = run.settings.get("max_replicates")
    booted = [b for b in extra if b["status"] in ("ready", "stopped", "failed")]
    decisions = [s for s in run.sampling if s.get("kind") == "rounds"]
    why = "; ".join(f"round {s.get('round')}: {s.get('decision')} — {s.get('reason')}" for s in decisions)
    return (
        f"Adaptive boots: {len(booted)} of {len(extra)} added (boot budget {budget} per arm, --kv-max-replicates)"
        + (f" — {why}" if why else "")
        + "."
    )


def ci_statement(
    boots: Sequence[BootEntry],
    arms: Sequence[str],
    launcher: object = None,
    blocks: Sequence[BlockEntry] = (),
    adaptive: str | None = None,
) -> CiStatement:
    """How many boots each arm had, and what the report's CIs therefore cover. Against external endpoints
    (``launcher`` "external") nothing is booted: replicates are repeats against one server per arm, one
    resampling unit, and the sentence says so. With ``blocks`` (pytest-xdist) comparisons are paired by
    block, and each lane's order is given."""
    ran = [b for b in boots if b["status"] in ("ready", "stopped")]
    per_arm = {arm: sum(1 for b in ran if b["arm"] == arm) for arm in arms}
    fewest = min(per_arm.values()) if per_arm else 0
    counts = ", ".join(f"{a} {n}" for a, n in per_arm.items())
    if launcher == "external":
        return {
            "boots_per_arm": {arm: min(n, 1) for arm, n in per_arm.items()},
            "method": "within-boot",
            "order": [b["boot"] for b in ran],
            "text": (
                f"CIs cover repeats against one server per arm only (external endpoints are measured, not booted: "
                f"repeats per arm: {counts}); server-to-server variation is not in them — boot the engines "
                f"(--kv-launcher=process or docker) with --kv-replicates={MIN_BOOTS_FOR_BOOT_CI} for CIs over boots."
            ),
        }
    lanes = sorted({b["lane"] for b in blocks})
    if fewest >= MIN_BOOTS_FOR_BOOT_CI and len(lanes) > 1:
        text = (
            f"CIs are computed over boots, paired by block across {len(lanes)} lanes (each block's ratio of its "
            f"arms' boot means, both on one lane; a t-interval over the blocks' log ratios); boots per arm: {counts}."
        )
    elif fewest >= MIN_BOOTS_FOR_BOOT_CI:
        text = (
            f"CIs are computed over boots (a Welch t-interval on the log of the boot means); boots per arm: {counts}."
        )
    else:
        text = (
            f"CIs cover within-boot noise only (boots per arm: {counts}); verdicts and gates judge them widened by "
            f"the default boot-to-boot band of each metric family (docs/gates.md) — --kv-replicates="
            f"{MIN_BOOTS_FOR_BOOT_CI} or more puts boot-to-boot variation in the CIs themselves."
        )
    if adaptive:
        text += " " + adaptive
    found: CiStatement = {
        "boots_per_arm": per_arm,
        "method": "boots" if fewest >= MIN_BOOTS_FOR_BOOT_CI else "within-boot",
        "order": [b["boot"] for b in ran],
        "text": text,
    }
    if lanes:
        started = {b["boot"]: b.get("started_unix_s") or 0.0 for b in ran}
        found["lane_order"] = {
            f"lane {lane}": sorted(
                (boot for block in blocks if block["lane"] == lane for boot in block["boots"] if boot in started),
                key=lambda boot: started[boot],
            )
            for lane in lanes
        }
    return found


# ------------------------------------------------------------------------------------------ agreement


def agreement_report(run: RunData, arms: Sequence[str]) -> AgreementSection:
    """Output agreement from ``agreement.jsonl``: between each arm and the baseline (same replicate, same
    request index), within a boot (request 0 vs 1) and across boots of one arm (request 0 of each)."""
    records = run.agreement
    if not records:
        return {"rows": [], "notes": []}
    tokens = {
        (r["boot"], r["shape"], r["index"]): agreement.Tokens(tuple(r["ids"]), tuple(r["logprobs"]))
        for r in records
        if r.get("ok")
    }
    notes = sorted({f"{r['boot']} {r['shape']}: {r.get('error')}" for r in records if not r.get("ok")})
    shapes = list(dict.fromkeys(r["shape"] for r in records))
    boots_of: dict[str, dict[int, str]] = {}
    indices = sorted({int(r["index"]) for r in records})
    for r in records:
        boots_of.setdefault(str(r.get("arm")), {})[int(r.get("replicate") or 1)] = r["boot"]
    rows: list[AgreementRow] = []
    Key = tuple[str, str, int]

    def add(kind: str, arm: str, other: str, shape: str, pairs: list[tuple[Key, Key]]) -> None:
        found = [agreement.compare_pair(tokens[a], tokens[b]) for a, b in pairs if a in tokens and b in tokens]
        if found:
            row = cast(AgreementRow, {"kind": kind, "arm": arm, "baseline": other, "shape": shape})
            row.update(cast(AgreementRow, agreement.summarize(found)))
            rows.append(row)

    base = arms[0] if arms else None
    for shape in shapes:
        for arm in arms[1:]:
            if base is None:
                continue
            reps = sorted(set(boots_of.get(base, {})) & set(boots_of.get(arm, {})))
            pairs = [((boots_of[base][r], shape, i), (boots_of[arm][r], shape, i)) for r in reps for i in indices]
            add("between arms", arm, base, shape, pairs)
        for arm in arms:
            boots = [boots_of.get(arm, {})[r] for r in sorted(boots_of.get(arm, {}))]
            if len(indices) >= 2:
                add("within a boot", arm, arm, shape, [((b, shape, indices[0]), (b, shape, indices[1])) for b in boots])
            if len(boots) >= 2:
                add("across boots", arm, arm, shape, [((boots[0], shape, 0), (b, shape, 0)) for b in boots[1:]])
    return {"rows": rows, "notes": notes}


def report_verdicts(report: Report, specs: Specs) -> list[str]:
    """The verdict sentences of a report: speed (short decode, each curve), output agreement, fidelity."""
    arms = [a["name"] for a in report["arms"]]
    found = verdict_sentences(report["deltas"], report["crossovers"], arms, specs)
    found += agreement_sentences(report["agreement"]["rows"], arms)
    scored = report.get("fidelity")
    found += fidelity_report.sentences(scored["rows"] if scored else [], report["deltas"], arms)
    sessions = report.get("capacity")
    return found + (capacity_report.sentences(sessions, arms, report["deltas"]) if sessions else [])


def agreement_sentences(rows: Sequence[AgreementRow], arms: Sequence[str]) -> list[str]:
    """Next to the speed verdicts: whether each arm's greedy outputs match the baseline's."""
    out = []
    for arm in arms[1:]:
        mine = [r for r in rows if r.get("kind") == "between arms" and r.get("arm") == arm]
        if not mine:
            continue
        pairs = sum(r.get("pairs", 0) for r in mine)
        same = sum(round(r.get("identical_share", 0.0) * r.get("pairs", 0)) for r in mine)
        if same == pairs:
            out.append(f"{arm}'s greedy outputs are identical to {arms[0]}'s ({same} of {pairs} sequences).")
            continue
        where = ", ".join(
            f"{r.get('shape')} at token {divergence:.0f}"
            for r in mine
            if (divergence := r.get("mean_first_divergence")) is not None
        )
        out.append(
            f"{arm} changes greedy outputs: {same} of {pairs} sequences identical to {arms[0]}'s"
            + (f"; first divergence (mean) {where}." if where else ".")
        )
    return out


def confound_report(run: RunData, boots: Sequence[BootEntry], allow: Sequence[str]) -> Confounds:
    evidence = [run.evidence[b["boot"]] for b in boots if b["boot"] in run.evidence]
    found = confounds.find(evidence, allow)
    found["lines"] = [confounds.describe(e) for e in found.get("confounds") or []]
    return found


# ------------------------------------------------------------------------------------------ self-check


def measured_itl_s(records: Sequence[Record]) -> float | None:
    """Median time between token chunks over the run's valid measured streams (decode window / gaps)."""
    gaps = []
    for r in records:
        sample = r.get("sample") or {}
        chunks = sample.get("token_chunks") or 0
        first, last = sample.get("first_token_s"), sample.get("last_token_s")
        if r.get("phase") == "measured" and r.get("ok") and chunks > 1 and first is not None and last is not None:
            gaps.append((last - first) / (chunks - 1))
    return float(np.median(gaps)) if gaps else None


def client_load_report(records: Sequence[Record]) -> ClientLoadSection | None:
    """The many-stream client's load over the concurrency probe's measured trials (None: no such trial)."""
    trials: dict[tuple[object, ...], dict[str, Any]] = {}
    for r in records:
        load = r.get("client")
        if r.get("probe") == "concurrency" and r.get("phase") == "measured" and isinstance(load, dict):
            trials.setdefault((r.get("boot"), r.get("shape"), r.get("index")), {"arm": r.get("arm"), **load})
    if not trials:
        return None
    loads = list(trials.values())

    def worst(key: str) -> float:
        return max(float(load.get(key) or 0.0) for load in loads)

    return {
        "trials": len(loads),
        "processes_max": int(worst("processes")),
        "cpu_share_max": worst("cpu_share_max"),
        "loop_lag_p99_max_s": worst("loop_lag_p99_s"),
        "timer_lag_p99_max_s": worst("timer_lag_p99_s"),
        "schedule_delay_max_s": worst("schedule_delay_max_s"),
        "saturated": [
            {
                "boot": str(boot),
                "arm": str(load["arm"]),
                "point": str(shape),
                "trial": int(cast(int, index)),
                "reasons": [str(reason) for reason in load.get("reasons") or []],
            }
            for (boot, shape, index), load in trials.items()
            if load.get("saturated")
        ],
    }


def self_check_report(run: RunData) -> SelfCheckSection | None:
    """The run's self-check in one sentence, and a warning when the client's own time per chunk exceeds 2%
    of the inter-token time this run measured."""
    check = run.meta.get("self_check")
    if not check:
        return None
    from pytest_kvcache.selfcheck import overhead_warning

    if check.get("error"):
        return {"error": str(check["error"]), "warnings": []}
    m = cast(dict[str, dict[str, float | None]], check.get("metrics") or {})

    def fig(name: str, key: str = "median") -> str:
        value = (m.get(name) or {}).get(key)
        return "–" if value is None else f"{value:.3g}"

    schedule = cast(dict[str, float], check.get("schedule") or {})
    summary = (
        f"Measuring-client self-check ({check.get('mode', 'quick')}, {check.get('n')} streams of "
        f"{schedule.get('completion_tokens')} tokens at ITL {1e3 * (schedule.get('itl_s') or 0):.2f} ms on loopback): "
        f"TTFT error median {fig('ttft_error_ms')} ms (p95 {fig('ttft_error_ms', 'p95')} ms), decode-TPS error "
        f"median {fig('decode_tps_error_pct')}% (p95 {fig('decode_tps_error_pct', 'p95')}%), client CPU "
        f"{fig('cpu_per_chunk_us')} µs per chunk (selfcheck.json)."
    )
    itl = measured_itl_s(run.records)
    warning = overhead_warning(dict(check), itl) if itl else None
    overhead = check.get("overhead_per_chunk_s")
    return {
        "summary": summary,
        "measured_itl_s": itl,
        "overhead_per_chunk_s": float(overhead) if isinstance(overhead, int | float) else None,
        "warnings": [warning] if warning else [],
    }


# ------------------------------------------------------------------------------------------ agentic, spec


def agentic_section(data: pd.DataFrame, arms: Sequence[str]) -> AgenticSection:
    """Per arm and turn, means across sessions; and each arm's TTFT-growth verdict (the seed's words)."""
    from pytest_kvcache.probes.agentic import growth_verdict

    sub = data[(data["probe"] == "agentic") & data["valid"]] if not data.empty else data
    if sub.empty or "turn" not in sub:
        return {"turns": [], "growth": []}
    table = (
        sub.groupby(["arm", "turn"])
        .agg(
            sessions=("session", "nunique"),
            prompt_tokens=("prompt_tokens", "mean"),
            cached_tokens=("cached_tokens", "mean"),
            ttft_s=("ttft_s", "mean"),
            ttft_s_std=("ttft_s", "std"),
            decode_tps=("decode_tps", "mean"),
        )
        .reset_index()
    )
    order = {name: i for i, name in enumerate(arms)}
    table = table.sort_values(["arm", "turn"], key=lambda col: col.map(order) if col.name == "arm" else col)

    def num(value: object) -> float | None:
        return float(cast(float, value)) if value is not None and value == value else None

    turns: list[AgenticTurn] = [
        {
            "arm": str(row["arm"]),
            "turn": int(row["turn"]),
            "sessions": int(row["sessions"]),
            "prompt_tokens": num(row["prompt_tokens"]),
            "cached_tokens": num(row["cached_tokens"]),
            "ttft_s": num(row["ttft_s"]),
            "ttft_s_std": num(row["ttft_s_std"]),
            "decode_tps": num(row["decode_tps"]),
        }
        for _, row in table.iterrows()
    ]
    growth: list[GrowthVerdict] = []
    for arm in [a for a in arms if a in set(table["arm"])]:
        mine = [t for t in turns if t["arm"] == arm and t.get("ttft_s") is not None]
        found = growth_verdict(
            {t["turn"]: float(t.get("ttft_s") or 0.0) for t in mine},
            {t["turn"]: float(t.get("prompt_tokens") or 0.0) for t in mine},
        )
        entry: GrowthVerdict = {"arm": arm, "verdict": str(found["verdict"])}
        if "ttft_growth" in found:
            entry["ttft_growth"] = float(found["ttft_growth"])
            entry["context_growth"] = float(found["context_growth"])
            entry["last_turn"] = int(found["last_turn"])
            entry["flags"] = {str(k): str(v) for k, v in found["flags"].items()}
            entry["line"] = (
                f"{arm}: TTFT grew {found['ttft_growth']:.1f}× while context grew "
                f"{found['context_growth']:.1f}× (turn 2 → {found['last_turn']}): {found['verdict']}"
            )
        else:
            entry["line"] = f"{arm}: {found['verdict']} for a growth verdict"
        growth.append(entry)
    return {"turns": turns, "growth": growth}


def spec_decode_section(
    records: Sequence[Record], arms: Sequence[str], specs: Specs, config: Mapping[str, str | None], seed: int
) -> SpecDecodeSection:
    """Speculative-decoding acceptance per arm, probe and point from the per-request ``/metrics`` deltas
    (measured requests that drafted), with the mean acceptance length's CI; or "not enabled"."""
    groups: dict[tuple[str, str, str], list[Record]] = {}
    for r in records:
        engine = r.get("engine") or {}
        if r.get("phase") != "measured" or not r.get("ok") or not engine.get("spec_drafts"):
            continue
        key = (str(r.get("arm")), str(r.get("probe")), point_of(r, specs))
        groups.setdefault(key, []).append(r)
    rows: list[SpecDecodeRow] = []
    order = {arm: i for i, arm in enumerate(arms)}
    for (arm, probe, point), found in sorted(
        groups.items(),
        key=lambda kv: (order.get(kv[0][0], 99), spec_of(kv[0][1], specs).order, kv[0][1], point_sort(kv[0][2])),
    ):
        engines = [r.get("engine") or {} for r in found]
        drafts = sum(int(cast(int, e.get("spec_drafts") or 0)) for e in engines)
        drafted = sum(int(cast(int, e.get("spec_draft_tokens") or 0)) for e in engines)
        accepted = sum(int(cast(int, e.get("spec_accepted_tokens") or 0)) for e in engines)
        width = max((len(cast(list[int], e.get("spec_accepted_per_position") or [])) for e in engines), default=0)
        by_position = [0] * width
        for e in engines:
            for i, n in enumerate(cast(list[int], e.get("spec_accepted_per_position") or [])):
                by_position[i] += int(n)
        lengths = [v for r in found if (v := (r.get("metrics") or {}).get("acceptance_length")) is not None]
        mean, lo, hi = stats.mean_ci(lengths, seed=seed)
        rows.append(
            {
                "arm": arm,
                "probe": probe,
                "point": point,
                "requests": len(found),
                "drafts": drafts,
                "drafted": drafted,
                "accepted": accepted,
                "acceptance_pct": 100 * accepted / drafted if drafted else 0.0,
                "acceptance_length": 1 + accepted / drafts,
                "acceptance_length_mean": mean,
                "ci_low": lo,
                "ci_high": hi,
                "per_position": [n / drafts for n in by_position],
            }
        )
    parts = []
    for arm in arms:
        mine = [r for r in rows if r["arm"] == arm]
        for probe in dict.fromkeys(r["probe"] for r in mine):
            at = [r for r in mine if r["probe"] == probe]
            drafts = sum(r["drafts"] for r in at)
            drafted, accepted = sum(r["drafted"] for r in at), sum(r["accepted"] for r in at)
            parts.append(
                f"{arm} {probe}: mean acceptance length {1 + accepted / drafts:.2f} "
                f"({accepted}/{drafted} draft tokens accepted, {100 * accepted / drafted if drafted else 0:.1f}%)"
            )
    setup = "; ".join(f"{arm} {config.get(arm) or 'not stated'}" for arm in arms)
    scraped = any(r.get("engine") for r in records if r.get("phase") == "measured")
    line = (
        ("; ".join(parts) + f" — speculation: {setup}")
        if parts
        else "not enabled (no vllm:spec_decode_* counters moved)"
        if scraped
        else "not measured (no request had the engine's vLLM counters read around it)"
    )
    return {"rows": rows, "config": {arm: config.get(arm) for arm in arms}, "line": line}


def host_cpu_note(records: Sequence[Record], action: object) -> str | None:
    """How many measured samples saw the host's CPU busy outside the engine and client (``host_cpu_busy``)."""
    busy = [r for r in records if r.get("phase") == "measured" and "host_cpu_busy" in (r.get("flags") or [])]
    if not busy:
        return None
    peaks = [p for r in busy if isinstance(p := (r.get("host_cpu") or {}).get("other_busy_pct_max"), int | float)]
    peak = f" (max {max(peaks):.0f}%)" if peaks else ""
    done = "excluded" if action == "exclude" else "flagged"
    return f"{len(busy)} measured sample(s) saw the host's CPU busy outside the engine and client{peak}: {done}"


def flag_summary(records: Sequence[Record]) -> FlagSummary:
    flagged = [r for r in records if r.get("phase") == "measured" and r.get("flags")]
    return {"samples": len(flagged), "kinds": sorted({f for r in flagged for f in r.get("flags") or []})}


# ------------------------------------------------------------------------------------------ the report


def build(run: RunData, allow_diff: Sequence[str] = ()) -> Report:
    """The report of one loaded run folder (``report.json``'s content, before judging). ``allow_diff`` adds
    to the run's own ``--kv-allow-diff`` keys."""
    specs = run.specs
    arms = run.arms
    seed = run.seed
    data = run.frame
    platform = bands.platform_of(run.evidence)
    deltas = delta_rows(data, arms, specs, seed)
    used_bands = bands.judge_deltas(deltas, platform)
    crossovers = crossover_rows(data, arms, specs, seed, platform)
    judge_crossovers(crossovers, deltas)
    boots = boot_entries(run)
    plan = run.meta.get("plan") or []
    notes = []
    if not run.records and not run.fidelity:
        notes.append("no requests were recorded")
    for arm in arms:
        if arm not in run.evidence and not any(p.get("arm") == arm for p in plan):
            notes.append(f"no evidence for arm {arm}")
    if run.torn_lines:
        notes.append(
            f"{run.torn_lines} line(s) of requests.jsonl could not be read (torn by a killed run) and were skipped"
        )
    notes += [f"reaped at the start of the run: {line}" for line in run.meta.get("reaped") or []]
    notes += list(run.problems)
    settings = run.meta.get("settings") or {}
    host_cpu = host_cpu_note(run.records, settings.get("host_cpu_action"))
    notes += [host_cpu] if host_cpu else []
    allow = [*cast(list[str], settings.get("allow_diff") or []), *allow_diff]
    agreed = agreement_report(run, arms)
    entries = arm_entries(run, arms)
    blocks = block_entries(run)
    notes += missing_evidence_notes(entries)
    report: Report = {
        "report_version": REPORT_VERSION,
        "run_id": run.meta.get("run_id"),
        "status": run.meta.get("status"),
        "model": run.meta.get("model"),
        "versions": run.meta.get("versions"),
        "cost": cost_report.section(run, boots),
        "arms": entries,
        "boots": boots,
        "boot_results": boot_results(data, boots, specs),
        "compile_cache": compile_cache_lines(boots),
        "ci": ci_statement(boots, arms, run.settings.get("launcher"), blocks, adaptive_text(run, boots)),
        "confounds": confound_report(run, boots, allow),
        "agreement": agreed,
        "sampling": run.sampling,
        "self_check": self_check_report(run),
        "client_load": client_load_report(run.records),
        "summary": summary_rows(data, arms, specs),
        "deltas": deltas,
        "crossovers": crossovers,
        "verdicts": [],
        "notes": notes,
        "seed": seed,
        "probes": [specs[p].to_dict() for p in sorted(specs, key=lambda n: (specs[n].order, n))],
        "agentic": agentic_section(data, arms),
        "spec_decode": spec_decode_section(
            run.records, arms, specs, {a["name"]: a["resolved"].get("speculative") for a in entries}, seed
        ),
        "fidelity": fidelity_report.section(run.fidelity_blocks, run.fidelity, arms, settings, seed),
        "energy": energy_report.section(data, run.energy, arms, specs),
        "greedy": greedy.section(run.agreement, arms),
        "left_out": left_out.section(run.path, settings, run.records),
        "flags": flag_summary(run.records),
        "bands": {"platform": platform, "families": used_bands},
        "failures": failures.section(run.records, arms, specs),
    }
    if not data.empty and (data["probe"] == capacity_report.PROBE).any():
        report["capacity"] = capacity_report.section(data, arms, deltas, run.evidence, settings, seed)
    if blocks:
        report["blocks"] = blocks
    report["verdicts"] = report_verdicts(report, specs)
    return report
