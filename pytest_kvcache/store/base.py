"""The run store's interface: named baselines (a full copy of a run folder each) and the history of every
run's row (``store.record.RunRow``). Backends: ``sqlite.py`` (a folder: ``store.sqlite`` beside
``baselines/NAME/``) and ``postgres.py`` (a URL; baselines' files in a table, unpacked into a local cache
when a run compares with one)."""

from __future__ import annotations

import json
import shutil
import tempfile
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, TypedDict, cast

from pytest_kvcache.model.shape import mismatch
from pytest_kvcache.store.record import PointRow, RunRow


class StoreError(ValueError):
    """A store that cannot be opened or used: the message names the store and the problem."""


class BaselineEntry(TypedDict):
    name: str
    run_id: str | None
    saved_unix_s: float


class Store(ABC):
    """One store. ``location`` is what the user gave (a folder or a URL), for messages."""

    location: str

    @property
    @abstractmethod
    def baselines_dir(self) -> Path:
        """The local folder that holds (or caches) every baseline as ``NAME/``."""

    @abstractmethod
    def baseline(self, name: str) -> Path | None:
        """The local folder of baseline ``name`` (unpacked first where the store is remote), or None."""

    @abstractmethod
    def save_baseline(self, name: str, run: Path) -> Path:
        """Store a full copy of the run folder ``run`` as baseline ``name`` (replacing one of that name)."""

    @abstractmethod
    def baselines(self) -> list[BaselineEntry]:
        """Every stored baseline, by name."""

    @abstractmethod
    def add_run(self, row: RunRow) -> None:
        """Add (or replace, by ``run_id``) one run's row of the history."""

    @abstractmethod
    def runs(self) -> list[RunRow]:
        """Every run's row, oldest first (by start time, then record time)."""

    def close(self) -> None:  # noqa: B027 - a backend without a connection has nothing to close
        """Release the connection."""

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def history_row(value: Any, where: str, run_id: object) -> RunRow:
    """One stored history row (JSON text, or JSON as the database gives it back), checked: every key a
    ``RunRow`` has, of its type, so that the history's readers can trust it. A row of another version, or
    edited by hand, is a StoreError naming the store (``where``) and the run."""
    what = f"{where}: the history row of run {run_id}"
    try:
        row = json.loads(value) if isinstance(value, (str, bytes)) else value
    except ValueError as exc:
        raise StoreError(f"{what} is not valid JSON: {exc}") from None
    problem = mismatch(row, RunRow)
    if problem is None:
        missing = sorted(RunRow.__required_keys__ - row.keys()) or [
            f"points[{i}].{key}"
            for i, point in enumerate(row["points"])
            for key in sorted(PointRow.__required_keys__ - point.keys())
        ]
        problem = f"{missing[0]!r} is missing" if missing else None
    if problem is not None:
        raise StoreError(f"{what}: {problem}")
    return cast(RunRow, row)


def copy_folder(run: Path, target: Path) -> None:
    """Copy ``run`` to ``target`` whole, then swap it in by renames: a reader sees the old copy or the new
    one, never half of either."""
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        shutil.copytree(run, staging / "copy", symlinks=True)
        old = staging / "old"
        if target.exists():
            target.rename(old)
        (staging / "copy").rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
