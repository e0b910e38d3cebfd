"""Adaptive rounds: is another round (block) of boots unnecessary? Judged on the same evidence and by the
same rules as the report (the gates as ``report.gates`` evaluates them, the deltas as
:mod:`pytest_kvcache.report.comparison` computes them). The run's adaptive loop asks it between rounds."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pandas as pd

from pytest_kvcache.config.grammars import GateError
from pytest_kvcache.model.records import Record
from pytest_kvcache.model.report import DeltaRow
from pytest_kvcache.report import bands
from pytest_kvcache.report.comparison import ci_half_width_pct, delta_rows
from pytest_kvcache.report.frame import frame
from pytest_kvcache.report.gates import evaluate, parse
from pytest_kvcache.report.points import Specs, spec_of
from pytest_kvcache.report.spread import Spread

#: The evidence an interim look may stop a run on with a FAIL: over boots, or judged with the widest spread
#: measured on any host (or beyond it: the gate's ``beyond_widest``). A FAIL on any other within-boot evidence
#: boots on: looked at after every round, it would falsely fail more often than at any fixed boot count.
STOPS_ON_FAIL = frozenset({"boots", "widest"})


def rounds_check(
    records: Sequence[Record],
    arms: Sequence[str],
    specs: Specs,
    target_pct: float | None,
    seed: int,
    gates: Sequence[str] = (),
    blocks: Mapping[str, int] | None = None,
    *,
    platform: bands.Platform = "cpu",
    noise: Mapping[tuple[str, str, str], Spread] | None = None,
    saved: pd.DataFrame | None = None,
    external: bool = False,
    unlike: str | None = None,
) -> tuple[bool, dict[str, object] | None]:
    """Is another round (block) of boots unnecessary? One rule for every probe — short, prefill, agentic,
    concurrency, a user's — on the same evidence as the report (paired by block under pytest-xdist:
    ``blocks`` maps each boot to its block):

    - every gate is evaluated exactly as the report evaluates it (``report.gates.evaluate``, with the A/A
      noise run, the stored run and the platform's default bands): a round is needed while one of them is
      undecided — its CI straddles the threshold — however narrow, or FAILs on evidence an interim look may
      not stop on (``STOPS_ON_FAIL``: the same gate, looked at after every round, would otherwise falsely fail
      more often than at any fixed boot count); a gate without data is no reason to boot;
    - with ``target_pct`` (``--kv-target-ci``), any other delta of a probe's primary metric is settled when
      its CI half-width ≤ ``target_pct``; a delta without a CI is not settled.

    Returns ``(done, widest)``: what still needs a round (an undecided gate first, else the unsettled delta
    with the widest CI; when all are settled, the widest): ``probe``, ``point``, ``metric``, ``arm``,
    ``half_width_pct`` and ``gate`` (the undecided gate's name, with ``boots_to_decide``).
    """
    data = frame(records, specs)
    if "boot" in data:  # as the run folder's loader does: the resampling unit and the block of each row
        data["unit"] = data["arm"] if external else data["boot"]
        data["block"] = [(blocks or {}).get(str(b), 0) for b in data["boot"]]
    parsed = []
    for text in gates:
        try:
            parsed.append(parse(text, arms=arms))
        except GateError:
            continue
    results = evaluate(
        parsed, data, arms, seed=seed, saved=saved, noise=noise, specs=specs, platform=platform, unlike=unlike
    )
    open_gates = [r for r in results if _open(r)]
    gated = {(g.probe, g.metric) for g in parsed}
    judged: list[tuple[bool, float | None, DeltaRow]] = []
    if target_pct is not None:
        for row in delta_rows(data, arms, specs, seed):
            if spec_of(row["probe"], specs).primary_metric != row["metric"] or (row["probe"], row["metric"]) in gated:
                continue
            width = ci_half_width_pct(row)
            judged.append((width is not None and width <= target_pct, width, row))
    if open_gates:
        gate = open_gates[0]
        lo, hi = gate["ci_low"], gate["ci_high"]
        width = (hi - lo) / 2 * 100 if lo is not None and hi is not None else None
        widest: dict[str, object] = {"gate": gate["name"], "half_width_pct": width}
        widest["boots_to_decide"] = gate.get("boots_to_decide")
        widest["open_gates"] = len(open_gates)
        return False, widest
    if not judged:
        return (bool(parsed), None) if parsed else (False, None)
    unsettled = [j for j in judged if not j[0]] or judged
    _, worst_width, worst = max(unsettled, key=lambda j: float("inf") if j[1] is None else j[1])
    widest = {"probe": worst["probe"], "point": worst["point"], "metric": worst["metric"], "arm": worst["arm"]}
    widest["half_width_pct"] = worst_width
    return all(j[0] for j in judged), widest


def _open(result: Mapping[str, object]) -> bool:
    """Whether a gate still needs a round: undecided with data, or failed on evidence that may not stop a run.
    A gate decided over texts, prompts or needles (fidelity, acceptance, retrieval: deterministic across boots) never
    does: another boot
    adds nothing."""
    evidence: Mapping[str, object] = result.get("evidence") or {}  # type: ignore[assignment]
    kind = str(evidence.get("kind", "none"))
    if kind in ("none", "texts", "prompts", "needles"):
        return False
    holds = kind in STOPS_ON_FAIL or bool(evidence.get("beyond_widest"))
    return result["outcome"] == "inconclusive" or (result["outcome"] == "fail" and not holds)
