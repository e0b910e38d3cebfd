"""``report["compare"]``: each delta against a stored run's (``--kv-compare``; written when the run is judged, not
by the build), in report.md, report.html and the terminal."""

from __future__ import annotations

from pytest_kvcache.report.outputs import htmlpage, md_verdict, terminal
from pytest_kvcache.report.part import ReportPart

#: its place in each output
PART = ReportPart(
    markdown=(180, md_verdict.render_compare),
    html=(90, htmlpage.compare_tables),
    terminal=(100, terminal.compare_terminal),
)
