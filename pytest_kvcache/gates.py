"""Regression gates: one grammar, ``METRIC[SELECTOR]: CONDITION``, evaluated on CIs (docs/gates.md).

Conditions::

    decode_tps[short]: int8 >= fp8 * 1.20        between two arms (ratio of means)
    ttft_s[prefill]: <= +10%                      every arm against the baseline arm
    decode_tps[agentic@turn15]: >= 30             absolute (each arm; or ``fp8 >= 30`` for one)
    ttft_s[prefill@10k]: <= saved +5%             against the stored run given by --kv-compare

A selector is ``PROBE`` or ``PROBE@POINT`` (a shape, a depth like ``10k`` or ``turnN``); without a point
the gate expands to one gate per point. A gate passes when the 95% CI lies on the right side of the
threshold, fails when it lies wholly on the wrong side, and is inconclusive when it straddles it (or
when there is no data).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

KNOWN_METRICS = (
    "ttft_s",
    "wall_tps",
    "decode_tps",
    "prefill_tps",
    "engine_prefill_s",
    "engine_ttft_s",
    "aggregate_tps",
    "stream_tps_median",
    "ttft_p95_s",
)
KNOWN_PROBES = ("short", "prefill", "agentic", "concurrency")

Op = Literal[">=", "<=", ">", "<"]
Kind = Literal["between", "baseline", "absolute", "saved"]

NAME = r"[A-Za-z0-9][\w.\-]*"
NUM = r"\d+(?:\.\d+)?"
GATE = re.compile(r"^\s*(?P<metric>[^\[\s]+)\s*\[(?P<sel>[^\]]*)\]\s*:\s*(?P<cond>.*?)\s*$")
OP = r"(?P<op>>=|<=|>|<)"
BETWEEN = re.compile(rf"^(?P<arm>{NAME})\s*{OP}\s*(?P<arm2>{NAME})\s*(?:\*\s*(?P<factor>{NUM}))?$")
SAVED = re.compile(rf"^{OP}\s*saved\s*(?:\*\s*(?P<factor>{NUM})|(?P<pct>[+-]{NUM})\s*%)?$")
BASELINE = re.compile(rf"^{OP}\s*(?P<pct>[+-]{NUM})\s*%$")
ABSOLUTE = re.compile(rf"^(?:(?P<arm>{NAME})\s*)?{OP}\s*(?P<num>-?{NUM})$")


class GateError(ValueError):
    """A malformed gate or one naming an unknown metric, probe or arm."""


@dataclass(frozen=True)
class Gate:
    text: str
    metric: str
    probe: str
    point: str | None
    kind: Kind
    op: Op
    threshold: float
    arm: str | None = None
    other: str | None = None


OPS: dict[str, Op] = {">=": ">=", "<=": "<=", ">": ">", "<": "<"}


def _op(text: str) -> Op:
    return OPS[text]


def parse(text: str, *, arms: Sequence[str] | None = None) -> Gate:
    """Parse one gate; ``arms`` (when known) are checked. Errors point at the bad part."""
    m = GATE.match(text)
    if not m:
        raise GateError(f"gate {text!r}: expected METRIC[SELECTOR]: CONDITION, e.g. 'decode_tps[short]: >= -5%'")
    metric, sel, cond = m.group("metric"), m.group("sel").strip(), m.group("cond")
    if metric not in KNOWN_METRICS:
        raise GateError(f"gate {text!r}: unknown metric {metric!r}; known: {', '.join(KNOWN_METRICS)}")
    probe, _, point = sel.partition("@")
    if probe not in KNOWN_PROBES:
        raise GateError(f"gate {text!r}: unknown probe {probe!r} in [{sel}]; known: {', '.join(KNOWN_PROBES)}")
    if "@" in sel and not point:
        raise GateError(f"gate {text!r}: empty point after '@' in [{sel}]")

    def check_arm(name: str | None) -> None:
        if name is not None and arms is not None and name not in arms:
            raise GateError(f"gate {text!r}: unknown arm {name!r}; arms: {', '.join(arms)}")

    common: dict[str, Any] = {"text": text.strip(), "metric": metric, "probe": probe, "point": point or None}
    b = BETWEEN.match(cond)
    if b and b.group("arm2") != "saved" and not re.fullmatch(NUM, b.group("arm2")):
        check_arm(b.group("arm"))
        check_arm(b.group("arm2"))
        return Gate(
            **common,
            kind="between",
            op=_op(b.group("op")),
            threshold=float(b.group("factor") or 1.0),
            arm=b.group("arm"),
            other=b.group("arm2"),
        )
    if s := SAVED.match(cond):
        factor = float(s.group("factor")) if s.group("factor") else 1.0 + float(s.group("pct") or 0) / 100
        return Gate(**common, kind="saved", op=_op(s.group("op")), threshold=factor)
    if p := BASELINE.match(cond):
        return Gate(**common, kind="baseline", op=_op(p.group("op")), threshold=1.0 + float(p.group("pct")) / 100)
    if a := ABSOLUTE.match(cond):
        check_arm(a.group("arm"))
        return Gate(
            **common, kind="absolute", op=_op(a.group("op")), threshold=float(a.group("num")), arm=a.group("arm")
        )
    raise GateError(
        f"gate {text!r}: cannot read the condition {cond!r}; expected 'ARM >= ARM2 [* F]', '<= +10%', "
        f"'>= 30', '[ARM] >= 30' or '<= saved [+P% | * F]'"
    )


def judge(op: str, lo: float | None, hi: float | None, threshold: float) -> str:
    """pass / fail / inconclusive for a CI [lo, hi] against ``op threshold``."""
    if lo is None or hi is None:
        return "inconclusive"
    if op in (">=", ">"):
        ok = lo >= threshold if op == ">=" else lo > threshold
        bad = hi < threshold if op == ">=" else hi <= threshold
    else:
        ok = hi <= threshold if op == "<=" else hi < threshold
        bad = lo > threshold if op == "<=" else lo >= threshold
    return "pass" if ok else "fail" if bad else "inconclusive"


def evaluate(
    gates: Sequence[Gate],
    data: Any,
    arms: Sequence[str],
    saved: Any = None,
    seed: int = 0,
    noise: Mapping[tuple[str, str, str], float] | None = None,
) -> list[dict[str, Any]]:
    """Evaluate gates on the analysis frame (``analysis.frame``); ``saved`` is a stored run's frame.

    ``noise`` (an A/A run's band per (probe, point, metric), in ratio units) widens every ratio's CI by
    the band before it is judged: a difference counts only beyond the noise floor.
    """
    from pytest_kvcache import analysis, stats

    results: list[dict[str, Any]] = []
    for gate in gates:
        sub = data[data["probe"] == gate.probe] if not data.empty else data
        points = (
            [gate.point]
            if gate.point
            else sorted(set(sub["point"]) if not sub.empty else set(), key=analysis._point_sort)
        )
        if not points:
            results.append(
                _result(gate, gate.text, "inconclusive", None, None, None, f"no measured {gate.probe} samples")
            )
            continue
        for point in points:
            at = sub[sub["point"] == point] if not sub.empty else sub
            label = f"{gate.metric}[{gate.probe}@{point}]: {gate.text.split(':', 1)[1].strip()}"
            pairs: list[tuple[str, Any, Any]] = []  # (who, base frame, other frame)
            if gate.kind == "between":
                pairs.append((f"{gate.arm}/{gate.other}", at[at["arm"] == gate.other], at[at["arm"] == gate.arm]))
            elif gate.kind == "baseline":
                pairs += [(f"{arm}/{arms[0]}", at[at["arm"] == arms[0]], at[at["arm"] == arm]) for arm in arms[1:]]
            elif gate.kind == "saved":
                if saved is None:
                    results.append(
                        _result(
                            gate,
                            label,
                            "inconclusive",
                            None,
                            None,
                            None,
                            "no stored run to compare with (--kv-compare)",
                        )
                    )
                    continue
                old = saved[(saved["probe"] == gate.probe) & (saved["point"] == point)] if not saved.empty else saved
                pairs += [
                    (f"{arm}/saved", old[old["arm"] == arm] if not old.empty else old, at[at["arm"] == arm])
                    for arm in arms
                ]
            else:
                for arm in [gate.arm] if gate.arm else list(arms):
                    values = analysis._values(at[at["arm"] == arm], gate.metric) if not at.empty else []
                    mean, lo, hi = stats.mean_ci(values, seed=seed)
                    outcome = judge(gate.op, lo, hi, gate.threshold)
                    reason = "no valid samples" if not values else "too few samples for a CI" if lo is None else ""
                    results.append(_result(gate, f"{label} ({arm})", outcome, mean, lo, hi, reason))
                continue
            for who, base, other in pairs:
                if base.empty or other.empty:
                    results.append(
                        _result(gate, f"{label} ({who})", "inconclusive", None, None, None, "no samples on one side")
                    )
                    continue
                cmp = analysis.compare(base, other, gate.metric, seed=seed)
                lo, hi = cmp["ci_low"], cmp["ci_high"]
                band = (noise or {}).get((gate.probe, point, gate.metric))
                reason = "" if lo is not None else "too few samples for a CI"
                if band is not None and lo is not None and hi is not None:
                    lo, hi = lo - band, hi + band
                    reason = f"CI widened by the A/A noise band ±{band * 100:.1f}%"
                outcome = judge(gate.op, lo, hi, gate.threshold)
                results.append(
                    _result(
                        gate,
                        f"{label} ({who})",
                        outcome,
                        cmp["ratio"],
                        lo,
                        hi,
                        reason,
                        ratio=True,
                    )
                )
    return results


def _result(
    gate: Gate,
    name: str,
    outcome: str,
    value: float | None,
    lo: float | None,
    hi: float | None,
    reason: str,
    ratio: bool = False,
) -> dict[str, Any]:
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
