"""Multiplicity control of the report's verdicts: Holm's step-down procedure within each family of deltas —
one arm and probe over its points and metrics — at a family-wise α of ``stats.FAMILY_ALPHA``. (The metrics of one
probe are read from the same requests: with a family per metric, the 6 of a short-and-prefill run let 10.7% of
quiet A/A runs at 3 boots per side print a better/worse; per probe, 4.7% — benchmarks/aa_acceptance.py.)

Each delta's p-value (H0: ratio = 1) is read from the very interval its verdict was decided on, so p < α
exactly when that interval excludes parity: over boots the Welch (or per-block) t-test its t-interval inverts
(``ci_df``); within boots — a bootstrap CI, widened by the default band (``judged_ci``) or by the A/A noise
band — the normal approximation on the log-ratio scale. A better/worse whose Holm-adjusted p is not below α becomes
inconclusive. Runs after the verdicts are set and before the crossovers and the verdict sentences read them.
Gates are not touched: a gate is one pre-registered hypothesis. Plain Python; no pytest.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pytest_kvcache import stats
from pytest_kvcache.model.report import DeltaRow
from pytest_kvcache.report import deciding


def deciding_interval(d: Mapping[str, Any]) -> tuple[float, float] | None:
    """The interval ``d``'s verdict is decided on (``report.deciding``: within boots widened by the A/A noise
    band or by the default band — ``judged_ci`` —, else its CI); None without one."""
    lo, hi, _ = deciding.deciding(d)
    return None if lo is None or hi is None else (float(lo), float(hi))


def family_of(d: Mapping[str, Any]) -> tuple[str, str]:
    """A delta's Holm family: its arm and probe (every point and metric of that probe)."""
    return (str(d.get("arm")), str(d.get("probe")))


def apply_holm(deltas: Sequence[DeltaRow], alpha: float = stats.FAMILY_ALPHA) -> None:
    """Per delta with an interval (in place): ``p_value`` from its deciding interval, ``p_holm`` and
    ``family_size`` after Holm within its (arm, probe) family; a better/worse with ``p_holm`` ≥ α
    becomes inconclusive, with a ``verdict_note`` saying so. Idempotent."""
    families: dict[tuple[str, str], list[DeltaRow]] = {}
    for d in deltas:
        found = deciding_interval(d)
        ratio = d.get("ratio")
        if found is None or ratio is None:
            for key in ("p_value", "p_holm", "family_size"):
                d.pop(key, None)  # type: ignore[misc]
            continue
        info: Mapping[str, Any] = d.get("spread") or {}
        df = (
            d.get("ci_df")
            if d.get("ci_method") in ("boots", "prompts")
            else info.get("df")
            if d.get("judged_ci")
            else None
        )
        d["p_value"] = stats.interval_p_value(float(ratio), *found, df=df)
        families.setdefault(family_of(d), []).append(d)
    for rows in families.values():
        adjusted = stats.holm([d["p_value"] for d in rows])
        for d, p in zip(rows, adjusted, strict=True):
            d["p_holm"] = p
            d["family_size"] = len(rows)
            if d["verdict"] in ("better", "worse") and p >= alpha:
                d["verdict"] = "inconclusive"
                d.pop("provisional", None)
                d["verdict_note"] = f"not beyond Holm over {len(rows)} comparisons: p {d['p_value']:.3f}, Holm {p:.3f}"


def counts(deltas: Sequence[Mapping[str, Any]]) -> tuple[int, int]:
    """(comparisons, families): the deltas with a p-value, and their (arm, probe) families."""
    tested = [d for d in deltas if d.get("p_value") is not None]
    return len(tested), len({family_of(d) for d in tested})


def lines(deltas: Sequence[Mapping[str, Any]] | None) -> list[str]:
    """The first screen's line: how many comparisons in how many families, and the rule."""
    made, families = counts(deltas or [])
    if not made:
        return []
    return [
        f"{made} comparison{'' if made == 1 else 's'} in {families} famil{'y' if families == 1 else 'ies'}; "
        f"Holm within each family (family-wise α = {stats.FAMILY_ALPHA:g}; gates are judged alone)."
    ]
