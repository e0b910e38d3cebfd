"""The report's "Failures and exclusions" section: every measured request that failed (its error kind and
message, as the client recorded it) or was measured and then left out (host CPU busy, GPU drift, a
saturated client …), per arm × probe × kind — with the points it removed, so a point without one valid
sample reads as failed, not as missing. Reads records only."""

from __future__ import annotations

from collections.abc import Sequence

from pytest_kvcache.model.records import Record
from pytest_kvcache.model.report import EmptyPoint, FailureRow, FailuresSection
from pytest_kvcache.report.points import Specs, point_of, point_sort, spec_of


def kind_of(record: Record) -> tuple[str, str, str]:
    """(status, kind, message) of a record that does not count: ``failed`` with the client's error kind, or
    ``excluded`` with the exclusion's kind (the reason's first word)."""
    if not record.get("ok"):
        return "failed", str(record.get("error_kind") or "failed"), str(record.get("error") or "")
    reason = str(record.get("excluded_reason") or "")
    kind, _, rest = reason.partition(":")
    return "excluded", kind.strip() or "excluded", (rest.strip() or reason)


def section(records: Sequence[Record], arms: Sequence[str], specs: Specs) -> FailuresSection:
    """Counts per arm × probe × kind, the first message of each, and the points left without a valid sample."""
    measured = [r for r in records if r.get("phase") == "measured"]
    groups: dict[tuple[str, str, str, str], list[tuple[str, Record]]] = {}
    by_point: dict[tuple[str, str, str], list[Record]] = {}
    for r in measured:
        point = point_of(r, specs)
        by_point.setdefault((str(r.get("probe")), point, str(r.get("arm"))), []).append(r)
        if r.get("ok") and not r.get("excluded_reason"):
            continue
        status, kind, _ = kind_of(r)
        groups.setdefault((str(r.get("arm")), str(r.get("probe")), status, kind), []).append((point, r))
    empty: list[EmptyPoint] = []
    for (probe, point, arm), at in by_point.items():
        if not any(r.get("ok") and not r.get("excluded_reason") for r in at):
            kinds = sorted({kind_of(r)[1] for r in at})
            empty.append({"probe": probe, "point": point, "arm": arm, "requests": len(at), "kinds": kinds})
    order = {a: i for i, a in enumerate(arms)}
    empty.sort(key=lambda e: (order.get(e["arm"], 99), spec_of(e["probe"], specs).order, point_sort(e["point"])))
    removed = {(e["arm"], e["probe"], e["point"]) for e in empty}
    rows: list[FailureRow] = []
    for (arm, probe, status, kind), hits in sorted(
        groups.items(), key=lambda kv: (order.get(kv[0][0], 99), spec_of(kv[0][1], specs).order, kv[0][1:])
    ):
        points = sorted({p for p, _ in hits}, key=point_sort)
        rows.append(
            {
                "arm": arm,
                "probe": probe,
                "kind": kind,
                "status": status,
                "count": len(hits),
                "points": points,
                "points_removed": [p for p in points if (arm, probe, p) in removed],
                "first_message": kind_of(hits[0][1])[2],
            }
        )
    failed = sum(1 for r in measured if not r.get("ok"))
    excluded = sum(1 for r in measured if r.get("ok") and r.get("excluded_reason"))
    return {
        "failed": failed,
        "excluded": excluded,
        "measured": len(measured),
        "rows": rows,
        "empty_points": empty,
        "lines": lines(rows, failed, excluded, len(measured)),
    }


def headline(failed: int, excluded: int, measured: int) -> str:
    """One sentence for the verdict block: how many measured requests failed (and were excluded)."""
    if not failed and not excluded:
        return f"No measured request failed or was excluded ({measured} measured)."
    parts = [f"{failed} of {measured} measured request(s) failed"]
    if excluded:
        parts.append(f"{excluded} excluded")
    return ", ".join(parts) + " — see Failures and exclusions."


def lines(rows: Sequence[FailureRow], failed: int, excluded: int, measured: int) -> list[str]:
    """The section as sentences (terminal, notes): one per arm × probe × kind."""
    out = [headline(failed, excluded, measured)]
    for r in rows:
        gone = f"; no valid sample left at {', '.join(r['points_removed'])}" if r["points_removed"] else ""
        out.append(
            f"{r['arm']} {r['probe']}: {r['count']} {r['status']} ({r['kind']}) at {', '.join(r['points'])}{gone} — "
            f"first: {r['first_message']}"
        )
    return out


HEADER = ["Arm", "Probe", "Status", "Kind", "Count", "Points", "Points without a valid sample", "First message"]


def table(section: FailuresSection) -> list[list[str]]:
    return [
        [
            r["arm"],
            r["probe"],
            r["status"],
            r["kind"],
            str(r["count"]),
            ", ".join(r["points"]),
            ", ".join(r["points_removed"]) or "–",
            r["first_message"],
        ]
        for r in section["rows"]
    ]
