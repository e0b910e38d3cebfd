"""``report["bands"]``: the boot-to-boot spreads within-boot verdicts were judged with (``report.spread``)."""

from __future__ import annotations

from typing import Any

from pytest_kvcache.report.frame import host_busy
from pytest_kvcache.report.load import RunData
from pytest_kvcache.report.part import ReportPart
from pytest_kvcache.report.sections.context import BuildContext


def section(run: RunData, ctx: BuildContext) -> dict[str, Any]:
    found = {"platform": ctx.platform, **ctx.used_bands, "host_busy": host_busy(ctx.data)}
    return {"bands": {**found, **({"unlike": ctx.unlike} if ctx.unlike else {})}}


PART = ReportPart(json=(230, section))
