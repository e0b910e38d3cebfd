"""One feature of the report in every output: a :class:`ReportPart` holds its ``report.json`` section and its
renderers — report.md's lines, report.html's tables and folded evidence, the terminal's lines — each placed by its
own number in that output's order (the outputs order the same features differently: report.json keeps the seed's
keys, report.md reads setup → measurements → verdict, the terminal leads with the boots).

The stock parts are declared by the feature modules under ``report/sections/`` (``PART``, named after its module,
or ``PARTS``), found the way pytest
finds its built-in plugins: by walking the package, the first time an output asks. Each output walks
:func:`ordered`, so none keeps a list to keep in step; a part from outside the package is one :func:`register`
call.
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any, Literal, overload

from pytest_kvcache.model.report import Report
from pytest_kvcache.report.outputs.formats import Line, Table

if TYPE_CHECKING:
    from pytest_kvcache.report.sections.context import Section

Output = Literal["json", "markdown", "html", "folded", "terminal"]
OUTPUTS: tuple[Output, ...] = ("json", "markdown", "html", "folded", "terminal")


@dataclass(frozen=True)
class ReportPart:
    """One feature's share of each output it takes part in: its place there (a number, smaller first; the stock
    parts are 10 apart, so another fits between two) and what renders it."""

    #: a stock part declared alone (``PART``) is named after its module
    name: str = ""
    #: the keys it adds to report.json (``section(run, ctx)``: none, to leave itself out)
    json: tuple[int, Section] | None = None
    #: its report.md lines
    markdown: tuple[int, Callable[[Report], list[str]]] | None = None
    #: its report.html tables, and the evidence folded below them
    html: tuple[int, Callable[[Report], list[Table]]] | None = None
    folded: tuple[int, Callable[[Report], list[dict[str, object]]]] | None = None
    #: its lines at the end of a run, in the terminal
    terminal: tuple[int, Callable[[Report], list[Line]]] | None = None

    def at(self, output: Output) -> tuple[int, Any] | None:
        """Its place in ``output`` and the renderer there (None: it takes no part in it)."""
        placed: tuple[int, Any] | None = getattr(self, output)
        return placed


#: the package whose modules declare the stock parts (found by name: they import this module)
SECTIONS = "pytest_kvcache.report.sections"
_REGISTERED: list[ReportPart] = []


@cache
def _stock() -> tuple[ReportPart, ...]:
    sections = importlib.import_module(SECTIONS)
    found: list[ReportPart] = []
    for module in pkgutil.iter_modules(sections.__path__):
        declared = vars(importlib.import_module(f"{SECTIONS}.{module.name}"))
        found += declared.get("PARTS", ())
        if "PART" in declared:
            found.append(dataclasses.replace(declared["PART"], name=declared["PART"].name or module.name))
    return tuple(found)


def register(part: ReportPart) -> ReportPart:
    """Add ``part`` to the report (a later one of the same name replaces it). Returns it."""
    if not part.name:
        raise ValueError("a registered report part needs a name: ReportPart('mine', …)")
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
    placed = [at for p in parts() if (at := p.at(output)) is not None]
    return [render for _, render in sorted(placed, key=lambda at: at[0])]
