"""``report["kv_plan"]``: each arm's KV tokens and concurrency, planned before its boot and reported by the engine
(``report.kv_plan``); only when the run planned any."""

from __future__ import annotations

from typing import Any

from pytest_kvcache.report import kv_plan
from pytest_kvcache.report.load import RunData
from pytest_kvcache.report.sections.context import BuildContext


def section(run: RunData, ctx: BuildContext) -> dict[str, Any]:
    found = kv_plan.rows(run)
    return {"kv_plan": found} if found else {}
