"""The report's sections, in the order of ``report.json``'s keys: :func:`pytest_kvcache.report.build.build`
walks :data:`SECTIONS` and merges what each returns.

A section is a function ``section(run: RunData, ctx: BuildContext) -> dict[str, Any]`` returning the keys it
adds (none, to leave itself out); it reads the loaded run and the build's shared facts (``ctx.deltas``,
``ctx.boots``, …) and may read another section's keys with ``ctx.of(other.section)``. A new section is one
module here and one line below — or, from outside the package, one :func:`register` call.
"""

from __future__ import annotations

from pytest_kvcache.report.sections import (
    agentic,
    agreement,
    arms,
    bands,
    blocks,
    boots,
    capacity,
    ci,
    client,
    comparison,
    compile_cache,
    confounds,
    cost,
    energy,
    failures,
    fidelity,
    flags,
    greedy,
    header,
    kv_plan,
    left_out,
    notes,
    probes,
    retrieval,
    sampling,
    spec_decode,
    verdicts,
)
from pytest_kvcache.report.sections.context import Section

#: Every section of the report, in the order its keys appear in ``report.json``.
SECTIONS: list[Section] = [
    header.section,  # report_version, run_id, status, model, versions
    cost.section,
    arms.section,  # each arm, with its GPU state (sections.gpu)
    boots.section,  # boots, boot_results
    kv_plan.section,  # only where the run planned its KV cache
    compile_cache.section,
    ci.section,
    confounds.section,
    agreement.section,
    sampling.section,
    client.section,  # self_check, client_load
    comparison.section,  # summary, deltas, crossovers
    verdicts.section,
    notes.section,
    probes.section,  # seed, probes
    agentic.section,
    spec_decode.section,
    fidelity.section,
    retrieval.section,
    energy.section,
    greedy.section,
    left_out.section,
    flags.section,
    bands.section,
    failures.section,
    capacity.section,  # only with the capacity probe
    blocks.section,  # only under pytest-xdist
]


def register(section: Section, *, before: Section | None = None) -> Section:
    """Add ``section`` to the report: last, or just before ``before``. Returns it (usable as a decorator)."""
    if section not in SECTIONS:
        SECTIONS.insert(SECTIONS.index(before) if before is not None else len(SECTIONS), section)
    return section
