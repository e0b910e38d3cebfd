"""``report["sampling"]``: the run's sampling decisions (``sampling.jsonl``: adaptive rounds, stopped points)."""

from __future__ import annotations

from typing import Any

from pytest_kvcache.report.load import RunData
from pytest_kvcache.report.outputs import htmlpage, md_verdict
from pytest_kvcache.report.part import ReportPart
from pytest_kvcache.report.sections.context import BuildContext


def section(run: RunData, ctx: BuildContext) -> dict[str, Any]:
    return {"sampling": run.sampling}


PART = ReportPart(json=(90, section), markdown=(230, md_verdict.render_sampling), folded=(60, htmlpage.sampling_folded))
