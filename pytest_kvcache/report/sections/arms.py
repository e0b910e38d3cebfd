"""``report["arms"]``: each arm as declared and as the engine resolved it (its first boot's evidence), with
its GPU state and its boots; and what each arm's kind of server cannot show."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pytest_kvcache.model.evidence import Evidence
from pytest_kvcache.model.report import ArmEntry
from pytest_kvcache.report.load import RunData
from pytest_kvcache.report.outputs import htmlpage, md_setup
from pytest_kvcache.report.part import ReportPart
from pytest_kvcache.report.sections.context import BuildContext


def missing_evidence_notes(entries: Sequence[ArmEntry]) -> list[str]:
    """What each arm's kind of server cannot show (``--kv-engine``), one line per distinct list."""
    by_list: dict[tuple[str, str], list[str]] = {}
    for entry in entries:
        first: Evidence = next(iter(entry["evidence"].values()), Evidence())
        missing = first.get("evidence_missing") or []
        if missing:
            key = (str(first.get("engine_kind") or "?"), "; ".join(missing))
            by_list.setdefault(key, []).append(entry["name"])
    return [f"evidence missing for {', '.join(n)} ({kind} server): {listed}" for (kind, listed), n in by_list.items()]


def section(run: RunData, ctx: BuildContext) -> dict[str, Any]:
    return {"arms": ctx.entries}


PARTS = (
    ReportPart("arms", json=(20, section), markdown=(20, md_setup.render_arms), folded=(0, htmlpage.arms_folded)),
    # the arms' GPU state (``gpu.gpu_summary``), shown apart
    ReportPart("gpu", markdown=(40, md_setup.render_gpu), folded=(20, htmlpage.gpu_folded)),
)
