"""``report.md``'s closing sections: against a stored run, crossovers, the verdict, failures, gates,
sampling and notes, and what every delta is — one renderer each (``(report) -> lines``), and the lines the
terminal, ``report.html`` and the GitHub step summary share."""

from __future__ import annotations

from collections.abc import Sequence

from pytest_kvcache.model.report import GateResult, Report
from pytest_kvcache.report import failures
from pytest_kvcache.report.outputs.formats import _md_table, fmt_delta


def failure_lines(report: Report) -> list[str]:
    """report.md's "Failures and exclusions" section (always there: none is a finding too)."""
    found = report.get("failures")
    if not found:
        return []
    lines = ["", "## Failures and exclusions", "", found["lines"][0]]
    rows = failures.table(found)
    if rows:
        lines += ["", *_md_table(failures.HEADER, rows)]
    return lines


def sampling_lines(report: Report) -> list[str]:
    lines = []
    for s in report.get("sampling") or []:
        if s.get("kind") == "rounds":
            lines.append(f"round {s['round']}: {s['decision']} — {s['reason']}")
        else:
            lines.append(f"{s.get('probe')}@{s.get('point')} on {s.get('boot')}: {s.get('reason')}")
    return lines


def client_load_line(report: Report) -> str | None:
    """The concurrency probe's client load in one sentence, naming the trials it was saturated in."""
    load = report.get("client_load")
    if not load:
        return None
    line = (
        f"Many-stream client over {load['trials']} measured concurrency trial(s) ({load['processes_max']} "
        f"process(es) at most): busiest process {100 * load['cpu_share_max']:.0f}% of a core, event-loop lag p99 "
        f"≤ {1e3 * load['loop_lag_p99_max_s']:.2f} ms (its timer woke ≤ {1e3 * load['timer_lag_p99_max_s']:.1f} ms "
        f"late, p99), requests sent ≤ {1e3 * load['schedule_delay_max_s']:.1f} ms after their time"
    )
    saturated = load["saturated"]
    if not saturated:
        return line + "; never saturated."
    named = "; ".join(f"{s['arm']} {s['point']} trial {s['trial']} ({', '.join(s['reasons'])})" for s in saturated[:4])
    return (
        f"{line}; saturated in {len(saturated)} trial(s), whose figures are the client's and are excluded: "
        f"{named}{' …' if len(saturated) > 4 else ''} (--kv-client-procs)."
    )


def self_check_line(report: Report) -> str | None:
    check = report.get("self_check")
    if not check:
        return None
    if check.get("error"):
        return f"Measuring-client self-check failed: {check['error']}"
    summary = check.get("summary")
    return str(summary) if summary else None


def note_lines(report: Report) -> list[str]:
    """The report's notes, with the noise band, the self-check, flagged samples and speculation off."""
    noise = report.get("noise")
    check = self_check_line(report)
    notes = list(report.get("notes") or [])
    if noise:
        notes.append(
            f"within-boot verdicts and gates are judged with the spread of the A/A noise run {noise['run']} (its "
            f"σ̂ of log boot means, scaled by this run's boots; t on its df); {noise['missing']} delta(s) had no "
            "spread there"
        )
    if check:
        notes.append(check)
    notes += (report.get("self_check") or {}).get("warnings") or []
    load = client_load_line(report)
    if load:
        notes.append(load)
    flags = report.get("flags")
    if flags and flags["samples"]:
        notes.append(f"{flags['samples']} measured sample(s) flagged: {', '.join(flags['kinds'])}")
    spec = report.get("spec_decode")
    if spec and not spec["rows"]:
        notes.append(f"speculative decoding: {spec['line']}")
    return notes


#: What every delta in the report is (report.md's and report.html's last words).
DELTA_NOTE = (
    "Deltas: ratio of means arm/baseline − 1, with the 95% interval its verdict was judged on in brackets — the CI "
    "over boots with 3+ boots per arm (a t-interval on the log of the boot means), else the within-boot bootstrap "
    "CI (paired by request or turn where the probe pairs them) widened by a boot-to-boot spread (the default band, "
    "this run's boots, the A/A noise run or the widest spread measured on any host: the first screen says which), "
    'the within-boot CI itself then shown after it as "within-boot [..]"; verdict direction-aware, inconclusive '
    "when the bracketed interval contains 0."
)


def gate_evidence(gate: GateResult) -> str:
    """What decided a gate, and for an open one how many more boots would likely decide it."""
    text = (gate.get("evidence") or {}).get("text") or gate.get("reason") or ""
    if gate["outcome"] == "inconclusive" and "boots_to_decide" in gate:
        more = gate.get("boots_to_decide")
        text += f"; likely decided by {more} more boot(s) per arm" if more else "; not within reach of more boots"
    return text


def gate_table(gates: Sequence[GateResult]) -> list[str]:
    """The gates as a table: outcome, name, value, CI, threshold and deciding evidence."""
    return _md_table(
        ["Outcome", "Gate", "Value", "Deciding 95% CI", "Threshold", "Decided by"],
        [
            [
                g["outcome"].upper(),
                g["name"],
                g.get("value_text", "–"),
                g.get("ci_text", "–"),
                g.get("threshold_text", "–"),
                gate_evidence(g),
            ]
            for g in gates
        ],
    )


def gate_summary(report: Report) -> str:
    """The gates first, for the GitHub step summary: a headline with the counts, then the table."""
    gates = report.get("gates") or []
    if not gates:
        return ""
    counts = {k: sum(1 for g in gates if g["outcome"] == k) for k in ("error", "fail", "inconclusive", "pass")}
    head = ", ".join(f"{n} {k.upper()}" for k, n in counts.items() if n)
    return "\n".join([f"## pytest-kvcache gates: {head}", "", *gate_table(gates), ""]) + "\n"


def render_compare(report: Report) -> list[str]:
    compare = report.get("compare")
    if not compare:
        return []
    lines = ["", f"## Against stored run {compare['baseline_run']}", ""]
    lines += _md_table(
        ["Arm", "Probe", "Point", "Metric", "Delta vs stored"],
        [[r["arm"], r["probe"], r["point"], r["metric"], fmt_delta(r)] for r in compare["rows"]],
    )
    lines += [f"- warning: {w}" for w in compare["warnings"]]
    return lines


def render_crossovers(report: Report) -> list[str]:
    crossovers = report.get("crossovers") or []
    if not crossovers:
        return []
    lines = ["", "## Crossover", ""]
    lines += [f"- {c['arm']}/{c['baseline']} {c['probe']} {c['metric']}: {c['statement']}" for c in crossovers]
    return lines


def render_verdicts(report: Report) -> list[str]:
    return ["", "## Verdict", "", *[f"- {v}" for v in report["verdicts"]]] if report.get("verdicts") else []


def render_gates(report: Report) -> list[str]:
    gates = report.get("gates") or []
    return ["", "## Gates", "", *gate_table(gates)] if gates else []


def render_sampling(report: Report) -> list[str]:
    sampling = sampling_lines(report)
    return ["", "## Sampling", ""] + [f"- {line}" for line in sampling] if sampling else []


def render_notes(report: Report) -> list[str]:
    notes = note_lines(report)
    return ["", "## Notes", ""] + [f"- {n}" for n in notes] if notes else []


def render_delta_note(report: Report) -> list[str]:
    return ["", DELTA_NOTE]
