"""``report.html``: a page of its own, read first — the verdict block on top (a sentence per arm and
probe, the gates, clean or CONFOUNDED, what the CIs cover), the delta-against-depth plots, the tables with
better and worse marked by a sign as well as a colour and wide tables scrolling inside their box, the
evidence folded below. One self-contained file (plots inlined), readable offline and printable.

Rendered with a Jinja2 template (``templates/report.html.j2``, autoescaped) from the same
:class:`~pytest_kvcache.model.Report` and the same cell formats as ``report.md``.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Mapping
from functools import cache
from typing import TYPE_CHECKING

from pytest_kvcache.model.report import DeltaRow, Report, SavedRow
from pytest_kvcache.report import cost, energy, failures, kv_plan
from pytest_kvcache.report.capacity import render as capacity_render
from pytest_kvcache.report.outputs import formats, md_probes, md_setup, md_verdict
from pytest_kvcache.report.outputs.formats import Cell, Table
from pytest_kvcache.report.part import ordered

if TYPE_CHECKING:
    import jinja2
    import markupsafe

#: A delta's verdict as a sign beside its colour (readable without colour, and printed).
MARKS = {"better": "▲", "worse": "▼", "inconclusive": "≈"}
GATE_MARKS = {"pass": "✓", "fail": "✗", "inconclusive": "?", "error": "!"}
#: Captions of the plots the report knows; a user's probe gets its name.
CAPTIONS = {
    "prefill_delta.png": "Prefill: each arm against the baseline by depth — ratio − 1 with its 95% CI band; "
    "the zero line is parity, a crossover is marked with its interval.",
    "agentic_delta.png": "Agentic: each arm against the baseline by prompt tokens per turn — ratio − 1 with "
    "its 95% CI band.",
    "fidelity.png": "Fidelity: prefill speed against the baseline, mean |Δ logprob| and the top-k KL, by depth.",
    "retrieval.png": "Retrieval: the share of needles each arm found, by depth and position (hatched: the baseline's "
    "ceiling cells, which judge nothing).",
    "prefill.png": "Prefill: absolute values per arm by depth (error bars: 95% CI of the mean).",
    "agentic.png": "Agentic: absolute values per arm by prompt tokens (error bars: 95% CI of the mean).",
    "short.png": "Short probes: means per arm with the CI of the delta.",
    "spec_decode.png": "Speculative decoding: acceptance length by depth.",
}


def _plain(rows: list[list[str]]) -> list[list[Cell]]:
    return [[Cell(c) for c in row] for row in rows]


def _delta_cell(delta: DeltaRow | SavedRow | None) -> Cell:
    if delta is None:
        return Cell("–")
    verdict = str(delta.get("verdict") or "inconclusive")
    if delta.get("verdict_note"):
        verdict = "inconclusive"
    return Cell(f"{MARKS.get(verdict, '')} {formats.fmt_delta(delta)}".strip(), verdict)


def probe_tables(report: Report) -> list[Table]:
    arms = [a["name"] for a in report["arms"]]
    tables: list[Table] = []
    by_probe: dict[str, list[list[Cell]]] = {}
    for probe, cells, deltas in md_probes.ab_rows(report):
        by_probe.setdefault(probe, []).append([Cell(c) for c in cells] + [_delta_cell(d) for d in deltas])
    header = ["Metric", *arms, *[f"{a} delta" for a in arms[1:]]]
    crossings = report.get("crossovers") or []
    for probe, probe_rows in by_probe.items():
        notes = [
            f"{c['arm']}/{c['baseline']} {c['metric']}: {c['statement']}" for c in crossings if c["probe"] == probe
        ]
        tables.append(Table(formats.title(report, probe), header, probe_rows, notes=notes))
    return tables


def fidelity_tables(report: Report) -> list[Table]:
    fidelity_header, fidelity_rows = md_probes.fidelity_table(report)
    section = report.get("fidelity")
    if not fidelity_rows or not section:
        return []
    intro = md_probes.fidelity_lines(report)[3]  # the setup sentence
    return [Table("Fidelity at depth", fidelity_header, _plain(fidelity_rows), intro, list(section["notes"]))]


def energy_tables(report: Report) -> list[Table]:
    metered = report.get("energy")
    energy_header, energy_rows = energy.table(metered)
    if not metered or not energy_rows:
        return []
    intro = str(metered.get("line") or "")
    notes = [md_probes.ENERGY_NOTE, *(metered.get("not_reported") or [])]
    return [Table("Energy per token", energy_header, _plain(energy_rows), intro, notes)]


def capacity_tables(report: Report) -> list[Table]:
    sessions = report.get("capacity")
    if not sessions or not sessions["rows"]:
        return []
    head, rows = capacity_render.table(sessions)
    tables = [
        Table(
            "Capacity under the SLO", head, _plain(rows), capacity_render.setup_line(sessions), [capacity_render.NOTE]
        )
    ]
    head, rows = capacity_render.trials_table(sessions)
    return [*tables, Table("Capacity trials", head, _plain(rows), notes=list(sessions["notes"]))]


def agentic_tables(report: Report) -> list[Table]:
    agentic = report.get("agentic")
    if not agentic or not agentic["turns"]:
        return []
    head, turns = md_probes.agentic_table(report)
    return [Table("Agentic turns (means across sessions)", head, _plain(turns), notes=md_probes.growth_lines(report))]


def spec_decode_tables(report: Report) -> list[Table]:
    spec = md_probes.spec_decode_rows(report)
    if not spec:
        return []
    decode = report.get("spec_decode")
    setup = (decode.get("config") if decode else None) or {}
    intro = "; ".join(f"{arm}: {value or 'not stated'}" for arm, value in setup.items())
    return [Table("Speculative decoding", md_probes.SPEC_HEADER, _plain(spec), intro, [md_probes.SPEC_NOTE])]


def agreement_tables(report: Report) -> list[Table]:
    agreement = md_probes.agreement_table(report)
    if not agreement:
        return []
    head = ["Comparison", "Arms", "Shape", "Identical", "First divergence (mean index)", "Mean abs(Δ logprob)"]
    notes = [f"not available: {n}" for n in report["agreement"]["notes"]]
    return [Table("Output agreement (greedy token ids)", head, _plain(agreement), notes=notes)]


def failures_tables(report: Report) -> list[Table]:
    lost = report.get("failures")
    if not lost:
        return []
    return [Table("Failures and exclusions", failures.HEADER, _plain(failures.table(lost)), lost["lines"][0])]


def compare_tables(report: Report) -> list[Table]:
    compare = report.get("compare")
    if not compare:
        return []
    saved = [
        [Cell(r["arm"]), Cell(r["probe"]), Cell(r["point"]), Cell(r["metric"]), _delta_cell(r)] for r in compare["rows"]
    ]
    head = ["Arm", "Probe", "Point", "Metric", "Delta vs stored"]
    return [Table(f"Against stored run {compare['baseline_run']}", head, saved, notes=compare["warnings"])]


def _tables(report: Report) -> list[Table]:
    return [table for render in ordered("html") for table in render(report)]


def arms_folded(report: Report) -> list[dict[str, object]]:
    head, rows = md_setup.arms_table(report)
    return [{"title": "Arms: declared and resolved", "header": head, "rows": rows}]


def kv_plan_folded(report: Report) -> list[dict[str, object]]:
    if not report.get("kv_plan"):
        return []
    head, rows = kv_plan.table(report)
    return [{"title": "KV cache: planned and reported", "header": head, "rows": rows, "lines": kv_plan.notes(report)}]


def gpu_folded(report: Report) -> list[dict[str, object]]:
    head, rows = md_setup.gpu_table(report)
    return [{"title": "GPU state", "header": head, "rows": rows}] if rows else []


def boots_folded(report: Report) -> list[dict[str, object]]:
    if not report.get("boots"):
        return []
    head, rows = md_setup.boot_table(report)
    lines = md_setup.order_lines(report)
    lines += [f"{b['boot']} not booted: {b['skipped']}" for b in report["boots"] if b.get("skipped")]
    lines += [f"Compile cache — {line}" for line in report.get("compile_cache") or []]
    return [{"title": "Boots and order", "header": head, "rows": rows, "lines": lines}]


def blocks_folded(report: Report) -> list[dict[str, object]]:
    if not report.get("blocks"):
        return []
    head, rows = md_setup.block_table(report)
    return [{"title": "Blocks (pytest-xdist lanes)", "header": head, "rows": rows}]


def confounds_folded(report: Report) -> list[dict[str, object]]:
    if not report.get("confounds"):
        return []
    lines = [line.removeprefix("- ").replace("**", "") for line in md_setup.confound_lines(report) if line.strip()]
    return [{"title": "Confounds", "lines": lines}]


def sampling_folded(report: Report) -> list[dict[str, object]]:
    sampling = md_verdict.sampling_lines(report)
    return [{"title": "Sampling", "lines": sampling}] if sampling else []


def notes_folded(report: Report) -> list[dict[str, object]]:
    notes = md_verdict.note_lines(report)
    return [{"title": f"Notes ({len(notes)})", "lines": notes}] if notes else []


def _folded(report: Report) -> list[dict[str, object]]:
    return [found for render in ordered("folded") for found in render(report)]


def inline_code(text: object) -> markupsafe.Markup:
    """Escape ``text`` and show its `backticked` parts as code (the notes share report.md's wording)."""
    import markupsafe

    escaped = str(markupsafe.escape(str(text)))
    return markupsafe.Markup(re.sub(r"`([^`]+)`", r"<code>\1</code>", escaped))


@cache
def _template() -> jinja2.Template:
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.PackageLoader("pytest_kvcache.report.outputs", "templates"),
        autoescape=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["code"] = inline_code
    return env.get_template("report.html.j2")


def render(report: Report, images: Mapping[str, bytes]) -> str:
    """The report as one self-contained HTML page, with the plots inlined."""
    gates = [
        dict(g, mark=GATE_MARKS.get(g["outcome"], ""), evidence_text=md_verdict.gate_evidence(g))
        for g in report.get("gates") or []
    ]
    counts = {k: sum(1 for g in gates if g["outcome"] == k) for k in ("pass", "fail", "inconclusive", "error")}
    found = report.get("confounds") or {}
    status = found.get("status")
    chip = {
        "CONFOUNDED": f"CONFOUNDED: {len(found.get('confounds') or [])} undeclared difference(s)",
        "clean": f"clean: {found.get('compared', 0)} evidence paths compared",
    }.get(str(status), "confounds not checked")
    figures = [
        {
            "name": name,
            "data": base64.b64encode(png).decode(),
            "alt": name[:-4],
            "caption": CAPTIONS.get(name) or capacity_render.caption(name) or name,
        }
        for name, png in images.items()
    ]
    ci = report.get("ci")
    lost = report.get("failures")
    return _template().render(
        failed_requests=lost["failed"] if lost else 0,
        failure_headline=failures.headline(lost["failed"], lost["excluded"], lost["measured"]) if lost else "",
        run_id=report.get("run_id"),
        model=report.get("model"),
        status=report.get("status"),
        arms=[a["name"] for a in report["arms"]],
        confounded=status == "CONFOUNDED",
        clean=status == "clean",
        confound_chip=chip,
        gates=gates,
        gate_counts=counts,
        gate_chip=", ".join(f"{n} {k}" for k, n in counts.items() if n) or "no gates",
        verdicts=report.get("verdicts") or [],
        cost_lines=cost.first_screen(report),
        ci_text=ci["text"] if ci else "",
        delta_figures=[f for f in figures if str(f["name"]).endswith("_delta.png")],
        figures=[f for f in figures if not str(f["name"]).endswith("_delta.png")],
        tables=_tables(report),
        folded=_folded(report),
        footnote=md_verdict.DELTA_NOTE,
    )
