"""``report.md``: the seed-shaped tables of a :class:`~pytest_kvcache.model.Report`, one renderer per section
walked in order (:data:`SECTIONS`); the number formats every other writer (terminal, HTML) shares are
:mod:`pytest_kvcache.report.outputs.formats`. The renderers live beside their tables — the setup
(``md_setup``), the measurements (``md_probes``), the verdict and what follows it (``md_verdict``) — and
their names are re-exported here, where callers have imported them from."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from pytest_kvcache.model.report import Report
from pytest_kvcache.report import kv_plan, retrieval_render
from pytest_kvcache.report.capacity import render as capacity_render
from pytest_kvcache.report.outputs import md_probes, md_setup, md_verdict

#: A section of report.md: the report in, its lines out (none to leave itself out).
Renderer = Callable[[Report], list[str]]

#: report.md's sections, in the order they are written.
SECTIONS: list[Renderer] = [
    md_setup.render_head,
    md_setup.render_first_screen,
    md_setup.render_arms,
    kv_plan.markdown,
    md_setup.render_gpu,
    md_setup.render_boots,
    md_setup.render_blocks,
    md_setup.render_confounds,
    md_probes.render_probe_tables,
    md_probes.fidelity_lines,
    retrieval_render.markdown_lines,
    md_probes.energy_lines,
    capacity_render.lines,
    md_probes.render_agreement,
    md_probes.render_greedy,
    md_probes.render_agentic,
    md_probes.spec_decode_lines,
    md_probes.render_left_out,
    md_verdict.render_compare,
    md_verdict.render_crossovers,
    md_verdict.render_verdicts,
    md_verdict.failure_lines,
    md_verdict.render_gates,
    md_verdict.render_sampling,
    md_verdict.render_notes,
    md_verdict.render_delta_note,
]


def markdown(report: Report, plots: Sequence[str] = ()) -> str:
    """report.md; ``plots`` are the PNG files written beside it (linked at the end)."""
    lines: list[str] = []
    for render in SECTIONS:
        lines += render(report)
    if plots:
        lines += ["", "## Plots", ""] + [f"![{name[:-4]}]({name})" for name in plots]
    return "\n".join(lines) + "\n"
