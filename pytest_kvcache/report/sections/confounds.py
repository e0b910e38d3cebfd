"""``report["confounds"]``: how the boots differ in ways the arms do not declare (``report.confounds``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pytest_kvcache.model.report import BootEntry, Confounds
from pytest_kvcache.report import confounds
from pytest_kvcache.report.load import RunData
from pytest_kvcache.report.outputs import htmlpage, md_setup
from pytest_kvcache.report.part import ReportPart
from pytest_kvcache.report.sections.context import BuildContext


def confound_report(run: RunData, boots: Sequence[BootEntry], allow: Sequence[str]) -> Confounds:
    evidence = [run.evidence[b["boot"]] for b in boots if b["boot"] in run.evidence]
    found = confounds.find(evidence, allow)
    found["lines"] = [confounds.describe(e) for e in found.get("confounds") or []]
    return found


def section(run: RunData, ctx: BuildContext) -> dict[str, Any]:
    return {"confounds": confound_report(run, ctx.boots, ctx.allow)}


PART = ReportPart(json=(70, section), markdown=(70, md_setup.render_confounds), folded=(50, htmlpage.confounds_folded))
