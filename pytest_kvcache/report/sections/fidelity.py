"""``report["fidelity"]``: the fidelity probe's comparisons (``report.fidelity``), and ``report["baseline_check"]``:
can the baseline judge quality at all (``report.judging``)."""

from __future__ import annotations

from typing import Any

from pytest_kvcache.report import fidelity, judging
from pytest_kvcache.report.load import RunData
from pytest_kvcache.report.outputs import htmlpage, md_probes
from pytest_kvcache.report.part import ReportPart
from pytest_kvcache.report.sections.context import BuildContext


def section(run: RunData, ctx: BuildContext) -> dict[str, Any]:
    found = {"fidelity": fidelity.section(run.fidelity_blocks, run.fidelity, ctx.arms, ctx.settings, ctx.seed)}
    check = judging.check(run.fidelity, ctx.arms)
    return found if check is None else {**found, "baseline_check": check}


PART = ReportPart(json=(170, section), markdown=(90, md_probes.fidelity_lines), html=(10, htmlpage.fidelity_tables))
