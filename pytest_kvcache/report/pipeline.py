"""One report pipeline, for the end of a run, ``--kv-rerender`` and ``kvcache-report`` alike:

    load (the run folder, once) → build (a pure function) → judge (noise, stored run, gates)
        → write (one writer per format) → exit code (``judge.exit_code``)

A stored run that cannot be read, or a gate that does not fit the run, is a :class:`ReportInputError`
(exit 4). Anything else that goes wrong while building or writing is caught here and carried in
:attr:`Outcome.error` (exit 3) — the gates already judged stay judged, and nothing passes silently.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass, field
from pathlib import Path

from pytest_kvcache.config.grammars import GateError
from pytest_kvcache.model.options import ReportOptions
from pytest_kvcache.model.report import Report
from pytest_kvcache.report.build import build
from pytest_kvcache.report.judge import Judgement, exit_code, judge
from pytest_kvcache.report.load import RunData, RunFolderError, load
from pytest_kvcache.report.outputs import write_all


class ReportInputError(ValueError):
    """A stored run folder or a gate that the report cannot use: a usage error (exit 4)."""


@dataclass
class Outcome:
    """What the pipeline produced: the report, its judgement, the files written, or the error."""

    run: Path
    report: Report | None = None
    judgement: Judgement | None = None
    written: list[Path] = field(default_factory=list)
    messages: list[str] = field(default_factory=list)
    error: str | None = None
    #: the run as loaded (the finish step reads its settings and frame)
    data: RunData | None = field(default=None, repr=False)

    @property
    def exit_code(self) -> int:
        return exit_code(self.judgement, self.error)

    @property
    def failed_gates(self) -> int:
        return len(self.judgement.failed_gates) if self.judgement else 0

    @property
    def confounded(self) -> bool:
        return bool(self.judgement and self.judgement.confounded)


def load_inputs(run: Path, options: ReportOptions) -> tuple[RunData, RunData | None, RunData | None]:
    """The run and the stored runs it is judged against, each read once; bad ones are usage errors."""
    try:
        data = load(run)
        saved = load(options.compare, "stored run (--kv-compare)") if options.compare else None
        noise = load(options.noise, "A/A run (--kv-noise)") if options.noise else None
    except RunFolderError as exc:
        raise ReportInputError(str(exc)) from None
    return data, saved, noise


def produce(run: Path, options: ReportOptions) -> Outcome:
    """Build, judge and write the report of one run folder.

    Raises :class:`ReportInputError` for unreadable folders and bad gates; every other failure is in
    ``Outcome.error`` with the report's exit code 3. The history row and the baseline save are the next
    step's (:func:`pytest_kvcache.finish.finish`), which the session and ``kvcache-report`` call after this.
    """
    data, saved, noise = load_inputs(run, options)
    outcome = Outcome(run=run, data=data)
    try:
        outcome.report = build(data, options.allow_diff)
        outcome.judgement = judge(
            outcome.report, data, options.gates, inconclusive=options.inconclusive, saved=saved, noise=noise
        )
    except GateError as exc:
        raise ReportInputError(str(exc)) from None
    except Exception as exc:  # a report bug must not pass: the measurements are on disk already
        outcome.error = _one_line(exc)
        return outcome
    outcome.messages += outcome.judgement.messages
    try:
        outcome.written = write_all(run, outcome.report)
    except Exception as exc:
        outcome.error = _one_line(exc)
        return outcome
    return outcome


def _one_line(exc: BaseException) -> str:
    """``ValueError: … (at report/outputs/markdown.py:120)``: the cause and where, on one line."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = ""
    if frames:
        last = frames[-1]
        where = f" (at {Path(last.filename).name}:{last.lineno})"
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}{where}" if text else f"{type(exc).__name__}{where}"
