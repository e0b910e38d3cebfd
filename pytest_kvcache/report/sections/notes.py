"""``report["notes"]``: what the reader must know beside the tables — nothing recorded, an arm without
evidence, torn lines, reaped leftovers, the loader's problems, a busy host, evidence an engine cannot show."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pytest_kvcache.model.records import Record
from pytest_kvcache.report.load import RunData
from pytest_kvcache.report.outputs import htmlpage, md_verdict, terminal
from pytest_kvcache.report.part import ReportPart
from pytest_kvcache.report.sections.arms import missing_evidence_notes
from pytest_kvcache.report.sections.context import BuildContext


def host_cpu_note(records: Sequence[Record], action: object) -> str | None:
    """How many measured samples saw the host's CPU busy outside the engine and client (``host_cpu_busy``)."""
    busy = [r for r in records if r.get("phase") == "measured" and "host_cpu_busy" in (r.get("flags") or [])]
    if not busy:
        return None
    peaks = [p for r in busy if isinstance(p := (r.get("host_cpu") or {}).get("other_busy_pct_max"), int | float)]
    peak = f" (max {max(peaks):.0f}%)" if peaks else ""
    done = "excluded" if action == "exclude" else "flagged"
    return f"{len(busy)} measured sample(s) saw the host's CPU busy outside the engine and client{peak}: {done}"


def section(run: RunData, ctx: BuildContext) -> dict[str, Any]:
    plan = run.meta.get("plan") or []
    notes = []
    if not run.records and not run.fidelity and not run.retrieval:
        notes.append("no requests were recorded")
    for arm in ctx.arms:
        if arm not in run.evidence and not any(p.get("arm") == arm for p in plan):
            notes.append(f"no evidence for arm {arm}")
    if run.torn_lines:
        notes.append(
            f"{run.torn_lines} line(s) of requests.jsonl could not be read (torn by a killed run) and were skipped"
        )
    notes += [f"reaped at the start of the run: {line}" for line in run.meta.get("reaped") or []]
    notes += list(run.problems)
    host_cpu = host_cpu_note(run.records, ctx.settings.get("host_cpu_action"))
    notes += [host_cpu] if host_cpu else []
    notes += missing_evidence_notes(ctx.entries)
    return {"notes": notes}


PART = ReportPart(
    json=(130, section),
    markdown=(240, md_verdict.render_notes),
    folded=(70, htmlpage.notes_folded),
    terminal=(80, terminal.notes_terminal),
)
