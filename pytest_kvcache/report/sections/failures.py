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


PART = ReportPart(
    json=(240, section),
    markdown=(210, md_verdict.failure_lines),
    html=(80, htmlpage.failures_tables),
    terminal=(110, terminal.failures_terminal),
)
