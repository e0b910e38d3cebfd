"""One writer per format, each a function of the built (and judged) :class:`~pytest_kvcache.model.Report`.

``write_all`` writes them into the run folder: ``report.json``, ``report.md``, ``summary.csv``, the PNG
plots and ``report.html``. The terminal summary (``terminal.py``) reads the same report, so everything it
shows is in the files too.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from pytest_kvcache.model.report import Report


def _writers() -> dict[str, Callable[[Report], str]]:
    from pytest_kvcache.report.outputs import csvfile, jsonfile

    return {"report.json": jsonfile.render, "summary.csv": csvfile.render}


def write_all(run: Path, report: Report) -> list[Path]:
    """Write every format into ``run``; returns the paths written, in order."""
    from pytest_kvcache.report.outputs import htmlpage, markdown, plots

    written: list[Path] = []
    images = plots.render(report)
    writers = _writers()
    texts = {"report.json": writers["report.json"](report), "report.md": markdown.markdown(report, plots=list(images))}
    texts["summary.csv"] = writers["summary.csv"](report)
    texts["report.html"] = htmlpage.render(report, images)
    for name, content in texts.items():
        path = run / name
        path.write_text(content, encoding="utf-8")
        written.append(path)
    for name, png in images.items():
        (run / name).write_bytes(png)
        written.append(run / name)
    return written
