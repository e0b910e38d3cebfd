"""``report["left_out"]``: what could not fit the context, and the agentic fixture used (``report.left_out``)."""

from __future__ import annotations

from typing import Any

from pytest_kvcache.report import left_out
from pytest_kvcache.report.load import RunData
from pytest_kvcache.report.outputs import md_probes
from pytest_kvcache.report.part import ReportPart
from pytest_kvcache.report.sections.context import BuildContext


def section(run: RunData, ctx: BuildContext) -> dict[str, Any]:
    return {"left_out": left_out.section(run.path, ctx.settings, run.records)}


PART = ReportPart(json=(210, section), markdown=(170, md_probes.render_left_out))
