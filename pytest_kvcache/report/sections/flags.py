"""``report["flags"]``: how many measured samples were flagged, and with what."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pytest_kvcache.model.records import Record
from pytest_kvcache.model.report import FlagSummary
from pytest_kvcache.report.load import RunData
from pytest_kvcache.report.outputs import terminal
from pytest_kvcache.report.part import ReportPart
from pytest_kvcache.report.sections.context import BuildContext


def flag_summary(records: Sequence[Record]) -> FlagSummary:
    flagged = [r for r in records if r.get("phase") == "measured" and r.get("flags")]
    return {"samples": len(flagged), "kinds": sorted({f for r in flagged for f in r.get("flags") or []})}


def section(run: RunData, ctx: BuildContext) -> dict[str, Any]:
    return {"flags": flag_summary(run.records)}


PART = ReportPart(json=(220, section), terminal=(70, terminal.flags_terminal))
