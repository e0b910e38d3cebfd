"""``report["retrieval"]``: the retrieval probe's cells, paired differences and sentences (``report.retrieval``)."""

from __future__ import annotations

from typing import Any

from pytest_kvcache.report import retrieval
from pytest_kvcache.report.load import RunData
from pytest_kvcache.report.sections.context import BuildContext


def section(run: RunData, ctx: BuildContext) -> dict[str, Any]:
    found = retrieval.section(run.retrieval, ctx.arms, ctx.settings)
    return {} if found is None else {"retrieval": found}
