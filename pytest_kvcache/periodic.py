"""One loop for the run's samplers (GPU, host CPU): call a step on a fixed phase until stopped."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable


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
