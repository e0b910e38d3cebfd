"""One writer per format, each a function of the built (and judged) :class:`~pytest_kvcache.model.Report`.

``write_all`` writes them into the run folder: ``report.json``, ``report.md``, ``summary.csv``, the PNG
plots and ``report.html``. The terminal summary (``terminal.py``) reads the same report, so everything it
shows is in the files too.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from pytest_kvcache.model import Report


def _writers() -> dict[str, Callable[[Report], str]]:
    from pytest_kvcache.report.outputs import csvfile, jsonfile, markdown

    return {"report.json": jsonfile.render, "report.md": markdown.markdown, "summary.csv": csvfile.render}


def write_all(run: Path, report: Report) -> list[Path]:
    """Write every format into ``run``; returns the paths written, in order."""
    from pytest_kvcache.report.outputs import htmlpage, plots

    written: list[Path] = []
    texts = {name: render(report) for name, render in _writers().items()}
    images = plots.render(report)
    texts["report.html"] = htmlpage.render(report, texts["report.md"], images)
    for name, content in texts.items():
        path = run / name
        path.write_text(content, encoding="utf-8")
        written.append(path)
    for name, png in images.items():
        (run / name).write_bytes(png)
        written.append(run / name)
    return written
