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

import functools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from pytest_kvcache.model import GateResult, Outcome
from pytest_kvcache.probes import registry

if TYPE_CHECKING:
    import pandas as pd

    from pytest_kvcache.probes.registry import ProbeSpec

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


def parse(text: str, *, arms: Sequence[str] | None = None, specs: Mapping[str, ProbeSpec] | None = None) -> Gate:
    """Parse one gate; ``arms`` (when known) are checked, and the probe and metric against ``specs`` when
    given (:func:`check` does that later for gates parsed before a user's probe registered). Errors point
    at the bad part."""
    gate = _parse(text, arms)
    if specs is not None:
        check(gate, specs)
    return gate


def _parse(text: str, arms: Sequence[str] | None) -> Gate:
    m = GATE.match(text)
    if not m:
        raise GateError(f"gate {text!r}: expected METRIC[SELECTOR]: CONDITION, e.g. 'decode_tps[short]: >= -5%'")
    metric, sel, cond = m.group("metric"), m.group("sel").strip(), m.group("cond")
    probe, _, point = sel.partition("@")
    if not re.fullmatch(r"\w+", metric):
        raise GateError(f"gate {text!r}: a metric is a name like decode_tps, got {metric!r}")
    if not re.fullmatch(r"\w+", probe):
        raise GateError(f"gate {text!r}: a selector is PROBE or PROBE@POINT, got [{sel}]")
    if "@" in sel and not point:
        raise GateError(f"gate {text!r}: empty point after '@' in [{sel}]")

    def check_arm(name: str | None) -> None:
        if name is not None and arms is not None and name not in arms:
            raise GateError(f"gate {text!r}: unknown arm {name!r}; arms: {', '.join(arms)}")

    make = functools.partial(Gate, text=text.strip(), metric=metric, probe=probe, point=point or None)
    b = BETWEEN.match(cond)
    if b and b.group("arm2") != "saved" and not re.fullmatch(NUM, b.group("arm2")):
        check_arm(b.group("arm"))
        check_arm(b.group("arm2"))
        return make(
            kind="between",
            op=_op(b.group("op")),
            threshold=float(b.group("factor") or 1.0),
            arm=b.group("arm"),
            other=b.group("arm2"),
        )
    if s := SAVED.match(cond):
        factor = float(s.group("factor")) if s.group("factor") else 1.0 + float(s.group("pct") or 0) / 100
        return make(kind="saved", op=_op(s.group("op")), threshold=factor)
    if p := BASELINE.match(cond):
        return make(kind="baseline", op=_op(p.group("op")), threshold=1.0 + float(p.group("pct")) / 100)
    if a := ABSOLUTE.match(cond):
        check_arm(a.group("arm"))
        return make(kind="absolute", op=_op(a.group("op")), threshold=float(a.group("num")), arm=a.group("arm"))
    raise GateError(
        f"gate {text!r}: cannot read the condition {cond!r}; expected 'ARM >= ARM2 [* F]', '<= +10%', "
        f"'>= 30', '[ARM] >= 30' or '<= saved [+P% | * F]'"
    )


def check(gate: Gate, specs: Mapping[str, ProbeSpec]) -> None:
    """Raise GateError unless the gate's probe is registered and has the gate's metric."""
    spec = specs.get(gate.probe)
    if spec is None:
        raise GateError(f"gate {gate.text!r}: unknown probe {gate.probe!r}; known: {', '.join(specs)}")
    known = tuple(dict.fromkeys([*spec.compared_metrics, *registry.CLIENT_METRICS, *registry.ENGINE_METRICS]))
    if spec.trials or spec.own_section or spec.search:
        known = spec.compared_metrics
    if spec.own_section and gate.kind not in ("absolute", "between"):
        raise GateError(
            f"gate {gate.text!r}: {gate.probe}'s metrics are differences from the baseline arm already; gate them "
            f"as absolutes ('{spec.primary_metric}[{gate.probe}@32k]: ARM <= 0.05') or between two arms"
        )
    if gate.metric not in known:
        raise GateError(
            f"gate {gate.text!r}: unknown metric {gate.metric!r} for probe {gate.probe}; known: {', '.join(known)}"
        )


