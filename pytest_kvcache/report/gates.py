"""Regression gates: one grammar, ``METRIC[SELECTOR]: CONDITION``, evaluated on CIs (docs/gates.md).

Conditions::

    decode_tps[short]: int8 >= fp8 * 1.20        between two arms (ratio of means)
    ttft_s[prefill]: <= +10%                      every arm against the baseline arm
    decode_tps[agentic@turn15]: >= 30             absolute (each arm; or ``fp8 >= 30`` for one)
    ttft_s[prefill@10k]: <= saved +5%             against the stored run given by --kv-compare

A selector is ``PROBE`` or ``PROBE@POINT`` (a shape, a depth like ``10k`` or ``turnN``); without a point
the gate expands to one gate per point. A gate passes when the 95% CI of its deciding evidence (over boots,
or within boots widened by boot-to-boot variation) lies on the right side of the threshold, fails when it
lies wholly on the wrong side, and is inconclusive when it straddles it (or when there is no data).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from pytest_kvcache import stats
from pytest_kvcache.config import grammars
from pytest_kvcache.config.grammars import Gate, GateError, parse_gate
from pytest_kvcache.metrics import catalogue
from pytest_kvcache.model.report import Comparison, GateEvidence, GateResult
from pytest_kvcache.probes import registry
from pytest_kvcache.report import retrieval, spread
from pytest_kvcache.report.capacity.statistics import capacity_ci
from pytest_kvcache.report.fidelity import gate_results
from pytest_kvcache.report.frame import OVER_PROMPTS, by_boot, compare, host_busy, prompt_means, too_few_prompts, values
from pytest_kvcache.report.gate_outcome import gate_result, judge
from pytest_kvcache.report.judging import QUALITY_PROBES
from pytest_kvcache.report.points import MIN_BOOTS_FOR_BOOT_CI, point_sort

if TYPE_CHECKING:
    import pandas as pd

    from pytest_kvcache.probes.registry import ProbeSpec
    from pytest_kvcache.report.bands import Platform
    from pytest_kvcache.report.spread import Spread


def parse(text: str, *, arms: Sequence[str] | None = None, specs: Mapping[str, ProbeSpec] | None = None) -> Gate:
    """Parse one gate; ``arms`` (when known) are checked, and the probe and metric against ``specs`` when
    given (:func:`check` does that later for gates parsed before a user's probe registered). Errors point
    at the bad part."""
    gate = parse_gate(text, arms)
    if specs is not None:
        check(gate, specs)
    return gate


def check(gate: Gate, specs: Mapping[str, ProbeSpec]) -> None:
    """Raise GateError unless the gate's probe is registered and has the gate's metric."""
    spec = specs.get(gate.probe)
    if spec is None:
        raise GateError(f"gate {gate.text!r}: unknown probe {gate.probe!r}; known: {', '.join(specs)}")
    known = tuple(
        dict.fromkeys(
            [*spec.compared_metrics, *registry.CLIENT_METRICS, *registry.ENGINE_METRICS, *registry.ENERGY_METRICS]
        )
    )
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


def unusable(
    gate: Gate,
    arms: Sequence[str],
    specs: Mapping[str, ProbeSpec] | None = None,
    points: Mapping[str, Sequence[str]] | None = None,
) -> str | None:
    """Why ``gate`` cannot be evaluated in a run of ``arms`` (the baseline first), or None: the grammar's reasons
    (``config.grammars.unusable``), and ``specs``' (the probes registered: a probe measured against the baseline
    already has no figures for it). Every gate given is evaluated or reported as an ``error`` with this reason
    (:func:`evaluate`); where it is known before any boot, it is a usage error then."""
    spec = (specs or {}).get(gate.probe)
    return grammars.unusable(gate, arms, points, relative=spec is not None and spec.own_section)


def check_all(
    texts: Sequence[str],
    arms: Sequence[str],
    specs: Mapping[str, ProbeSpec],
    selected: set[str] | None,
    points: Mapping[str, Sequence[str]] | None = None,
) -> None:
    """Every gate parsed, checked against the registered probes and evaluable in a run of ``arms``; GateError
    names the first that is not. ``selected``: the probes the run's selected tests measure (None: unknown);
    ``points``: each probe's points in the run, where its settings give them (a user's probe's axis included)."""
    for text in texts:
        gate = parse(text, arms=arms, specs=specs)
        why = unusable(gate, arms, specs, points)
        if why is None and selected is not None and gate.probe not in selected:
            why = f"no {gate.probe} test is selected (-m, -k)"
        if why is not None:
            raise GateError(f"gate {gate.text!r} cannot be evaluated: {why}")


