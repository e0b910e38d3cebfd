"""``report["gates"]``: each ``--kv-fail`` gate's outcome (judged after the build: ``report.judge``), in report.md and
the terminal."""

from __future__ import annotations

from pytest_kvcache.report.outputs import md_verdict, terminal
from pytest_kvcache.report.part import ReportPart

#: its place in each output
PART = ReportPart(markdown=(220, md_verdict.render_gates), terminal=(120, terminal.gates_terminal))
