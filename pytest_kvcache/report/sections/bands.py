"""``report["bands"]``: the default boot-to-boot bands within-boot verdicts were judged with (``report.bands``)."""

from __future__ import annotations

from typing import Any

from pytest_kvcache.report.load import RunData
from pytest_kvcache.report.sections.context import BuildContext


def section(run: RunData, ctx: BuildContext) -> dict[str, Any]:
    return {"bands": {"platform": ctx.platform, "families": ctx.used_bands}}
