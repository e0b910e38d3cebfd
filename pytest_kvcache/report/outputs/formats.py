"""The cell formats every writer shares (``report.md``, the terminal, ``report.html``): numbers by metric,
deltas with the interval that decided their verdict, a markdown table, and the probe specs' titles."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pytest_kvcache.metrics import catalogue
from pytest_kvcache.model.base import Json
from pytest_kvcache.model.report import DeltaRow, Report, SavedRow
from pytest_kvcache.probes.registry import ProbeSpec
from pytest_kvcache.report.deciding import deciding, pct_interval, widened


def fmt(value: float | int | None, metric: str) -> str:
    """``value`` in ``metric``'s display format (``metrics.catalogue``)."""
    return catalogue.text(value, metric)


def fmt_delta(row: DeltaRow | SavedRow) -> str:
    """``+28.5% [+2.0, +61.9] better (…); within-boot [+24.0, +32.7]``: the delta, the interval its verdict was
    taken on (``report.deciding``), the verdict, and — where that interval is the within-boot CI widened by a
    band — the within-boot CI itself, labelled."""
    delta = row.get("delta_pct")
    if delta is None:
        return "–"
    lo, hi, _ = deciding(row)
    text = f"{delta:+.1f}%"
    if lo is not None and hi is not None:
        text += f" {pct_interval(lo, hi)}"
    verdict = row.get("verdict")
    if row.get("verdict_note"):
        text += f" ({row['verdict_note']})"
    elif verdict and verdict != "inconclusive":
        text += f" {verdict}" + (f" ({row['provisional']})" if row.get("provisional") else "")
    elif verdict:
        text += " (inconclusive)"
    own_lo, own_hi = row.get("ci_low"), row.get("ci_high")
    if widened(row) and own_lo is not None and own_hi is not None:
        text += f"; within-boot {pct_interval(own_lo, own_hi)}"
    return text


Tone = Literal["plain", "red", "yellow"]


@dataclass(frozen=True)
class Line:
    """A line the terminal prints, and its colour."""

    text: str
    tone: Tone = "plain"


@dataclass
class Cell:
    """One cell of an HTML table: its text and its CSS class (a verdict)."""

    text: str
    cls: str = ""


@dataclass
class Table:
    """One table of the HTML report, as a section hands it to the page."""

    title: str
    header: list[str]
    rows: list[list[Cell]]
    intro: str = ""
    notes: list[str] = field(default_factory=list)


#: A table's column: its header and how a row reads in it.
Column = tuple[str, Callable[[Any], str]]


def columns(rows: Iterable[Any], spec: Sequence[Column]) -> tuple[list[str], list[list[str]]]:
    """The header and body of a table whose columns are ``spec``, one line per row of ``rows``."""
    return [name for name, _ in spec], [[cell(row) for _, cell in spec] for row in rows]


def _md_table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(cells) + " |" for cells in rows]
    return lines


def probe_specs(report: Report) -> dict[str, ProbeSpec]:
    """The probe specs the report was built with (``report["probes"]``), for titles and labels."""
    return {d["name"]: ProbeSpec.from_dict(d) for d in report.get("probes") or []}


def title(report: Report, probe: str) -> str:
    spec = probe_specs(report).get(probe)
    return spec.title if spec else probe


def json_text(value: Json) -> str:
    return "absent" if value is None else str(value)
