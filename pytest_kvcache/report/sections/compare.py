"""``report["compare"]``: each delta against a stored run's (``--kv-compare``; written when the run is judged, not
by the build), in report.md, report.html and the terminal."""

from __future__ import annotations

from pytest_kvcache.report.outputs import htmlpage, md_verdict, terminal
from pytest_kvcache.report.part import ReportPart

#: its place in each output
PARTS = (
    ReportPart(
        "compare",
        {"markdown": 180, "html": 90, "terminal": 100},
        markdown=md_verdict.render_compare,
        html=htmlpage.compare_tables,
        terminal=terminal.compare_terminal,
    ),
)
