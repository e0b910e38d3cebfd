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


PART = ReportPart(json=(190, section), markdown=(110, md_probes.energy_lines), html=(30, htmlpage.energy_tables))
