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


PARTS = (
    ReportPart(
        "comparison",
        json=(110, section),
        markdown=(190, md_verdict.render_crossovers),
        terminal=(20, terminal.summary_terminal),
    ),
    ReportPart("A/B", markdown=(250, md_verdict.render_delta_note), terminal=(90, terminal.ab_terminal)),
)
