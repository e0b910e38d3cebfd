"""A gate's outcome from an interval, and its result row: what every part that evaluates gates shares
(``report.gates`` for the timing metrics, and the fidelity and retrieval sections for theirs)."""

from __future__ import annotations

from pytest_kvcache.config.grammars import Gate
from pytest_kvcache.model.base import Outcome
from pytest_kvcache.model.report import GateResult


def judge(op: str, lo: float | None, hi: float | None, threshold: float) -> Outcome:
    """pass / fail / inconclusive for a CI [lo, hi] against ``op threshold``: fail only when the whole CI is
    on the wrong side (the data show the miss), pass only when it is wholly on the right side."""
    if lo is None or hi is None:
        return "inconclusive"
    if op in (">=", ">"):
        ok = lo >= threshold if op == ">=" else lo > threshold
        bad = hi < threshold if op == ">=" else hi <= threshold
    else:
        ok = hi <= threshold if op == "<=" else hi < threshold
        bad = lo > threshold if op == "<=" else lo >= threshold
    return "pass" if ok else "fail" if bad else "inconclusive"


def gate_result(
    gate: Gate,
    name: str,
    outcome: Outcome,
    value: float | None,
    lo: float | None,
    hi: float | None,
    reason: str,
    ratio: bool = False,
) -> GateResult:
    """The result row of ``gate`` (one expanded ``name``): its outcome, value and interval, and their texts."""

    def num(v: float | None) -> str:
        if v is None:
            return "–"
        return f"{v:.3f}×" if ratio else f"{v:.4g}"

    return {
        "name": name,
        "gate": gate.text,
        "outcome": outcome,
        "value": value,
        "ci_low": lo,
        "ci_high": hi,
        "threshold": gate.threshold,
        "op": gate.op,
        "reason": reason,
        "value_text": num(value),
        "ci_text": f"[{num(lo)}, {num(hi)}]" if lo is not None else "–",
        "threshold_text": f"{gate.op} {num(gate.threshold)}",
    }
