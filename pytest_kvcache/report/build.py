"""The report's content as a pure function of a loaded run folder: :func:`build` walks the report's sections
(each report part's section, :func:`pytest_kvcache.report.part.ordered`, in ``report.json``'s key order) and merges
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

from pytest_kvcache.model.report import Report
from pytest_kvcache.report.load import RunData
from pytest_kvcache.report.part import ordered
from pytest_kvcache.report.sections import context


def build(run: RunData, allow_diff: Sequence[str] = ()) -> Report:
    """The report of one loaded run folder (``report.json``'s content, before judging). ``allow_diff`` adds
    to the run's own ``--kv-allow-diff`` keys."""
    ctx = context.BuildContext(run, allow_diff)
    report: dict[str, Any] = {}
    for section in ordered("json"):
        report.update(ctx.of(section))
    return cast(Report, report)
