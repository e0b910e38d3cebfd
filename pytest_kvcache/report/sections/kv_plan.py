"""``report["kv_plan"]``: each arm's KV tokens and concurrency, planned before its boot and reported by the engine
(``report.kv_plan``); only when the run planned any."""

from __future__ import annotations

from typing import Any

from pytest_kvcache.report import kv_plan
from pytest_kvcache.report import kv_plan as kv_plan_render
from pytest_kvcache.report.load import RunData
from pytest_kvcache.report.outputs import htmlpage, terminal
from pytest_kvcache.report.part import ReportPart
from pytest_kvcache.report.sections.context import BuildContext


def section(run: RunData, ctx: BuildContext) -> dict[str, Any]:
    found = kv_plan.rows(run)
    return {"kv_plan": found} if found else {}


PART = ReportPart(
    json=(40, section),
    markdown=(30, kv_plan_render.markdown),
    folded=(10, htmlpage.kv_plan_folded),
    terminal=(10, terminal.kv_plan_terminal),
)
