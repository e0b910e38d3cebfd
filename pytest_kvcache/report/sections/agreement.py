"""``report["agreement"]``: output agreement of greedy token ids from ``agreement.jsonl`` — between each arm
and the baseline, within a boot and across boots of one arm. Its sentences are in
:func:`pytest_kvcache.report.verdicts.agreement_sentences`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

from pytest_kvcache.model.report import AgreementRow, AgreementSection
from pytest_kvcache.probes import agreement
from pytest_kvcache.report.load import RunData
from pytest_kvcache.report.outputs import htmlpage, md_probes
from pytest_kvcache.report.part import ReportPart
from pytest_kvcache.report.sections.context import BuildContext


def agreement_report(run: RunData, arms: Sequence[str]) -> AgreementSection:
    """Output agreement from ``agreement.jsonl``: between each arm and the baseline (same replicate, same
    request index), within a boot (request 0 vs 1) and across boots of one arm (request 0 of each)."""
    records = run.agreement
    if not records:
        return {"rows": [], "notes": []}
    tokens = {
        (r["boot"], r["shape"], r["index"]): agreement.Tokens(tuple(r["ids"]), tuple(r["logprobs"]))
        for r in records
        if r.get("ok")
    }
    notes = sorted({f"{r['boot']} {r['shape']}: {r.get('error')}" for r in records if not r.get("ok")})
    shapes = list(dict.fromkeys(r["shape"] for r in records))
    boots_of: dict[str, dict[int, str]] = {}
    indices = sorted({int(r["index"]) for r in records})
    for r in records:
        boots_of.setdefault(str(r.get("arm")), {})[int(r.get("replicate") or 1)] = r["boot"]
    rows: list[AgreementRow] = []
    Key = tuple[str, str, int]

    def add(kind: str, arm: str, other: str, shape: str, pairs: list[tuple[Key, Key]]) -> None:
        found = [agreement.compare_pair(tokens[a], tokens[b]) for a, b in pairs if a in tokens and b in tokens]
        if found:
            row = cast(AgreementRow, {"kind": kind, "arm": arm, "baseline": other, "shape": shape})
            row.update(cast(AgreementRow, agreement.summarize(found)))
            rows.append(row)

    base = arms[0] if arms else None
    for shape in shapes:
        for arm in arms[1:]:
            if base is None:
                continue
            reps = sorted(set(boots_of.get(base, {})) & set(boots_of.get(arm, {})))
            pairs = [((boots_of[base][r], shape, i), (boots_of[arm][r], shape, i)) for r in reps for i in indices]
            add("between arms", arm, base, shape, pairs)
        for arm in arms:
            boots = [boots_of.get(arm, {})[r] for r in sorted(boots_of.get(arm, {}))]
            if len(indices) >= 2:
                add("within a boot", arm, arm, shape, [((b, shape, indices[0]), (b, shape, indices[1])) for b in boots])
            if len(boots) >= 2:
                add("across boots", arm, arm, shape, [((boots[0], shape, 0), (b, shape, 0)) for b in boots[1:]])
    return {"rows": rows, "notes": notes}


def section(run: RunData, ctx: BuildContext) -> dict[str, Any]:
    return {"agreement": agreement_report(run, ctx.arms)}


PART = ReportPart(json=(80, section), markdown=(130, md_probes.render_agreement), html=(70, htmlpage.agreement_tables))
