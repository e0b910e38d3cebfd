"""``report["fidelity"]``: the fidelity probe's comparisons (``report.fidelity``)."""

from __future__ import annotations

from typing import Any

from pytest_kvcache.report import fidelity
from pytest_kvcache.report.load import RunData
from pytest_kvcache.report.sections.context import BuildContext


def section(run: RunData, ctx: BuildContext) -> dict[str, Any]:
    return {"fidelity": fidelity.section(run.fidelity_blocks, run.fidelity, ctx.arms, ctx.settings, ctx.seed)}
