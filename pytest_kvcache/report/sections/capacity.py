"""``report["capacity"]``: the capacity probe's searches (``report.capacity``); only when the run has them."""

from __future__ import annotations

from typing import Any

from pytest_kvcache.report.capacity import render as capacity_render
from pytest_kvcache.report.capacity import search as capacity_search
from pytest_kvcache.report.capacity import section as capacity_section
from pytest_kvcache.report.load import RunData
from pytest_kvcache.report.outputs import htmlpage, terminal
from pytest_kvcache.report.part import ReportPart
from pytest_kvcache.report.sections.context import BuildContext


def section(run: RunData, ctx: BuildContext) -> dict[str, Any]:
    data = ctx.data
    if data.empty or not (data["probe"] == capacity_search.PROBE).any():
        return {}
    return {"capacity": capacity_section.section(data, ctx.arms, ctx.deltas, run.evidence, ctx.settings, ctx.seed)}


PART = ReportPart(
    json=(250, section),
    markdown=(120, capacity_render.lines),
    html=(40, htmlpage.capacity_tables),
    terminal=(40, terminal.capacity_terminal),
)
