"""The interval that decided a delta's verdict, and how it was built (issue 41: the report prints the interval
that decided).

A delta over boots (3+ boots per arm) is judged on its own CI. A within-boot delta is judged on its CI widened
by a boot-to-boot spread (``report.spread.judge_deltas`` stores that interval as ``judged_ci`` and the spread as
``spread``: the default band, this run's boots, a stored A/A, or the widest spread measured on any host). This
module only reads what the judging wrote; it decides nothing (the same interval ``report.multiplicity`` reads its
p-value from). Plain Python: no pytest.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

#: ``ci_basis`` of a delta judged on its within-boot CI widened by a spread (``report.spread``): this prefix, then
#: the spread's words ("the default CPU decode rate band (boot-to-boot SD 8.2%)", "the A/A noise run …")
WIDENED = "within-boot widened by"
#: the words of ``which`` per spread kind
_KIND_WORDS = {
    "default band": "its within-boot CI widened by the default boot-to-boot band",
    "noise run": "its within-boot CI widened by the A/A noise run's spread",
    "run's boots": "its within-boot CI widened by this run's boot-to-boot spread",
    "widest": "its within-boot CI widened by the widest spread measured on any host",
}


def deciding(row: Mapping[str, Any]) -> tuple[float | None, float | None, str]:
    """``(low, high, basis)``: the ratio interval ``row``'s verdict was taken on and what it is. ``basis`` is
    ``boots``, ``blocks``, ``within-boot`` (the row's own CI decided: no spread to widen it with, so no
    directional verdict) or ``WIDENED`` followed by the spread's words."""
    lo, hi = row.get("ci_low"), row.get("ci_high")
    method = str(row.get("ci_method") or "boots")
    if lo is None or hi is None:
        return None, None, method
    judged = row.get("judged_ci")
    info = row.get("spread") or {}
    if method == "within-boot" and judged and len(judged) == 2 and judged[0] is not None and judged[1] is not None:
        return float(judged[0]), float(judged[1]), f"{WIDENED} {info.get('text') or 'a boot-to-boot spread'}"
    return lo, hi, method


def widened(row: Mapping[str, Any]) -> bool:
    """Whether ``row``'s verdict was taken on an interval other than its own CI."""
    return deciding(row)[2].startswith(WIDENED)


def pct_interval(lo: float, hi: float) -> str:
    """A ratio interval as percent deltas: ``[+2.0, +61.9]``."""
    return f"[{(lo - 1) * 100:+.1f}, {(hi - 1) * 100:+.1f}]"


def which(rows: Sequence[Mapping[str, Any]]) -> str:
    """The interval the verdicts of ``rows`` were taken on, in words, for a sentence ("… beyond {which}")."""
    kinds = set()
    for r in rows:
        if r.get("ci_low") is None:
            continue
        basis = deciding(r)[2]
        if basis.startswith(WIDENED):
            kinds.add(str((r.get("spread") or {}).get("kind") or "default band"))
        else:
            kinds.add("within" if basis == "within-boot" else "prompts" if basis == "prompts" else "boots")
    words = {
        **_KIND_WORDS,
        "boots": "its CI over boots",
        "within": "its within-boot CI (no spread)",
        "prompts": "its CI over prompts",
    }
    if len(kinds) == 1:
        return words.get(kinds.pop(), "its deciding CI")
    if not kinds:
        return "its CI"
    return "its deciding CI (" + "; ".join(words.get(k, k).removeprefix("its ") for k in sorted(kinds)) + ")"


def annotate(rows: Sequence[dict[str, Any]]) -> None:
    """Store the deciding interval on every delta row (in place): ``decided_ci`` and ``ci_basis``."""
    for r in rows:
        lo, hi, basis = deciding(r)
        r["decided_ci"] = [lo, hi] if lo is not None and hi is not None else None
        r["ci_basis"] = basis
