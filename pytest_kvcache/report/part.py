"""One feature of the report in every output: a :class:`ReportPart` holds its ``report.json`` section and its
renderers — report.md's lines, report.html's tables and folded evidence, the terminal's lines — each placed by its
own number in that output's order (the outputs order the same features differently: report.json keeps the seed's
keys, report.md reads setup → measurements → verdict, the terminal leads with the boots).

The stock parts are declared by the feature modules under ``report/sections/`` (``PARTS``), found the way pytest
finds its built-in plugins: by walking the package, the first time an output asks. Each output walks
:func:`ordered`, so none keeps a list to keep in step; a part from outside the package is one :func:`register`
call.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any, Literal, overload

from pytest_kvcache.model.report import Report
from pytest_kvcache.report.outputs.formats import Line, Table

if TYPE_CHECKING:
    from pytest_kvcache.report.sections.context import Section

Output = Literal["json", "markdown", "html", "folded", "terminal"]
OUTPUTS: tuple[Output, ...] = ("json", "markdown", "html", "folded", "terminal")
_FIELD: Mapping[Output, str] = {"json": "section", "markdown": "markdown", "html": "html", "folded": "folded"}


@dataclass(frozen=True)
class ReportPart:
    """One feature's share of each output, and where it stands there (``at``: output → a number, smaller first;
    the stock parts are 10 apart, so another fits between two)."""

    name: str
    at: Mapping[Output, int]
    #: the keys it adds to report.json (``section(run, ctx)``: none, to leave itself out)
    section: Section | None = None
    #: its report.md lines
    markdown: Callable[[Report], list[str]] | None = None
    #: its report.html tables, and the evidence folded below them
    html: Callable[[Report], list[Table]] | None = None
    folded: Callable[[Report], list[dict[str, object]]] | None = None
    #: its lines at the end of a run, in the terminal
    terminal: Callable[[Report], list[Line]] | None = None

    def __post_init__(self) -> None:
        given = {output for output in OUTPUTS if self.renderer(output) is not None}
        if given != set(self.at):
            raise ValueError(
                f"report part {self.name!r}: place it (at=) in exactly the outputs it renders: "
                f"renders {sorted(given)}, placed in {sorted(self.at)}"
            )

    def renderer(self, output: Output) -> Any:
        return getattr(self, _FIELD.get(output, output))


#: the package whose modules declare the stock parts (found by name: they import this module)
SECTIONS = "pytest_kvcache.report.sections"
_REGISTERED: list[ReportPart] = []


@cache
def _stock() -> tuple[ReportPart, ...]:
    sections = importlib.import_module(SECTIONS)
    found: list[ReportPart] = []
    for module in pkgutil.iter_modules(sections.__path__):
        found += getattr(importlib.import_module(f"{SECTIONS}.{module.name}"), "PARTS", ())
    return tuple(found)


def register(part: ReportPart) -> ReportPart:
    """Add ``part`` to the report (a later one of the same name replaces it). Returns it."""
    unregister(part.name)
    _REGISTERED.append(part)
    return part


def unregister(name: str) -> None:
    """Take a registered part out (a test's own, after the test)."""
    _REGISTERED[:] = [p for p in _REGISTERED if p.name != name]


def parts() -> tuple[ReportPart, ...]:
    """Every part: the stock ones, then the registered ones (which replace a stock one of their name)."""
    mine = {p.name for p in _REGISTERED}
    return (*(p for p in _stock() if p.name not in mine), *_REGISTERED)


@overload
def ordered(output: Literal["json"]) -> list[Section]: ...
@overload
def ordered(output: Literal["markdown"]) -> list[Callable[[Report], list[str]]]: ...
@overload
def ordered(output: Literal["html"]) -> list[Callable[[Report], list[Table]]]: ...
@overload
def ordered(output: Literal["folded"]) -> list[Callable[[Report], list[dict[str, object]]]]: ...
@overload
def ordered(output: Literal["terminal"]) -> list[Callable[[Report], list[Line]]]: ...
def ordered(output: Output) -> list[Any]:
    """The renderers of ``output`` (report.json's: the sections), in their parts' order there."""
    placed = sorted((p for p in parts() if output in p.at), key=lambda p: p.at[output])
    return [p.renderer(output) for p in placed]
