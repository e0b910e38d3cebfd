"""``report["cost"]``: what the verdict cost (``report.cost``)."""

from __future__ import annotations

from typing import Any

from pytest_kvcache.report import cost
from pytest_kvcache.report.load import RunData
from pytest_kvcache.report.outputs import terminal
from pytest_kvcache.report.part import ReportPart
from pytest_kvcache.report.sections.context import BuildContext


def section(run: RunData, ctx: BuildContext) -> dict[str, Any]:
    return {"cost": cost.section(run, ctx.boots)}


PART = ReportPart(json=(10, section), terminal=(130, terminal.cost_terminal))