#: How far :func:`boots_to_decide` looks: beyond this many boots per arm a gate is "not within reach".
MAX_BOOTS_AHEAD = 30


def boots_to_decide(
    value: float | None,
    lo: float | None,
    hi: float | None,
    threshold: float,
    boots: int,
    *,
    ratio: bool,
) -> int | None:
    """How many more boots per arm would likely decide an open gate: its CI's half-width shrinks like
    ``1/sqrt(boots)`` (its quantile from the normal one below 3 boots to Student's t over boots from 3 on),
    against the distance of the estimate from the threshold (log scale for a ratio). None: not within
    :data:`MAX_BOOTS_AHEAD` boots per arm (the estimate sits on the threshold), or no CI to start from."""
    if value is None or lo is None or hi is None or hi <= lo:
        return None
    if ratio:
        if value <= 0 or lo <= 0 or threshold <= 0:
            return None
        distance = abs(math.log(value) - math.log(threshold))
        half = (math.log(hi) - math.log(lo)) / 2
    else:
        distance, half = abs(value - threshold), (hi - lo) / 2
    n = max(boots, 1)
    quantile = stats.t_quantile(2 * n - 2 if n >= MIN_BOOTS_FOR_BOOT_CI else math.inf)
    spread = half / quantile * math.sqrt(n)  # the standard error of one boot per arm
    for more in range(1, MAX_BOOTS_AHEAD - n + 1):
        m = n + more
        q = stats.t_quantile(2 * m - 2 if m >= MIN_BOOTS_FOR_BOOT_CI else math.inf)
        if q * spread / math.sqrt(m) < distance:
            return more
    return None


