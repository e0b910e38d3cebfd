"""``report["flags"]``: how many measured samples were flagged, and with what."""

from __future__ import annotations

from typing import Any

from pytest_kvcache.report.load import RunData
from pytest_kvcache.report.outputs import terminal
from pytest_kvcache.report.part import ReportPart
from pytest_kvcache.report.sections.context import BuildContext


def section(run: RunData, ctx: BuildContext) -> dict[str, Any]:
    flagged = [r for r in run.records if r.get("phase") == "measured" and r.get("flags")]
    return {"flags": {"samples": len(flagged), "kinds": sorted({f for r in flagged for f in r.get("flags") or []})}}


PART = ReportPart(json=(220, section), terminal=(70, terminal.flags_terminal))
