"""``report.md``: the seed-shaped tables of a :class:`~pytest_kvcache.model.Report`, one renderer per section
walked in order (:data:`SECTIONS`); the number formats every other writer (terminal, HTML) shares are
:mod:`pytest_kvcache.report.outputs.formats`. The renderers live beside their tables — the setup
(``md_setup``), the measurements (``md_probes``), the verdict and what follows it (``md_verdict``) — and
their names are re-exported here, where callers have imported them from."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from pytest_kvcache.model import Report
from pytest_kvcache.report import kv_plan, retrieval_render
from pytest_kvcache.report.capacity import render as capacity_render
from pytest_kvcache.report.outputs import md_probes, md_setup, md_verdict
from pytest_kvcache.report.outputs.formats import _md_table as _md_table
from pytest_kvcache.report.outputs.formats import fmt as fmt
from pytest_kvcache.report.outputs.formats import fmt_delta as fmt_delta
from pytest_kvcache.report.outputs.formats import json_text as json_text
from pytest_kvcache.report.outputs.formats import probe_specs as probe_specs
from pytest_kvcache.report.outputs.formats import title as title
from pytest_kvcache.report.outputs.md_probes import ENERGY_NOTE as ENERGY_NOTE
from pytest_kvcache.report.outputs.md_probes import SPEC_HEADER as SPEC_HEADER
from pytest_kvcache.report.outputs.md_probes import SPEC_NOTE as SPEC_NOTE
from pytest_kvcache.report.outputs.md_probes import ab_rows as ab_rows
from pytest_kvcache.report.outputs.md_probes import ab_tables as ab_tables
from pytest_kvcache.report.outputs.md_probes import agentic_table as agentic_table
from pytest_kvcache.report.outputs.md_probes import agreement_table as agreement_table
from pytest_kvcache.report.outputs.md_probes import energy_lines as energy_lines
from pytest_kvcache.report.outputs.md_probes import fidelity_lines as fidelity_lines
from pytest_kvcache.report.outputs.md_probes import fidelity_table as fidelity_table
from pytest_kvcache.report.outputs.md_probes import growth_lines as growth_lines
from pytest_kvcache.report.outputs.md_probes import spec_decode_lines as spec_decode_lines
from pytest_kvcache.report.outputs.md_probes import spec_decode_rows as spec_decode_rows
from pytest_kvcache.report.outputs.md_setup import arms_table as arms_table
from pytest_kvcache.report.outputs.md_setup import block_table as block_table
from pytest_kvcache.report.outputs.md_setup import boot_table as boot_table
from pytest_kvcache.report.outputs.md_setup import compile_cell as compile_cell
from pytest_kvcache.report.outputs.md_setup import confound_lines as confound_lines
from pytest_kvcache.report.outputs.md_setup import gpu_table as gpu_table
from pytest_kvcache.report.outputs.md_setup import order_lines as order_lines
from pytest_kvcache.report.outputs.md_verdict import DELTA_NOTE as DELTA_NOTE
from pytest_kvcache.report.outputs.md_verdict import client_load_line as client_load_line
from pytest_kvcache.report.outputs.md_verdict import failure_lines as failure_lines
from pytest_kvcache.report.outputs.md_verdict import gate_evidence as gate_evidence
from pytest_kvcache.report.outputs.md_verdict import gate_summary as gate_summary
from pytest_kvcache.report.outputs.md_verdict import gate_table as gate_table
from pytest_kvcache.report.outputs.md_verdict import note_lines as note_lines
from pytest_kvcache.report.outputs.md_verdict import sampling_lines as sampling_lines
from pytest_kvcache.report.outputs.md_verdict import self_check_line as self_check_line

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