def evaluate(
    gates: Sequence[Gate],
    data: pd.DataFrame,
    arms: Sequence[str],
    *,
    seed: int,
    saved: pd.DataFrame | None = None,
    noise: Mapping[tuple[str, str, str], Spread] | None = None,
    specs: Mapping[str, ProbeSpec] | None = None,
    platform: Platform = "cpu",
    unjudgeable: str | None = None,
    unlike: str | None = None,
    ceiling: float = 0.8,
) -> list[GateResult]:
    """Evaluate gates on the report's frame (``report.frame.frame``); ``saved`` is a stored run's frame.

    ``seed`` is the run's ``--kv-seed``: a gate's CI is the report's CI of the same delta. Each gate is
    decided by the first evidence that applies (its ``evidence`` says which, with its figures):

    1. ``boots``: 3+ boots per side — the CI over boots (blocks under pytest-xdist), as the report's delta;
    2. fewer: the within-boot CI widened by the boot-to-boot spread ``report.spread`` chooses — a stored A/A's
       (``noise``: ``noise run``), the run's own boots from 2 on a side (``run's boots``, or the ``default
       band`` where that is wider), the default band of the metric's family on ``platform`` at one boot when
       no compared sample saw the host busy, else the ``widest`` spread measured on any host.

    A gate fails only when that CI lies wholly on the wrong side of the threshold, passes when it lies
    wholly on the right side, and is otherwise inconclusive (with ``boots_to_decide``: how many more boots
    per arm would likely decide it). ``specs`` (the run's) tell which probes measure against the baseline
    already (fidelity): their absolute gates without an arm judge every arm but the baseline. Fidelity scores
    are deterministic across boots, so its absolute and between-arm gates are decided over texts instead
    (evidence ``texts``: ``report.fidelity.gate_results``), inconclusive with fewer than 3 texts.
    """
    results: list[GateResult] = []
    run_busy = host_busy(data) if not data.empty else 0  # a host busy anywhere in the run is a loaded host
    for gate in gates:
        sub = data[data["probe"] == gate.probe] if not data.empty else data
        measured = sorted(set(sub["point"]) if not sub.empty else set(), key=point_sort)
        why = unusable(gate, arms, specs, {gate.probe: measured} if measured else None)
        if why is None and sub.empty:
            why = f"no {gate.probe} test ran in this run (not selected by -m or -k, or every one skipped)"
        elif why is None and (gate.metric not in sub or sub[gate.metric].isna().all()):
            why = f"no {gate.probe} sample of this run has {gate.metric} (never measured)"
        elif why is None and gate.kind == "saved" and saved is not None:
            old_arms = set(saved[saved["probe"] == gate.probe]["arm"]) if not saved.empty else set()
            missing = [a for a in arms if a not in old_arms]
            if missing:
                why = f"the stored run (--kv-compare) has no {gate.probe} figures of arm(s) {', '.join(missing)}"
        if why is None and unjudgeable is not None and gate.probe in QUALITY_PROBES:
            why = unjudgeable  # a baseline that cannot read its text judges no quality gate, either way
        if why is not None:  # never silently dropped: an error, which fails the run (exit 1)
            results.append(gate_result(gate, gate.text, "error", None, None, None, f"cannot be evaluated: {why}"))
            continue
        points = [gate.point] if gate.point else measured
        for point in points:
            at = sub[sub["point"] == point] if not sub.empty else sub
            label = f"{gate.metric}[{gate.probe}@{point}]: {gate.text.split(':', 1)[1].strip()}"
            if gate.probe == "fidelity" and gate.kind in ("absolute", "between"):
                # deterministic across boots: judged over texts, never boots (report.fidelity)

                results += gate_results(gate, label, at, arms)
                continue
            if gate.probe == "retrieval":
                # greedy needles, deterministic across boots: judged over needles (report.retrieval), against the
                # baseline's ceiling

                needles = retrieval.records_of(at)
                results += retrieval.gate_results(gate, label, point, needles, arms, {"retrieval_ceiling": ceiling})
                continue
            pairs: list[tuple[str, pd.DataFrame, pd.DataFrame]] = []  # (who, base frame, other frame)
            if gate.kind == "between":
                pairs.append((f"{gate.arm}/{gate.other}", at[at["arm"] == gate.other], at[at["arm"] == gate.arm]))
            elif gate.kind == "baseline":
                pairs += [(f"{arm}/{arms[0]}", at[at["arm"] == arms[0]], at[at["arm"] == arm]) for arm in arms[1:]]
            elif gate.kind == "saved":
                if saved is None:
                    reason = "no stored run to compare with (--kv-compare)"
                    results.append(gate_result(gate, label, "inconclusive", None, None, None, reason))
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
                    if catalogue.family(gate.metric) in OVER_PROMPTS:
                        results.append(_over_prompts(gate, f"{label} ({arm})", mine))
                        continue
                    found = values(mine, gate.metric) if not mine.empty else []
                    groups = by_boot(mine, gate.metric) if not mine.empty else []
                    ci = None
                    if "search" in mine and mine["search"].notna().any():  # a search's own bootstrap
                        ci = capacity_ci(mine, seed, gate.metric)[:3]
                    results.append(
                        _absolute(
                            gate,
                            f"{label} ({arm})",
                            found,
                            groups,
                            seed,
                            platform,
                            ci=ci,
                            busy=run_busy,
                            unlike=unlike,
                        )
                    )
                continue
            for who, base, other in pairs:
                if base.empty or other.empty:
                    results.append(
                        gate_result(
                            gate, f"{label} ({who})", "inconclusive", None, None, None, "no samples on one side"
                        )
                    )
                    continue
                cmp = compare(base, other, gate.metric, seed=seed)
                band = (noise or {}).get((gate.probe, point, gate.metric))
                results.append(_ratio(gate, f"{label} ({who})", cmp, band, platform, run_busy, unlike))
    return results


