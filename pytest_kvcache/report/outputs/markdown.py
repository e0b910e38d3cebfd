"""``report.md``: the seed-shaped tables of a :class:`~pytest_kvcache.model.Report`, each report part's markdown
renderer walked in its place (:func:`pytest_kvcache.report.part.ordered`); the number formats every other writer
(terminal, HTML) shares are :mod:`pytest_kvcache.report.outputs.formats`. The stock renderers live beside their
tables — the setup (``md_setup``), the measurements (``md_probes``), the verdict and what follows it
(``md_verdict``)."""

from __future__ import annotations

from collections.abc import Sequence

from pytest_kvcache.model.report import Report
from pytest_kvcache.report.part import ordered


def markdown(report: Report, plots: Sequence[str] = ()) -> str:
    """report.md; ``plots`` are the PNG files written beside it (linked at the end)."""
    lines: list[str] = []
    for render in ordered("markdown"):
        lines += render(report)
    if plots:
        lines += ["", "## Plots", ""] + [f"![{name[:-4]}]({name})" for name in plots]
    return "\n".join(lines) + "\n"
