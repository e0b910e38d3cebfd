"""The interval that decided a delta's verdict, and how it was built (issue 41: the report prints the interval
that decided).

A delta over boots (3+ boots per arm) is judged on its own CI. A within-boot delta is judged on its CI widened
by the default boot-to-boot band (``report.bands.judge_deltas`` stores that interval as ``judged_ci``), or by
a stored A/A noise band (``--kv-noise``: ``noise_pct``, the CI ± band). This module only reads what the
judging wrote; it decides nothing (the same interval ``report.multiplicity`` reads its p-value from). Plain
Python: no pytest.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

#: ``ci_basis`` of a delta judged on its within-boot CI widened by the default band (``judged_ci``)
WIDENED_DEFAULT = "within-boot widened by the default boot-to-boot band"
#: ``ci_basis`` of a delta judged on its within-boot CI widened by the A/A noise band (``--kv-noise``)
WIDENED_NOISE = "within-boot widened by the A/A noise band"


def deciding(row: Mapping[str, Any]) -> tuple[float | None, float | None, str]:
    """``(low, high, basis)``: the ratio interval ``row``'s verdict was taken on and what it is. ``basis``
    starts with ``boots``, ``blocks``, ``within-boot`` (the row's own CI decided) or one of the ``WIDENED_*``
    phrases (then followed by the band: ``(SD 1.2%)``, ``±3.0%``)."""
    lo, hi = row.get("ci_low"), row.get("ci_high")
    method = str(row.get("ci_method") or "boots")
    if lo is None or hi is None:
        return None, None, method
    noise = row.get("noise_pct")
    if method == "within-boot" and noise is not None:  # report.judge.apply_noise: the CI ± the A/A band
        return lo - noise / 100, hi + noise / 100, f"{WIDENED_NOISE} ±{noise:.1f}%"
    judged = row.get("judged_ci")
    if judged and len(judged) == 2 and judged[0] is not None and judged[1] is not None:
        band = row.get("band_pct")
        return float(judged[0]), float(judged[1]), WIDENED_DEFAULT + (f" (SD {band:.1f}%)" if band is not None else "")
    return lo, hi, method


def widened(row: Mapping[str, Any]) -> bool:
    """Whether ``row``'s verdict was taken on an interval other than its own CI."""
    return deciding(row)[2].startswith("within-boot widened")


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
        kinds.add(
            "noise"
            if basis.startswith(WIDENED_NOISE)
            else "default"
            if basis.startswith(WIDENED_DEFAULT)
            else "within"
            if basis == "within-boot"
            else "boots"
        )
    words = {
        "boots": "its CI over boots",
        "default": "its within-boot CI widened by the default boot-to-boot band",
        "noise": "its within-boot CI widened by the A/A noise band",
        "within": "its within-boot CI (no band)",
    }
    if len(kinds) == 1:
        return words[kinds.pop()]
    if not kinds:
        return "its CI"
    return "its deciding CI (" + "; ".join(words[k].removeprefix("its ") for k in sorted(kinds)) + ")"


def annotate(rows: Sequence[dict[str, Any]]) -> None:
    """Store the deciding interval on every delta row (in place): ``decided_ci`` and ``ci_basis``."""
    for r in rows:
        lo, hi, basis = deciding(r)
        r["decided_ci"] = [lo, hi] if lo is not None and hi is not None else None
        r["ci_basis"] = basis
