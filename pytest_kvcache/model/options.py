"""How a run is judged and stored: the report's inputs besides the run folder. Light (no numpy, no pandas):
the configuration layer builds it from options (``stored.report_options``); plain data at the bottom."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal


@dataclass(frozen=True)
class ReportOptions:
    """How a run is judged and stored — resolved once (:func:`report_options`) for a run and for a
    re-render (``--kv-rerender``, ``kvcache-report``) alike."""

    gates: tuple[str, ...] = ()
    inconclusive: Literal["warn", "fail"] = "warn"
    compare: Path | None = None
    noise: Path | None = None
    allow_diff: tuple[str, ...] = ()
    save_as: Path | None = None