def _finite(interval: tuple[float, float]) -> tuple[float | None, float | None]:
    """An interval as a gate stores it: an unbounded one (no spread to judge with) is no interval."""
    lo, hi = interval
    return (lo, hi) if math.isfinite(lo) and math.isfinite(hi) else (None, None)


def _spread_evidence(found: Spread, within: list[float | None], platform: Platform, metric: str) -> GateEvidence:
    """A gate's evidence for a within-boot CI widened by ``found`` (``report.spread``)."""
    evidence: GateEvidence = {"kind": found.kind, "within_ci": within, "platform": platform, "source": found.text}
    if math.isfinite(found.sd):
        evidence["boot_sd_pct"] = found.sd * 100
    if math.isfinite(found.df):
        evidence["df"] = found.df
    if found.kind == "default band" and (name := catalogue.family(metric)) is not None:
        evidence["family"] = name
    return evidence


def _boots_note(boots_base: int, boots_arm: int) -> str:
    return f"boots {boots_base} and {boots_arm}"


def _ratio(
    gate: Gate,
    name: str,
    cmp: Comparison,
    noise: Spread | None,
    platform: Platform,
    run_busy: int | None = None,
    unlike: str | None = None,
) -> GateResult:
    """One ratio gate (between arms, against the baseline, against a saved run) on its deciding evidence:
    over boots its own CI, else the within-boot CI widened by the spread ``report.spread`` chooses."""
    lo, hi, ratio = cmp["ci_low"], cmp["ci_high"], cmp["ratio"]
    boots_base, boots_arm = max(cmp["boots_baseline"], 1), max(cmp["boots_arm"], 1)
    evidence: GateEvidence = {"kind": "none", "boots_baseline": cmp["boots_baseline"], "boots_arm": cmp["boots_arm"]}
    reason = ""
    if lo is None or hi is None or ratio is None:
        reason = str(cmp.get("ci_note") or "too few samples for a CI") if ratio is not None else "no valid samples"
        if cmp["ci_method"] == "prompts":
            evidence["kind"] = "prompts"
    elif cmp["ci_method"] == "boots":
        evidence.update({"kind": "boots", "text": f"CI over boots ({_boots_note(boots_base, boots_arm)}: t-interval)"})
    elif cmp["ci_method"] == "prompts":  # deterministic across boots (acceptance): replicated over prompts only
        evidence.update({"kind": "prompts", "text": f"CI over {cmp.get('prompts', 0)} prompts (t-interval)"})
    else:
        found, boots = spread.for_comparison(gate.metric, cmp, platform, noise, run_busy, unlike)
        evidence.update(_spread_evidence(found, [lo, hi], platform, gate.metric))
        evidence["text"] = f"within-boot CI ({_boots_note(boots_base, boots_arm)}) widened by {found.text}"
        widest = spread.widest(gate.metric)
        if widest is not None and found.kind != "widest":  # would this interval's outcome hold on any host?
            far = _finite(spread.ratio_interval(ratio, lo, hi, widest, boots))
            evidence["beyond_widest"] = judge(gate.op, *far, gate.threshold) == "fail"
        lo, hi = _finite(spread.ratio_interval(ratio, lo, hi, found, boots))
    outcome = judge(gate.op, lo, hi, gate.threshold)
    reason = reason or str(evidence.get("text", ""))
    result = gate_result(gate, name, outcome, ratio, lo, hi, reason, ratio=True)
    result["ci_method"] = cmp["ci_method"] if evidence["kind"] != "noise run" else "noise band"
    result["evidence"] = evidence
    if outcome == "inconclusive" and evidence["kind"] not in ("none", "prompts"):  # a boot cannot decide prompts
        result["boots_to_decide"] = boots_to_decide(
            ratio, lo, hi, gate.threshold, min(boots_base, boots_arm), ratio=True
        )
    return result


