"""``report["boots"]`` and ``report["boot_results"]``: every planned boot in run order, and per boot and
probe point the probe's primary metric."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from pytest_kvcache.model.report import BootEntry, BootResult
from pytest_kvcache.report.comparison import _probes
from pytest_kvcache.report.frame import values
from pytest_kvcache.report.load import RunData
from pytest_kvcache.report.outputs import htmlpage, md_setup, terminal
from pytest_kvcache.report.part import ReportPart
from pytest_kvcache.report.points import Specs, point_sort, spec_of
from pytest_kvcache.report.sections.context import BuildContext


def boot_results(data: pd.DataFrame, boots: Sequence[BootEntry], specs: Specs) -> list[BootResult]:
    """Per boot, per probe point: the probe's primary metric (mean and n of valid samples)."""
    rows: list[BootResult] = []
    if data.empty:
        return rows
    for boot in boots:
        mine = data[data["boot"] == boot["boot"]]
        for probe in _probes(mine, specs):
            if spec_of(probe, specs).own_section:
                continue  # differences from the baseline: in their own section, not a boot's figure
            metric = spec_of(probe, specs).primary_metric
            by_probe = mine[mine["probe"] == probe]
            for point in sorted(by_probe["point"].unique(), key=point_sort):
                found = values(by_probe[by_probe["point"] == point], metric)
                if found:
                    rows.append(
                        {
                            "boot": boot["boot"],
                            "arm": boot["arm"],
                            "position": boot["position"],
                            "probe": probe,
                            "point": point,
                            "metric": metric,
                            "mean": float(np.mean(found)),
                            "n": len(found),
                        }
                    )
    return rows


def section(run: RunData, ctx: BuildContext) -> dict[str, Any]:
    return {"boots": ctx.boots, "boot_results": boot_results(ctx.data, ctx.boots, ctx.specs)}


PART = ReportPart(
    json=(30, section),
    markdown=(50, md_setup.render_boots),
    folded=(30, htmlpage.boots_folded),
    terminal=(0, terminal.boot_lines),
)
