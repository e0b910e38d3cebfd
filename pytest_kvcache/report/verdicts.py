"""The verdict prose: which crossovers the data carry (:func:`judge_crossovers`), and the plain sentences
of a report's verdict — speed (short decode, each curve), output agreement, fidelity, capacity — like the
seed's verdict."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from pytest_kvcache import crossing
from pytest_kvcache.model.report import AgreementRow, CrossoverRow, DeltaRow, Report
from pytest_kvcache.report import deciding
from pytest_kvcache.report import fidelity as fidelity_report
from pytest_kvcache.report.capacity import section as capacity_section
from pytest_kvcache.report.points import Specs


def judge_crossovers(crossovers: Sequence[CrossoverRow], deltas: Sequence[DeltaRow]) -> None:
    """Which crossings the data carry (in place): a sign change is stated only when a point on each side of
    parity has a CI that excludes it (its delta's verdict, judged as the report judges it: over boots, or
    within boots widened by the band or the A/A noise, and after Holm within the curve's points —
    ``report.multiplicity``); otherwise "no significant crossover in the measured range". The share of
    resampled curves that cross the same way is evidence beside it, never enough alone (one test per curve
    that would bypass the points' multiplicity control).

    With one agentic session a turn is its content and its depth at once: no crossover in prompt tokens is
    stated; the turns that differ are named ("turn 9 differs").

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
        if changes and c.get("sessions") == 1:
            turn = dict(zip(xs, names, strict=False))
            c["significant"] = False
            c["evidence"] = "; ".join(
                f"{_turns([turn[x] for x, s in sided if s == side])} {'above' if side > 0 else 'below'} parity"
                for side in (sided[0][1], -sided[0][1])
            )
            c["statement"] = (
                f"{c['evidence']} (one session: each turn is its content and its depth at once, so no crossover in "
                f"{c['axis']} is stated)"
            )
            continue
        if len(changes) > 1:
            c["significant"] = False
            above = ", ".join(f"{x:,.0f}" for x, side in sided if side > 0)
            below = ", ".join(f"{x:,.0f}" for x, side in sided if side < 0)
            c["evidence"] = (
                f"points exclude parity on {deciding.which(list(by_point.values()))} above it at {above} and below "
                f"it at {below} {c['axis']}"
            )
            c["statement"] = f"changes sign more than once in the measured range ({span}): {c['evidence']}"
            continue
        if changes:
            (x0, _), (x1, _) = changes[0]
            inside = [
                (x, float(ratio))
                for x, name in zip(xs, names, strict=False)
                if x0 <= x <= x1 and (ratio := (by_point.get(name) or {}).get("ratio")) is not None
            ]
            found = (
                crossing.first_crossing([x for x, _ in inside], [r for _, r in inside]) if len(inside) >= 2 else None
            )
            c["estimate"] = estimate = found if found is not None else (x0 + x1) / 2
            c["ci_low"], c["ci_high"] = x0, x1
            c["bracket"] = [x0, x1]
            c["significant"] = True
            c["evidence"] = (
                f"a point on each side excludes parity on {deciding.which(list(by_point.values()))}: {x0:,.0f} and "
                f"{x1:,.0f} {c['axis']} are the nearest such points on either side"
            )
            c["statement"] = (
                f"crosses 1 between {x0:,.0f} and {x1:,.0f} {c['axis']} (the estimates at ~{estimate:,.0f})"
            )
            continue
        c["significant"] = False
        if estimate is None:
            c["evidence"] = "the ratio does not change sign"
            c["statement"] = f"no crossover in the measured range ({span})"
            continue
        if share >= crossing.CROSSING_SHARE:
            c["evidence"] = (
                f"{share:.0%} of resampled curves cross the same way, but no point on each side excludes parity "
                "(after Holm within the curve's points)"
            )
        else:
            c["evidence"] = (
                f"only {share:.0%} of resampled curves cross the same way (needs {crossing.CROSSING_SHARE:.0%}) and no "
                "point on each side excludes parity"
            )
        c["statement"] = f"no significant crossover in the measured range ({span}): {c['evidence']}"


def _turns(names: Sequence[str]) -> str:
    """``turn9`` → "turn 9 differs"; several: "turns 4, 5 and 13 differ"."""
    numbers = [n.removeprefix("turn") for n in names]
    if len(numbers) == 1:
        return f"turn {numbers[0]} differs"
    return f"turns {', '.join(numbers[:-1])} and {numbers[-1]} differ"


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
    on = f" (each point judged on {deciding.which(rows)})"
    if total and ahead == total:
        return f"ahead of {baseline} at every point{on}"
    if total and behind == total:
        return f"behind {baseline} at every point{on}"
    if behind and not ahead:
        return f"behind {baseline} at {behind} of {total} points, ahead at none{on}"
    if ahead and not behind:
        return f"ahead of {baseline} at {ahead} of {total} points, behind at none{on}"
    if ahead and behind:
        return f"ahead of {baseline} at {ahead} and behind at {behind} of {total} points{on}"
    return f"no point differs from {baseline} beyond {deciding.which(rows)}"


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
                        f"parity on {deciding.which(rows)}; the estimates cross at {_short_k(estimate)})"
                        f"{_provisional(rows)}."
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


def report_verdicts(report: Report, specs: Specs) -> list[str]:
    """The verdict sentences of a report: speed (short decode, each curve), output agreement, fidelity."""
    arms = [a["name"] for a in report["arms"]]
    found = verdict_sentences(report["deltas"], report["crossovers"], arms, specs)
    found += agreement_sentences(report["agreement"]["rows"], arms)
    scored = report.get("fidelity")
    found += fidelity_report.sentences(scored["rows"] if scored else [], report["deltas"], arms)
    sessions = report.get("capacity")
    return found + (capacity_section.sentences(sessions, arms, report["deltas"]) if sessions else [])


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
