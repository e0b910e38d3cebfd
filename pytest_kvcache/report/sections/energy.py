"""``report["energy"]``: energy per token (``report.energy``)."""

from __future__ import annotations

from typing import Any

from pytest_kvcache.report import energy
from pytest_kvcache.report.load import RunData
from pytest_kvcache.report.sections.context import BuildContext


def section(run: RunData, ctx: BuildContext) -> dict[str, Any]:
    return {"energy": energy.section(ctx.data, run.energy, ctx.arms, ctx.specs)}
