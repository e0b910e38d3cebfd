"""``report["confounds"]``: how the boots differ in ways the arms do not declare (``report.confounds``)."""

from __future__ import annotations

from typing import Any

from pytest_kvcache.report import confounds
from pytest_kvcache.report.load import RunData
from pytest_kvcache.report.outputs import htmlpage, md_setup
from pytest_kvcache.report.part import ReportPart
from pytest_kvcache.report.sections.context import BuildContext


def section(run: RunData, ctx: BuildContext) -> dict[str, Any]:
    evidence = [run.evidence[b["boot"]] for b in ctx.boots if b["boot"] in run.evidence]
    found = confounds.find(evidence, ctx.allow)
    found["lines"] = [confounds.describe(e) for e in found.get("confounds") or []]
    return {"confounds": found}


PART = ReportPart(json=(70, section), markdown=(70, md_setup.render_confounds), folded=(50, htmlpage.confounds_folded))
