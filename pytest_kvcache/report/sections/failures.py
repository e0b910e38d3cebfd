"""``report["failures"]``: every failed or excluded measured request, per arm × probe × kind (``report.failures``)."""

from __future__ import annotations

from typing import Any

from pytest_kvcache.report import failures
from pytest_kvcache.report.load import RunData
from pytest_kvcache.report.outputs import htmlpage, md_verdict, terminal
from pytest_kvcache.report.part import ReportPart
from pytest_kvcache.report.sections.context import BuildContext


def section(run: RunData, ctx: BuildContext) -> dict[str, Any]:
    return {"failures": failures.section(run.records, ctx.arms, ctx.specs)}


#: its place in report.json and each output
PARTS = (
    ReportPart(
        "failures",
        {"json": 240, "markdown": 210, "html": 80, "terminal": 110},
        section=section,
        markdown=md_verdict.failure_lines,
        html=htmlpage.failures_tables,
        terminal=terminal.failures_terminal,
    ),
)
