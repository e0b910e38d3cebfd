"""One report pipeline, for the end of a run, ``--kv-rerender`` and ``kvcache-report`` alike:

    load (the run folder, once) → build (a pure function) → judge (noise, stored run, gates)
        → write (one writer per format) → exit code (``judge.exit_code``)

A stored run that cannot be read, or a gate that does not fit the run, is a :class:`ReportInputError`
(exit 4). Anything else that goes wrong while building or writing is caught here and carried in
:attr:`Outcome.error` (exit 3) — the gates already judged stay judged, and nothing passes silently.
"""

from __future__ import annotations

import shutil
import traceback
from dataclasses import dataclass, field, replace
from pathlib import Path

from pytest_kvcache.model import Report
from pytest_kvcache.report.gates import GateError
from pytest_kvcache.report.judge import Judgement, exit_code
from pytest_kvcache.report.load import RunData, RunFolderError, load, read_meta
from pytest_kvcache.report.options import ReportOptions
from pytest_kvcache.store.record import read_vcs, run_row, stamp_vcs


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


def produce(run: Path, options: ReportOptions, *, record: bool = True) -> Outcome:
    """Build, judge and write the report of one run folder.

    Raises :class:`ReportInputError` for unreadable folders and bad gates; every other failure is in
    ``Outcome.error`` with the report's exit code 3. With ``record`` (the end of a run), the run's row is
    added to the history of the run store its settings name (``--kv-store``); a store that cannot take it
    is a warning, never a failed run. A baseline (``save_as``) goes into that store.
    """
    from pytest_kvcache.report.build import build
    from pytest_kvcache.report.judge import judge
    from pytest_kvcache.report.outputs import write_all

    data, saved, noise = load_inputs(run, options)
    outcome = Outcome(run=run)
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
    from pytest_kvcache import store

    location = data.settings.get("store")
    location = location if isinstance(location, str) and location else None
    if record and location is not None:
        try:
            vcs = stamp_vcs(run, Path(str(data.meta.get("cwd") or Path.cwd())))
        except OSError as exc:
            vcs = read_vcs(run)
            outcome.messages.append(f"warning: could not write {run / 'vcs.json'}: {exc}")
    if options.save_as is not None:
        try:
            if location is not None:
                with store.open_store(location) as opened:
                    saved_at = opened.save_baseline(options.save_as.name, run)
            else:
                _store(run, options.save_as)
                saved_at = options.save_as
        except (OSError, store.StoreError) as exc:
            outcome.error = f"could not store the run as baseline {options.save_as.name}: {exc}"
            return outcome
        outcome.messages.append(f"stored this run as baseline {options.save_as.name} ({saved_at})")
    if record and location is not None:
        try:
            with store.open_store(location) as opened:
                opened.add_run(run_row(data, outcome.report, vcs))
        except (OSError, store.StoreError) as exc:
            outcome.messages.append(f"warning: this run is not in the history of the run store: {exc}")
    return outcome


def _store(run: Path, save_as: Path) -> None:
    if save_as.exists():
        shutil.rmtree(save_as)
    save_as.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(run, save_as, symlinks=True)


def _one_line(exc: BaseException) -> str:
    """``ValueError: … (at report/outputs/markdown.py:120)``: the cause and where, on one line."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = ""
    if frames:
        last = frames[-1]
        where = f" (at {Path(last.filename).name}:{last.lineno})"
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}{where}" if text else f"{type(exc).__name__}{where}"


def stored_noise_run(run: Path, options: ReportOptions) -> ReportOptions:
    """A re-render without ``--kv-noise`` is judged against the A/A run the run itself named, when that
    stored run is still there (``run.json``'s settings); a vanished one is a usage error."""
    try:
        meta = read_meta(run)
    except RunFolderError:
        return options  # produce() reports the folder's problem
    settings = meta.get("settings") or {}
    name, root, location = settings.get("noise"), settings.get("report_dir"), settings.get("store")
    if not name or not isinstance(root, str):
        return options
    noise = Path(root).parent / "baselines" / str(name)
    if isinstance(location, str) and location:
        from pytest_kvcache import store

        try:
            with store.open_store(location) as opened:
                noise = opened.baseline(str(name)) or store.baselines_dir_of(location) / str(name)
        except store.StoreError as exc:
            raise ReportInputError(f"{run} was judged against the A/A run {name!r} in a store: {exc}") from None
    if not (noise / "run.json").is_file():
        raise ReportInputError(f"{run} was judged against the A/A run {name!r}, which is gone ({noise})")
    return replace(options, noise=noise)


__all__ = ["Outcome", "ReportInputError", "ReportOptions", "load_inputs", "produce", "stored_noise_run"]