def judge(op: str, lo: float | None, hi: float | None, threshold: float) -> Outcome:
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
    data: pd.DataFrame,
    arms: Sequence[str],
    *,
    seed: int,
    saved: pd.DataFrame | None = None,
    noise: Mapping[tuple[str, str, str], float] | None = None,
    specs: Mapping[str, ProbeSpec] | None = None,
) -> list[GateResult]:
    """Evaluate gates on the report's frame (``report.frame.frame``); ``saved`` is a stored run's frame.

    ``seed`` is the run's ``--kv-seed``: a gate's CI is the report's CI of the same delta. ``noise`` (an
    A/A run's band per (probe, point, metric), in ratio units) widens every ratio's CI by the band before
    it is judged: a difference counts only beyond the noise floor. ``specs`` (the run's) tell which probes
    measure against the baseline already (fidelity): their absolute gates without an arm judge every arm
    but the baseline.
    """
    from pytest_kvcache import stats
    from pytest_kvcache.report.frame import (
        MIN_BOOTS_FOR_BOOT_CI,
        by_boot,
        compare,
        point_sort,
        provisional_note,
        values,
    )

    results: list[GateResult] = []
    for gate in gates:
        sub = data[data["probe"] == gate.probe] if not data.empty else data
        points = [gate.point] if gate.point else sorted(set(sub["point"]) if not sub.empty else set(), key=point_sort)
        if not points:
            results.append(
                _result(gate, gate.text, "inconclusive", None, None, None, f"no measured {gate.probe} samples")
            )
            continue
        for point in points:
            at = sub[sub["point"] == point] if not sub.empty else sub
            label = f"{gate.metric}[{gate.probe}@{point}]: {gate.text.split(':', 1)[1].strip()}"
            pairs: list[tuple[str, pd.DataFrame, pd.DataFrame]] = []  # (who, base frame, other frame)
            if gate.kind == "between":
                pairs.append((f"{gate.arm}/{gate.other}", at[at["arm"] == gate.other], at[at["arm"] == gate.arm]))
            elif gate.kind == "baseline":
                pairs += [(f"{arm}/{arms[0]}", at[at["arm"] == arms[0]], at[at["arm"] == arm]) for arm in arms[1:]]
            elif gate.kind == "saved":
                if saved is None:
                    reason = "no stored run to compare with (--kv-compare)"
                    results.append(_result(gate, label, "inconclusive", None, None, None, reason))
                    continue
                old = saved[(saved["probe"] == gate.probe) & (saved["point"] == point)] if not saved.empty else saved
                pairs += [
                    (f"{arm}/saved", old[old["arm"] == arm] if not old.empty else old, at[at["arm"] == arm])
                    for arm in arms
                ]
            else:
                relative = specs is not None and (spec := specs.get(gate.probe)) is not None and spec.own_section
                for arm in [gate.arm] if gate.arm else list(arms[1:] if relative else arms):
                    mine = at[at["arm"] == arm] if not at.empty else at
                    found = values(mine, gate.metric) if not mine.empty else []
                    groups = by_boot(mine, gate.metric) if not mine.empty else []
                    over_boots = len(groups) >= MIN_BOOTS_FOR_BOOT_CI
                    if "search" in mine and mine["search"].notna().any():  # a search's own bootstrap
                        from pytest_kvcache.report.capacity import capacity_ci

                        mean, lo, hi, _ = capacity_ci(mine, seed)
                    elif over_boots:  # the boot is the unit: boot-to-boot variation is in the CI
                        mean, lo, hi = stats.mean_ci_boots(groups, seed=seed)
                    else:
                        mean, lo, hi = stats.mean_ci(found, seed=seed)
                    outcome = judge(gate.op, lo, hi, gate.threshold)
                    reason = "no valid samples" if not found else "too few samples for a CI" if lo is None else ""
                    result = _result(gate, f"{label} ({arm})", outcome, mean, lo, hi, reason)
                    if found:
                        result["ci_method"] = "boots" if over_boots else "within-boot"
                    results.append(result)
                continue
            for who, base, other in pairs:
                if base.empty or other.empty:
                    results.append(
                        _result(gate, f"{label} ({who})", "inconclusive", None, None, None, "no samples on one side")
                    )
                    continue
                cmp = compare(base, other, gate.metric, seed=seed)
                lo, hi = cmp["ci_low"], cmp["ci_high"]
                band = (noise or {}).get((gate.probe, point, gate.metric))
                reason = "" if lo is not None else "too few samples for a CI"
                if band is not None and lo is not None and hi is not None:
                    lo, hi = lo - band, hi + band
                    reason = f"CI widened by the A/A noise band ±{band * 100:.1f}%"
                outcome = judge(gate.op, lo, hi, gate.threshold)
                within = None
                if band is None and cmp["ci_method"] == "within-boot" and outcome != "inconclusive":
                    # boot-to-boot variation is not in this CI: the gate follows --kv-inconclusive
                    within = outcome
                    note = provisional_note(max(1, min(cmp["boots_baseline"], cmp["boots_arm"])))
                    reason = (
                        f"would {outcome} on a within-boot CI ({note}) — follows --kv-inconclusive; "
                        f"--kv-replicates={MIN_BOOTS_FOR_BOOT_CI} or --kv-noise=RUN decides it"
                    )
                    outcome = "inconclusive"
                result = _result(gate, f"{label} ({who})", outcome, cmp["ratio"], lo, hi, reason, ratio=True)
                result["ci_method"] = cmp["ci_method"] if band is None else "noise band"
                if within is not None:
                    result["within_boot_outcome"] = within
                results.append(result)
    return results


def _result(
    gate: Gate,
    name: str,
    outcome: Outcome,
    value: float | None,
    lo: float | None,
    hi: float | None,
    reason: str,
    ratio: bool = False,
) -> GateResult:
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
