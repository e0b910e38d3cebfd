"""The pacer: one thread sends the chunks of every stream in flight on its absolute deadline (it sleeps until
0.2 ms before the earliest, then spins to it), so 32 streams at sub-millisecond spacing cost one thread."""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections.abc import Generator

from pytest_kvcache.selfcheck.schedule import Outcome

_SPIN_S = 0.0002  # sleep until this long before a deadline, then spin (measured: docs/performance.md)


_POLL_S = 0.05  # serve_forever's poll interval: bounds how long close() waits for the accept loop


class _Aborted(Exception):
    """The server is closing: stop the response where it stands."""


class _Job:
    """One stream handed to the `_Pacer`: its steps, and how it ended."""

    def __init__(self, steps: Generator[float, None, Outcome]) -> None:
        self.steps = steps
        self.done = threading.Event()
        self.outcome: Outcome = "aborted"
        self.error: BaseException | None = None

    def finish(self, outcome: Outcome | None = None, error: BaseException | None = None) -> None:
        if outcome is not None:
            self.outcome = outcome
        self.error = error
        self.done.set()


class _Pacer:
    """One thread that sends the chunks of every stream in flight, each on its deadline.

    A thread per stream that sleeps and then spins to each deadline (the first design) costs a core's worth
    of spinning once a few dozen streams run at sub-millisecond spacing, and that core is taken from the
    client being measured. Here one thread keeps the deadlines in a heap, sleeps on a condition until
    `_SPIN_S` before the earliest, yields the GIL in a short spin to it, and then writes every frame that is
    due. A late deadline (the machine was busy) is sent at once; the send time is recorded either way.

    Writes block: a client that stops reading long enough to fill its socket buffers (hundreds of KB on
    loopback) holds up every stream until it reads again or goes away -- the calibrated stream is for
    clients that read.
    """

    def __init__(self, closing: threading.Event, name: str) -> None:
        self._closing = closing
        self._heap: list[tuple[float, int, _Job]] = []
        self._order = itertools.count()
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, job: _Job, deadline: float) -> None:
        with self._cond:
            if self._closing.is_set():
                job.finish(error=_Aborted())
                return
            heapq.heappush(self._heap, (deadline, next(self._order), job))
            if self._heap[0][2] is job:
                self._cond.notify()

    def wake(self) -> None:
        """Make the thread notice `closing`."""
        with self._cond:
            self._cond.notify()

    def join(self, timeout_s: float) -> None:
        self._thread.join(timeout_s)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._closing.is_set():
                    if not self._heap:
                        self._cond.wait(_POLL_S)
                        continue
                    remaining = self._heap[0][0] - time.perf_counter()
                    if remaining <= _SPIN_S:
                        break
                    self._cond.wait(remaining - _SPIN_S)
                if self._closing.is_set():
                    pending = [job for _, _, job in self._heap]
                    self._heap.clear()
                    for job in pending:
                        job.steps.close()
                        job.finish(error=_Aborted())
                    return
                deadline = self._heap[0][0]
            while time.perf_counter() < deadline:
                time.sleep(0)  # spin, but let the connection threads have the GIL
            with self._cond:
                now = time.perf_counter()
                due: list[_Job] = []
                while self._heap and self._heap[0][0] <= now:
                    due.append(heapq.heappop(self._heap)[2])
            for job in due:
                self._step(job)

    def _step(self, job: _Job) -> None:
        try:
            deadline = job.steps.send(None)
        except StopIteration as stop:
            job.finish(outcome=stop.value)
        except BaseException as exc:  # handed to the connection thread, which raises it
            job.finish(error=exc)
        else:
            self.submit(job, deadline)
