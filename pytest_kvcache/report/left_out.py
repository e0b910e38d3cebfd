"""What a run left out by design because it cannot fit the model's context, and the agentic fixture it used.

Not failures: a request whose prompt plus ``max_tokens`` exceeds the engine's context would only get HTTP
400. Default probe points beyond a context known before any boot are dropped from the plan
(``run.json`` settings' ``context_notes``); points and agentic turns found too long at a boot are in
``left_out.jsonl``. The agentic fixture each session used is named with its sha256 and, when its tool
results were scaled to reach ``--kv-agentic-depth``, the factor and the stock fixture's sha256.
Plain Python: no pytest.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pytest_kvcache.report.load import jsonl


def _ranges(numbers: Sequence[int]) -> str:
    """``[10, 11, 12, 15]`` → ``10–12, 15``."""
    out: list[str] = []
    run: list[int] = []
    for n in sorted(numbers):
        if run and n == run[-1] + 1:
            run.append(n)
            continue
        if run:
            out.append(f"{run[0]}–{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [n]
    if run:
        out.append(f"{run[0]}–{run[-1]}" if len(run) > 1 else str(run[0]))
    return ", ".join(out)


def section(path: Path, settings: Mapping[str, Any], records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The section of one run folder: the context, what was left out before and at the boots, the fixtures."""
    entries, _ = jsonl(path / "left_out.jsonl")
    groups: dict[tuple[str, str, object], list[Mapping[str, Any]]] = {}
    for e in entries:
        groups.setdefault((str(e.get("boot")), str(e.get("probe")), e.get("session")), []).append(e)
    rows = []
    for (boot, probe, session), mine in groups.items():
        turns = [int(e["turn"]) for e in mine if isinstance(e.get("turn"), int)]
        points = _ranges(turns) if turns else ", ".join(str(e.get("point")) for e in mine)
        rows.append(
            {
                "boot": boot,
                "arm": mine[0].get("arm"),
                "probe": probe,
                "session": session,
                "points": ("turns " if turns else "") + points,
                "count": len(mine),
                "reason": mine[0].get("reason"),
            }
        )
    fixtures: dict[str, dict[str, Any]] = {}
    for r in records:
        if r.get("probe") == "agentic" and r.get("fixture_sha256"):
            fixtures.setdefault(
                str(r["fixture_sha256"]),
                {
                    "sha256": r["fixture_sha256"],
                    "scale": r.get("fixture_scale", 1.0),
                    "stock_sha256": r.get("fixture_stock_sha256"),
                    "depth": r.get("fixture_depth"),
                    "last_turn_tokens": r.get("fixture_last_turn_tokens"),
                },
            )
    return {
        "context_tokens": settings.get("context_tokens"),
        "context_source": settings.get("context_source"),
        "before_boot": list(settings.get("context_notes") or []),
        "rows": rows,
        "agentic_fixtures": list(fixtures.values()),
    }


def lines(found: Mapping[str, Any] | None) -> list[str]:
    """Plain lines for the terminal: what was left out, and which agentic fixture ran."""
    if not found:
        return []
    out = [f"left out (cannot fit the context): {note}" for note in found.get("before_boot") or []]
    for row in found.get("rows") or []:
        session = f" s{row['session']}" if row.get("session") is not None else ""
        where = f"{row['probe']}{session} on {row['boot']}"
        out.append(f"left out (cannot fit the context): {where}: {row['points']} — {row['reason']}")
    for f in found.get("agentic_fixtures") or []:
        scale = float(f.get("scale") or 1.0)
        if scale == 1.0:
            out.append(f"agentic fixture: session-v1 as committed (sha256 {str(f['sha256'])[:12]}…)")
        else:
            tokens = f.get("last_turn_tokens")
            reach = f", last turn {tokens:,} prompt tokens" if isinstance(tokens, int) else ""
            out.append(
                f"agentic fixture: session-v1 with tool results scaled ×{scale:.4g} (--kv-agentic-depth="
                f"{f.get('depth')}{reach}; sha256 {str(f['sha256'])[:12]}…, stock {str(f.get('stock_sha256'))[:12]}…)"
            )
    return out


def markdown(found: Mapping[str, Any] | None) -> list[str]:
    """report.md's section (nothing when nothing was left out and no agentic session ran)."""
    if not found or not (found.get("before_boot") or found.get("rows") or found.get("agentic_fixtures")):
        return []
    out = ["## Left out by design (cannot fit the context)", ""]
    if found.get("context_tokens"):
        out += [f"Context: {found['context_tokens']:,} tokens ({found.get('context_source')}).", ""]
    if found.get("before_boot") or found.get("rows"):
        out += [
            "Requests whose prompt plus output cannot fit the context are not sent (they would get HTTP 400): "
            "these are not failures.",
            "",
        ]
        out += [f"- {note}" for note in found.get("before_boot") or []]
        for row in found.get("rows") or []:
            session = f" session {row['session']}" if row.get("session") is not None else ""
            out.append(f"- {row['probe']}{session} on {row['boot']}: {row['points']} — {row['reason']}")
        out.append("")
    fixture_lines = [line for line in lines(found) if line.startswith("agentic fixture")]
    out += [f"- {line}" for line in fixture_lines] + ([""] if fixture_lines else [])
    return out
