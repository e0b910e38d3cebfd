"""``report["summary"]``, ``report["deltas"]`` and ``report["crossovers"]``: the A/B comparison statistics
(:mod:`pytest_kvcache.report.comparison`), judged (:mod:`pytest_kvcache.report.verdicts`)."""

from __future__ import annotations

from typing import Any

from pytest_kvcache.report.comparison import summary_rows
from pytest_kvcache.report.load import RunData
from pytest_kvcache.report.outputs import md_verdict, terminal
from pytest_kvcache.report.part import ReportPart
from pytest_kvcache.report.sections.context import BuildContext


def section(run: RunData, ctx: BuildContext) -> dict[str, Any]:
    return {
        "summary": summary_rows(ctx.data, ctx.arms, ctx.specs),
        "deltas": ctx.deltas,
        "crossovers": ctx.crossovers,
    }


#: its place in report.json and each output
PARTS = (
    ReportPart(
        "comparison",
        {"json": 110, "markdown": 190, "terminal": 20},
        section=section,
        markdown=md_verdict.render_crossovers,
        terminal=terminal.summary_terminal,
    ),
    ReportPart(
        "A/B", {"markdown": 250, "terminal": 90}, markdown=md_verdict.render_delta_note, terminal=terminal.ab_terminal
    ),
)