def _absolute(
    gate: Gate,
    name: str,
    found: Sequence[float],
    groups: Sequence[Sequence[float]],
    seed: int,
    platform: Platform,
    *,
    ci: tuple[float | None, float | None, float | None] | None = None,
    busy: int = 0,
    unlike: str | None = None,
) -> GateResult:
    """One absolute gate (one arm's mean against a number) on its deciding evidence. ``ci`` (mean, low, high)
    replaces the CI of the mean where the metric has its own (a capacity search's bootstrap)."""
    boots = len(groups)
    evidence: GateEvidence = {"kind": "none", "boots_arm": boots}
    if boots >= MIN_BOOTS_FOR_BOOT_CI:  # the boot is the unit: boot-to-boot variation is in the CI
        mean, lo, hi = ci or stats.mean_ci_boots(groups)
        how = "the search's bootstrap over boots" if ci else "t-interval"
        evidence.update({"kind": "boots", "text": f"CI over boots ({boots} boots: {how})"})
    else:
        mean, lo, hi = ci or stats.mean_ci(found, seed=seed)
        if mean is not None and lo is not None and hi is not None:
            run = stats.pooled_log_sd(groups)
            chosen = spread.choose(gate.metric, platform, (max(boots, 1),) * 2, run=run, host_busy=busy, unlike=unlike)
            evidence.update(_spread_evidence(chosen, [lo, hi], platform, gate.metric))
            evidence["text"] = f"within-boot CI ({boots} boot{'' if boots == 1 else 's'}) widened by {chosen.text}"
            widest = spread.widest(gate.metric)
            if widest is not None and chosen.kind != "widest":  # would this interval's outcome hold on any host?
                far = _finite(spread.mean_interval(mean, lo, hi, widest, max(boots, 1)))
                evidence["beyond_widest"] = judge(gate.op, *far, gate.threshold) == "fail"
            lo, hi = _finite(spread.mean_interval(mean, lo, hi, chosen, max(boots, 1)))
    outcome = judge(gate.op, lo, hi, gate.threshold)
    reason = "no valid samples" if not found else "too few samples for a CI" if lo is None else ""
    result = gate_result(gate, name, outcome, mean, lo, hi, reason or str(evidence.get("text", "")))
    if found:
        result["ci_method"] = "boots" if evidence["kind"] == "boots" else "within-boot"
    result["evidence"] = evidence
    if outcome == "inconclusive" and evidence["kind"] not in ("none", "prompts"):  # a boot cannot decide prompts
        result["boots_to_decide"] = boots_to_decide(mean, lo, hi, gate.threshold, max(boots, 1), ratio=False)
    return result


def _over_prompts(gate: Gate, name: str, mine: pd.DataFrame) -> GateResult:
    """An absolute gate on a metric deterministic across boots and repeats (acceptance): Student's t over its
    prompts' means (``report.frame.compare_over_prompts``), none with fewer than 3 prompts; a boot decides nothing."""
    means = list(prompt_means(mine, gate.metric).values())
    mean, lo, hi = stats.mean_ci_clusters(means)
    if mean is None:
        reason = "no valid samples"
    elif lo is None:
        reason = too_few_prompts(gate.metric, len(means))
    else:
        reason = f"CI over {len(means)} prompts (t-interval)"
    result = gate_result(gate, name, judge(gate.op, lo, hi, gate.threshold), mean, lo, hi, reason)
    result["ci_method"] = "prompts"
    result["evidence"] = {"kind": "prompts", "text": reason}
    return result
