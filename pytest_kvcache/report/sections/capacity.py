"""``report["capacity"]``: the capacity probe's searches (``report.capacity``); only when the run has them."""

from __future__ import annotations

from typing import Any

from pytest_kvcache.report import capacity
from pytest_kvcache.report.load import RunData
from pytest_kvcache.report.sections.context import BuildContext


def section(run: RunData, ctx: BuildContext) -> dict[str, Any]:
    data = ctx.data
    if data.empty or not (data["probe"] == capacity.PROBE).any():
        return {}
    return {"capacity": capacity.section(data, ctx.arms, ctx.deltas, run.evidence, ctx.settings, ctx.seed)}
