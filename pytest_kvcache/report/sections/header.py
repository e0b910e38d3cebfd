"""The report's head: its version, the run's id, status, model and package versions."""

from __future__ import annotations

from typing import Any

from pytest_kvcache.model.base import REPORT_VERSION
from pytest_kvcache.report.load import RunData
from pytest_kvcache.report.outputs import md_setup
from pytest_kvcache.report.part import ReportPart
from pytest_kvcache.report.sections.context import BuildContext


def section(run: RunData, ctx: BuildContext) -> dict[str, Any]:
    return {
        "report_version": REPORT_VERSION,
        "run_id": run.meta.get("run_id"),
        "status": run.meta.get("status"),
        "model": run.meta.get("model"),
        "versions": run.meta.get("versions"),
    }


PARTS = (
    ReportPart("head", json=(0, section), markdown=(0, md_setup.render_head)),
    ReportPart("first screen", markdown=(10, md_setup.render_first_screen)),
)
