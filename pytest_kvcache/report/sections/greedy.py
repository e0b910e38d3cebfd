"""``report["greedy"]``: each arm's greedy texts against the baseline's, where they part (``report.greedy``)."""

from __future__ import annotations

from typing import Any

from pytest_kvcache.report import greedy
from pytest_kvcache.report.load import RunData
from pytest_kvcache.report.outputs import md_probes
from pytest_kvcache.report.part import ReportPart
from pytest_kvcache.report.sections.context import BuildContext


def section(run: RunData, ctx: BuildContext) -> dict[str, Any]:
    return {"greedy": greedy.section(run.agreement, ctx.arms)}


PART = ReportPart(json=(200, section), markdown=(140, md_probes.render_greedy))
