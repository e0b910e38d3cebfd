"""One loop for the run's samplers (GPU, host CPU): call a step on a fixed phase until stopped."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Self


def every(
    interval_s: float,
    stop: threading.Event,
    step: Callable[[], object],
    on_error: Callable[[Exception], None],
    *,
    first_after_s: float = 0.0,
) -> None:
    """Call ``step`` every ``interval_s`` (the first time after ``first_after_s``) until ``stop`` is set.

    A step that raises is reported to ``on_error`` and the loop goes on (a sampler must never take the run
    down); a step that overruns skips the ticks it missed and keeps the phase.
    """
    next_at = time.monotonic() + first_after_s
    while not stop.wait(max(0.0, next_at - time.monotonic())):
        try:
            step()
        except Exception as exc:
            on_error(exc)
        next_at += interval_s
        now = time.monotonic()
        if next_at < now:
            next_at += interval_s * math.ceil((now - next_at) / interval_s)


class Looping:
    """What every sampler shares: its daemon thread (``_thread``) and the errors its steps raised (``errors``
    counted, ``last_error`` the last; the ``on_error`` of :func:`every`)."""

    _thread: threading.Thread | None
    errors: int
    last_error: str | None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _failed(self, exc: Exception) -> None:
        self.errors += 1
        self.last_error = f"{type(exc).__name__}: {exc}"


class FileThread(Looping):
    """What the GPU sampler and the energy meter share besides: a thread (``kvcache-NAME``) stopped by ``_stop``
    that appends to a file of its own (``_fh``, guarded by ``_lock``). ``start`` runs the subclass's ``_prepare``
    first, in the caller's thread, so what cannot work fails there (the file cannot be written); it says whether
    a thread is wanted at all. ``stop`` is idempotent; either is a context manager."""

    NAME: str

    def __init__(self, path: Path | None, *, hz: float, clock: Callable[[], float]) -> None:
        if hz <= 0:
            raise ValueError(f"{self.NAME}: its rate must be positive, got {hz!r} Hz")
        self.path = path
        self.hz = hz
        self.clock = clock
        self.errors = 0
        self.last_error: str | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._fh: IO[str] | None = None

    def _prepare(self) -> bool:
        raise NotImplementedError

    def _run(self) -> None:
        raise NotImplementedError

    def start(self) -> Self:
        if self._thread is not None:
            raise RuntimeError(f"{self.NAME} already started")
        try:
            if self._prepare():
                self._stop.clear()
                self._thread = threading.Thread(target=self._run, name=f"kvcache-{self.NAME}", daemon=True)
                self._thread.start()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join()
        with self._lock:
            if self._fh is not None:
                self._fh.close()
                self._fh = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
