"""``report["seed"]`` and ``report["probes"]``: the bootstrap's seed and the probe specs the report was built
with (the outputs read titles and labels from them)."""

from __future__ import annotations

from typing import Any

from pytest_kvcache.report.load import RunData
from pytest_kvcache.report.outputs import htmlpage, md_probes
from pytest_kvcache.report.part import ReportPart
from pytest_kvcache.report.sections.context import BuildContext


def section(run: RunData, ctx: BuildContext) -> dict[str, Any]:
    specs = ctx.specs
    return {"seed": ctx.seed, "probes": [specs[p].to_dict() for p in sorted(specs, key=lambda n: (specs[n].order, n))]}


PART = ReportPart(json=(140, section), markdown=(80, md_probes.render_probe_tables), html=(0, htmlpage.probe_tables))
