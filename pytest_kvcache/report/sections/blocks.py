"""``report["blocks"]``: the blocks of a pytest-xdist run (only there: a run without lanes has none)."""

from __future__ import annotations

from typing import Any

from pytest_kvcache.report.load import RunData
from pytest_kvcache.report.outputs import htmlpage, md_setup
from pytest_kvcache.report.part import ReportPart
from pytest_kvcache.report.sections.context import BuildContext


def section(run: RunData, ctx: BuildContext) -> dict[str, Any]:
    return {"blocks": ctx.blocks} if ctx.blocks else {}


PART = ReportPart(json=(260, section), markdown=(60, md_setup.render_blocks), folded=(40, htmlpage.blocks_folded))
