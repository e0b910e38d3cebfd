"""``report["kv_plan"]``: each arm's KV cache as planned before its boot beside what the engine reported — the
KV tokens (``KV cache size: N tokens``) and the maximum concurrency at ``max_model_len`` — with the difference.

The plan is the engine kind's arithmetic (``Kind.kv_plan``; vLLM's groups, blocks and windows), stored with the
boot plan in ``run.json`` (``plan[].kv_plan``); the reported figures are the first boot's evidence (its
``/metrics`` cache config, else its log). A difference over :data:`FLAG_PCT` is a flagged line naming the layout:
the arithmetic missed something of that layout or engine version, and the plan's figures for it (the boot plan,
the budget rule) cannot be trusted. A layout the arithmetic does not model has no planned figure; the row says
why, and the engine's figure is the one used. The section, its ``report.md`` table, its HTML table and its
terminal lines are all here.
"""

from __future__ import annotations

from pytest_kvcache.config.budget import fmt_bytes
from pytest_kvcache.model.evidence import Evidence, kv_capacity_tokens, kv_max_concurrency
from pytest_kvcache.model.report import KvPlanRow, Report
from pytest_kvcache.report.load import RunData

#: plan and engine further apart than this (percent) is a flagged line
FLAG_PCT = 2.0
HEADER = ["Arm", "Layout", "max_model_len", "Budget", "Planned tokens", "Reported tokens", "Diff", "Concurrency"]


def rows(run: RunData) -> list[KvPlanRow]:
    """One row per arm with a planned KV figure (or a plan saying it is not modelled) in ``run.json``."""
    plan = run.meta.get("plan") or []
    out: list[KvPlanRow] = []
    for arm in run.arms:
        entries = [p for p in plan if p.get("arm") == arm and p.get("kv_plan")]
        if not entries:
            continue
        booted = [p for p in entries if str(p.get("boot")) in run.evidence]
        entry = booted[0] if booted else entries[0]
        planned = entry.get("kv_plan") or {}
        boot = str(entry.get("boot")) if booted else None
        evidence: Evidence = run.evidence.get(boot or "", Evidence())
        reported, concurrency = kv_capacity_tokens(evidence), kv_max_concurrency(evidence)
        tokens = planned.get("tokens")
        diff = (reported / tokens - 1) * 100 if tokens and reported is not None else None
        row: KvPlanRow = {
            "arm": arm,
            "boot": boot,
            "layout": str(planned.get("layout") or ""),
            "max_model_len": planned.get("max_model_len"),
            "budget_bytes": planned.get("budget_bytes"),
            "planned_tokens": tokens,
            "reported_tokens": reported,
            "diff_pct": round(diff, 3) if diff is not None else None,
            "planned_concurrency": planned.get("concurrency"),
            "reported_concurrency": concurrency,
            "groups": str(planned.get("groups") or ""),
            "assumptions": str(planned.get("assumptions") or ""),
            "not_modelled": str(planned.get("not_modelled") or ""),
            "flag": None,
        }
        if diff is not None and abs(diff) > FLAG_PCT:
            row["flag"] = (
                f"KV plan vs engine: arm {arm} ({boot}): planned {tokens:,} tokens, the engine reported "
                f"{reported:,} ({diff:+.1f}%) — the arithmetic does not hold for this layout ({row['layout']}; "
                f"{row['groups']}; assuming {row['assumptions'] or 'the defaults'})"
            )
        out.append(row)
    return out


def _concurrency(row: KvPlanRow) -> str:
    planned, reported = row["planned_concurrency"], row["reported_concurrency"]
    left = f"{planned:.2f}x" if planned is not None else "–"
    right = f"{reported:.2f}x" if reported is not None else "–"
    return f"{left} planned / {right} reported"


def table(report: Report) -> tuple[list[str], list[list[str]]]:
    """Planned beside reported, per arm."""
    body = []
    for row in report.get("kv_plan") or []:
        planned = f"{row['planned_tokens']:,}" if row["planned_tokens"] is not None else "not modelled"
        reported = f"{row['reported_tokens']:,}" if row["reported_tokens"] is not None else "not reported"
        diff = f"{row['diff_pct']:+.2f}%" if row["diff_pct"] is not None else "–"
        length = f"{row['max_model_len']:,}" if row["max_model_len"] is not None else "?"
        body.append(
            [
                row["arm"],
                row["layout"],
                length,
                "–" if row["budget_bytes"] is None else fmt_bytes(row["budget_bytes"]),
                planned,
                reported,
                diff + (" ⚠" if row["flag"] else ""),
                _concurrency(row),
            ]
        )
    return HEADER, body


def notes(report: Report) -> list[str]:
    """The flagged lines, then what is not modelled and what each plan assumed (once per distinct text)."""
    found = report.get("kv_plan") or []
    lines = [row["flag"] for row in found if row["flag"]]
    lines += list(
        dict.fromkeys(
            f"not modelled for {row['arm']}: {row['not_modelled']} — the engine's reported figure is the one used"
            for row in found
            if row["not_modelled"]
        )
    )
    lines += list(
        dict.fromkeys(
            f"planned with {row['groups']}; {row['assumptions']}"
            for row in found
            if row["groups"] and row["assumptions"]
        )
    )
    return lines


def markdown(report: Report) -> list[str]:
    if not report.get("kv_plan"):
        return []
    header, body = table(report)
    lines = ["", "## KV cache: planned and reported", ""]
    lines += ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(cells) + " |" for cells in body]
    flagged = [row["flag"] for row in report["kv_plan"] if row["flag"]]
    others = [line for line in notes(report) if line not in flagged]
    if flagged or others:
        lines.append("")
    lines += [f"- **flagged**: {line}" for line in flagged]
    lines += [f"- {line}" for line in others]
    return lines


def terminal(report: Report) -> list[tuple[str, bool]]:
    """(text, flagged) lines: one per arm, then the flagged ones."""
    out: list[tuple[str, bool]] = []
    for row in report.get("kv_plan") or []:
        if row["planned_tokens"] is None:
            text = f"KV {row['arm']}: not modelled ({row['not_modelled']}); the engine reported "
            text += f"{row['reported_tokens']:,} tokens" if row["reported_tokens"] is not None else "nothing"
        else:
            reported = f"{row['reported_tokens']:,}" if row["reported_tokens"] is not None else "not reported"
            diff = f" ({row['diff_pct']:+.2f}%)" if row["diff_pct"] is not None else ""
            text = (
                f"KV {row['arm']}: planned {row['planned_tokens']:,} tokens, reported {reported}{diff}; "
                f"concurrency {_concurrency(row)}"
            )
        out.append((text, False))
    out += [(row["flag"], True) for row in report.get("kv_plan") or [] if row["flag"]]
    return out
