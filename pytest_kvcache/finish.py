"""After the report: the side effects of a finished run, kept out of the report step (which only reads the
run folder and writes its outputs).

- the baseline save (``--kv-save``): the run folder copied into the run store (or the baselines folder);
- the history row (``--kv-store``, at the end of a run only): ``vcs.json`` stamped, the run's row added to
  the run store's history.

The session calls :func:`finish` after ``report.pipeline.produce`` at the end of a run; ``kvcache-report``
calls it with ``record=False`` (a re-render adds no history row). A baseline that cannot be stored is the
run's error (exit 3); a store that cannot take the row is a warning, never a failed run.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from pytest_kvcache import store
from pytest_kvcache.model.options import ReportOptions
from pytest_kvcache.report.pipeline import Outcome
from pytest_kvcache.store.record import Vcs, read_vcs, run_row, stamp_vcs


def finish(outcome: Outcome, options: ReportOptions, *, record: bool = True) -> Outcome:
    """Save the baseline and add the history row of a run whose report was built and written; a report that
    failed (``outcome.error``) finishes nothing. Returns ``outcome`` with its messages (and error) added."""
    data, report = outcome.data, outcome.report
    if data is None or report is None or outcome.error is not None:
        return outcome
    run = outcome.run
    location = data.settings.get("store")
    location = location if isinstance(location, str) and location else None
    vcs: Vcs | None = None
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
                copy_run(run, options.save_as)
                saved_at = options.save_as
        except (OSError, store.StoreError) as exc:
            outcome.error = f"could not store the run as baseline {options.save_as.name}: {exc}"
            return outcome
        outcome.messages.append(f"stored this run as baseline {options.save_as.name} ({saved_at})")
    if vcs is not None and location is not None:
        try:
            with store.open_store(location) as opened:
                opened.add_run(run_row(data, report, vcs))
        except (OSError, store.StoreError) as exc:
            outcome.messages.append(f"warning: this run is not in the history of the run store: {exc}")
    return outcome


def copy_run(run: Path, save_as: Path) -> None:
    """The run folder copied to ``save_as`` (a baseline kept without a run store), replacing what was there."""
    if save_as.exists():
        shutil.rmtree(save_as)
    save_as.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(run, save_as, symlinks=True)
