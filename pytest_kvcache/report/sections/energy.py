"""``report["energy"]``: energy per token (``report.energy``)."""

from __future__ import annotations

from typing import Any

from pytest_kvcache.report import energy
from pytest_kvcache.report.load import RunData
from pytest_kvcache.report.outputs import htmlpage, md_probes
from pytest_kvcache.report.part import ReportPart
from pytest_kvcache.report.sections.context import BuildContext


def section(run: RunData, ctx: BuildContext) -> dict[str, Any]:
    return {"energy": energy.section(ctx.data, run.energy, ctx.arms, ctx.specs)}


#: its place in report.json and each output
PARTS = (
    ReportPart(
        "energy",
        {"json": 190, "markdown": 110, "html": 30},
        section=section,
        markdown=md_probes.energy_lines,
        html=htmlpage.energy_tables,
    ),
)
