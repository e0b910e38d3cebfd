"""``report["spec_decode"]``: speculative-decoding acceptance per arm, probe and point; or "not enabled".

Acceptance is deterministic across boots and across repeats of one prompt (greedy decoding, the same draft
rule): a CI over requests pooled from every boot counts the same figure again and again and is as narrow as it
likes. Its CI replicates over prompts instead: each prompt's requests (every boot, every repeat) are averaged,
and the CI is Student's t over those per-prompt means (``prompts − 1`` df; ``stats.mean_ci_clusters``), none
with fewer than 3 prompts — a short probe's shape is one prompt, repeated.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import zip_longest
from typing import Any, cast

from pytest_kvcache import stats
from pytest_kvcache.model.records import Record
from pytest_kvcache.model.sections import SpecDecodeRow, SpecDecodeSection
from pytest_kvcache.report.load import RunData
from pytest_kvcache.report.outputs import htmlpage, md_probes, terminal
from pytest_kvcache.report.part import ReportPart
from pytest_kvcache.report.points import Specs, point_of, point_sort, spec_of
from pytest_kvcache.report.sections.context import BuildContext

#: What the acceptance CI is over (``ci_basis``).
CI_BASIS = "over prompts"


def prompt_of(record: Record, specs: Specs) -> tuple[object, ...]:
    """The prompt a request sent, within its probe and point, whichever boot sent it: its probe's pairing fields
    (prefill: depth and index; agentic replay: session and turn), else its shape (a short probe repeats one
    prompt)."""
    spec = spec_of(record.get("probe"), specs)
    fields: Mapping[str, object] = record
    if spec.paired_by is not None and (spec.paired_shapes is None or record.get("shape") in spec.paired_shapes):
        return tuple(fields.get(name) for name in spec.paired_by)
    return (record.get("shape"),)


def over_prompts(found: Sequence[Record], specs: Specs) -> tuple[float | None, float | None, float | None, int]:
    """Mean acceptance length over prompts (each prompt's requests averaged first), its t-interval over the
    prompts (``stats.mean_ci_clusters``: none with fewer than 3) and how many prompts there were."""
    per_prompt: dict[tuple[object, ...], list[float]] = {}
    for r in found:
        value = (r.get("metrics") or {}).get("acceptance_length")
        if value is not None:
            per_prompt.setdefault(prompt_of(r, specs), []).append(float(value))
    means = [sum(v) / len(v) for v in per_prompt.values()]
    mean, lo, hi = stats.mean_ci_clusters(means)
    return mean, lo, hi, len(means)


def spec_decode_section(
    records: Sequence[Record], arms: Sequence[str], specs: Specs, config: Mapping[str, str | None], seed: int
) -> SpecDecodeSection:
    """Speculative-decoding acceptance per arm, probe and point from the per-request ``/metrics`` deltas
    (measured requests that drafted), with the mean acceptance length's CI over prompts; or "not enabled".
    (``seed`` is kept for callers: the interval is exact arithmetic.)"""
    groups: dict[tuple[str, str, str], list[Record]] = {}
    for r in records:
        engine = r.get("engine") or {}
        if r.get("phase") != "measured" or not r.get("ok") or not engine.get("spec_drafts"):
            continue
        key = (str(r.get("arm")), str(r.get("probe")), point_of(r, specs))
        groups.setdefault(key, []).append(r)
    rows: list[SpecDecodeRow] = []
    order = {arm: i for i, arm in enumerate(arms)}
    for (arm, probe, point), found in sorted(
        groups.items(),
        key=lambda kv: (order.get(kv[0][0], 99), spec_of(kv[0][1], specs).order, kv[0][1], point_sort(kv[0][2])),
    ):
        engines = [r.get("engine") or {} for r in found]
        drafts = sum(int(cast(int, e.get("spec_drafts") or 0)) for e in engines)
        drafted = sum(int(cast(int, e.get("spec_draft_tokens") or 0)) for e in engines)
        accepted = sum(int(cast(int, e.get("spec_accepted_tokens") or 0)) for e in engines)
        per_position = (cast(list[int], e.get("spec_accepted_per_position") or []) for e in engines)
        by_position = [sum(int(n) for n in column) for column in zip_longest(*per_position, fillvalue=0)]
        mean, lo, hi, prompts = over_prompts(found, specs)
        rows.append(
            {
                "arm": arm,
                "probe": probe,
                "point": point,
                "requests": len(found),
                "drafts": drafts,
                "drafted": drafted,
                "accepted": accepted,
                "acceptance_pct": 100 * accepted / drafted if drafted else 0.0,
                "acceptance_length": 1 + accepted / drafts,
                "acceptance_length_mean": mean,
                "ci_low": lo,
                "ci_high": hi,
                "prompts": prompts,
                "ci_basis": CI_BASIS,
                "ci_df": prompts - 1 if lo is not None else None,
                "no_ci": (
                    f"fewer than {stats.MIN_CLUSTERS} prompts ({prompts}): acceptance is deterministic across "
                    "boots and repeats of one prompt, so only prompts replicate it"
                )
                if mean is not None and lo is None
                else None,
                "per_position": [n / drafts for n in by_position],
            }
        )
    parts = []
    for arm in arms:
        mine = [r for r in rows if r["arm"] == arm]
        for probe in dict.fromkeys(r["probe"] for r in mine):
            at = [r for r in mine if r["probe"] == probe]
            drafts = sum(r["drafts"] for r in at)
            drafted, accepted = sum(r["drafted"] for r in at), sum(r["accepted"] for r in at)
            parts.append(
                f"{arm} {probe}: mean acceptance length {1 + accepted / drafts:.2f} "
                f"({accepted}/{drafted} draft tokens accepted, {100 * accepted / drafted if drafted else 0:.1f}%)"
            )
    setup = "; ".join(f"{arm} {config.get(arm) or 'not stated'}" for arm in arms)
    scraped = any(r.get("engine") for r in records if r.get("phase") == "measured")
    line = (
        ("; ".join(parts) + f" — speculation: {setup}")
        if parts
        else "not enabled (no vllm:spec_decode_* counters moved)"
        if scraped
        else "not measured (no request had the engine's vLLM counters read around it)"
    )
    return {"rows": rows, "config": {arm: config.get(arm) for arm in arms}, "line": line}


def section(run: RunData, ctx: BuildContext) -> dict[str, Any]:
    config = {a["name"]: a["resolved"].get("speculative") for a in ctx.entries}
    return {"spec_decode": spec_decode_section(run.records, ctx.arms, ctx.specs, config, ctx.seed)}


PART = ReportPart(
    json=(160, section),
    markdown=(160, md_probes.spec_decode_lines),
    html=(60, htmlpage.spec_decode_tables),
    terminal=(60, terminal.spec_decode_terminal),
)
