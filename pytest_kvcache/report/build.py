"""The report's content as a pure function of a loaded run folder: :func:`build` walks the report's sections
(:data:`pytest_kvcache.report.sections.SECTIONS`, one module each, in ``report.json``'s key order) and merges
what each adds — summary, deltas with CIs, crossovers, verdicts, boots, confounds, agreement, agentic
growth, speculative decoding, fidelity, energy, capacity, failures.

``build(run)`` reads nothing itself: :func:`pytest_kvcache.report.load.load` read the folder once. The
bootstrap is seeded with the run's ``--kv-seed``, so the same folder always yields the same report.

The comparison statistics are :mod:`pytest_kvcache.report.comparison`, the adaptive rounds' check
:mod:`pytest_kvcache.report.rounds`, the verdict prose :mod:`pytest_kvcache.report.verdicts`; their names
are re-exported here, where callers have imported them from.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

from pytest_kvcache.model import Report
from pytest_kvcache.report import sections
from pytest_kvcache.report.comparison import ci_half_width_pct as ci_half_width_pct
from pytest_kvcache.report.comparison import crossover_rows as crossover_rows
from pytest_kvcache.report.comparison import delta_rows as delta_rows
from pytest_kvcache.report.comparison import summary_rows as summary_rows
from pytest_kvcache.report.load import RunData
from pytest_kvcache.report.rounds import rounds_check as rounds_check
from pytest_kvcache.report.sections.agentic import agentic_section as agentic_section
from pytest_kvcache.report.sections.agreement import agreement_report as agreement_report
from pytest_kvcache.report.sections.arms import missing_evidence_notes as missing_evidence_notes
from pytest_kvcache.report.sections.boots import boot_results as boot_results
from pytest_kvcache.report.sections.ci import adaptive_text as adaptive_text
from pytest_kvcache.report.sections.ci import ci_statement as ci_statement
from pytest_kvcache.report.sections.client import client_load_report as client_load_report
from pytest_kvcache.report.sections.client import measured_itl_s as measured_itl_s
from pytest_kvcache.report.sections.client import self_check_report as self_check_report
from pytest_kvcache.report.sections.compile_cache import compile_cache_lines as compile_cache_lines
from pytest_kvcache.report.sections.confounds import confound_report as confound_report
from pytest_kvcache.report.sections.entries import arm_entries as arm_entries
from pytest_kvcache.report.sections.entries import block_entries as block_entries
from pytest_kvcache.report.sections.entries import boot_entries as boot_entries
from pytest_kvcache.report.sections.flags import flag_summary as flag_summary
from pytest_kvcache.report.sections.gpu import gpu_summary as gpu_summary
from pytest_kvcache.report.sections.notes import host_cpu_note as host_cpu_note
from pytest_kvcache.report.sections.spec_decode import spec_decode_section as spec_decode_section
from pytest_kvcache.report.verdicts import agreement_sentences as agreement_sentences
from pytest_kvcache.report.verdicts import judge_crossovers as judge_crossovers
from pytest_kvcache.report.verdicts import report_verdicts as report_verdicts
from pytest_kvcache.report.verdicts import verdict_sentences as verdict_sentences


def build(run: RunData, allow_diff: Sequence[str] = ()) -> Report:
    """The report of one loaded run folder (``report.json``'s content, before judging). ``allow_diff`` adds
    to the run's own ``--kv-allow-diff`` keys."""
    ctx = sections.BuildContext(run, allow_diff)
    report: dict[str, Any] = {}
    for section in sections.SECTIONS:
        report.update(ctx.of(section))
    return cast(Report, report)
