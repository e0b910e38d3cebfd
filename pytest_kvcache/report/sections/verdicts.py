"""``report["verdicts"]``: the verdict sentences (:func:`pytest_kvcache.report.verdicts.report_verdicts`) from
the sections they speak of — arms, the comparison, agreement, fidelity and capacity."""

from __future__ import annotations

from typing import Any, cast

from pytest_kvcache.model.report import Report
from pytest_kvcache.report.load import RunData
from pytest_kvcache.report.outputs import md_verdict
from pytest_kvcache.report.part import ReportPart
from pytest_kvcache.report.sections import agreement, arms, capacity, comparison, fidelity
from pytest_kvcache.report.sections.context import BuildContext
from pytest_kvcache.report.verdicts import report_verdicts


def section(run: RunData, ctx: BuildContext) -> dict[str, Any]:
    read: dict[str, Any] = {}
    for part in (arms.section, comparison.section, agreement.section, fidelity.section, capacity.section):
        read.update(ctx.of(part))
    return {"verdicts": report_verdicts(cast(Report, read), ctx.specs)}


PART = ReportPart(json=(120, section), markdown=(200, md_verdict.render_verdicts))
