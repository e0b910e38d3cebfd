"""``report["blocks"]``: the blocks of a pytest-xdist run (only there: a run without lanes has none)."""

from __future__ import annotations

from typing import Any

from pytest_kvcache.report.load import RunData
from pytest_kvcache.report.sections.context import BuildContext


def section(run: RunData, ctx: BuildContext) -> dict[str, Any]:
    return {"blocks": ctx.blocks} if ctx.blocks else {}
