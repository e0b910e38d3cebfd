"""``report["retrieval"]``: the retrieval probe's cells, paired differences and sentences (``report.retrieval``)."""

from __future__ import annotations

from typing import Any

from pytest_kvcache.report import retrieval, retrieval_render
from pytest_kvcache.report.load import RunData
from pytest_kvcache.report.outputs import terminal
from pytest_kvcache.report.part import ReportPart
from pytest_kvcache.report.sections.context import BuildContext


def section(run: RunData, ctx: BuildContext) -> dict[str, Any]:
    found = retrieval.section(run.retrieval, ctx.arms, ctx.settings)
    return {} if found is None else {"retrieval": found}


PART = ReportPart(
    json=(180, section),
    markdown=(100, retrieval_render.markdown_lines),
    html=(20, retrieval_render.html_tables),
    terminal=(50, terminal.retrieval_terminal),
)
