"""``EnergyMeter``: a background thread that reads NVML's total-energy counter of every card often enough to
place the counter's steps in time, and writes each step to ``energy.jsonl``. The report
(``pytest_kvcache.report.energy``) interpolates those steps at each request's window edges.

Why a thread and not a read at each window's edge: the counter moves in steps (about every 100 ms on an H200,
driver 580), so a read at an edge says only what the counter held since its last step — a 12 ms TTFT window
reads 0 mJ. Reading the counter ``hz`` times a second (default 50: every 20 ms) dates each step to within half
a read interval, and nothing runs on the measuring client's hot path: a read is one NVML call per card
(``ctypes`` releases the GIL while it runs), and a line is written only when the counter moved.

``energy.jsonl`` lines (docs/records.md):

* ``{"kind": "meter", "t_unix_s", "hz", "cards": [uuid …]}`` — once, when the meter starts;
* ``{"kind": "unsupported", "t_unix_s", "card", "error"}`` — a card whose counter NVML does not have
  (NotSupported on cards older than Volta): the meter stops reading it, and the report integrates that
  card's power samples (``gpu.jsonl``) instead;
* ``{"t_unix_s", "card", "energy_mj", "read_gap_s"}`` — the counter's value after a step; ``t_unix_s`` is the
  middle of the two reads that saw it change (``read_gap_s`` apart), the step's time to ±``read_gap_s``/2.
  The first reading of a card has ``"first": true`` (its time says nothing of when the counter last moved).

Plain Python: no pytest, no server access.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pytest_kvcache.gpu.nvml import ENERGY_FUNC
from pytest_kvcache.gpu.sampler import CardThread
from pytest_kvcache.periodic import every

if TYPE_CHECKING:
    from pytest_kvcache.gpu.cards import CardRef

#: How often the meter reads each card's counter. 50 Hz dates an H200's ~100 ms steps to ±10 ms; its cost on
#: the measuring client is measured by ``benchmarks/energy_meter.py`` (docs/gpu.md).
ENERGY_HZ = 50.0


@dataclass
class _CardState:
    card: CardRef
    last_mj: int | None = None
    last_t: float | None = None
    supported: bool = True


class EnergyMeter(CardThread):
    """Reads every card's total-energy counter ``hz`` times a second; writes each step to ``path``.

    ``read_once()`` is one pass over the cards (the thread calls it; usable without ``start()``, with a fake
    clock, in tests). ``stop()`` joins the thread and closes the file; it is idempotent. Cards whose counter
    NVML does not have are named once (``unsupported``) and not read again; with none left the thread ends.
    """

    NAME = "energy-meter"
    HZ = ENERGY_HZ

    def _setup(self) -> None:
        self.lines: list[dict[str, Any]] = []  # without a path: the lines, kept in memory (tests)
        self._cards = [_CardState(card) for card in self.cards]
        self._started = False

    @property
    def unsupported(self) -> list[str]:
        """UUIDs of the cards without the counter (known after the first read)."""
        return [s.card.uuid for s in self._cards if not s.supported]

    def _prepare(self) -> bool:
        self._begin()
        self.read_once()  # NotSupported shows at once; no thread for a machine without the counter
        return any(s.supported for s in self._cards)

    def _begin(self) -> None:
        if self._started:
            return
        self._started = True
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fh = self.path.open("a", encoding="utf-8")
        cards = [s.card.uuid for s in self._cards]
        self._write([{"kind": "meter", "t_unix_s": round(self.clock(), 4), "hz": self.hz, "cards": cards}])

    def _run(self) -> None:
        every(1.0 / self.hz, self._stop, self._tick, self._failed, first_after_s=1.0 / self.hz)

    def _tick(self) -> None:
        self.read_once()
        if not any(s.supported for s in self._cards):
            self._stop.set()

    def read_once(self) -> None:
        """Read every card's counter once; write a line for each card whose counter moved."""
        self._begin()
        out: list[dict[str, Any]] = []
        for state in self._cards:
            if not state.supported:
                continue
            value = self.nvml.total_energy_mj(state.card.index)
            t = self.clock()
            if value is None:
                if state.last_mj is None:  # never read: the card has no counter
                    state.supported = False
                    error = self.nvml.errors.get(ENERGY_FUNC) or "no value"
                    out.append(
                        {"kind": "unsupported", "t_unix_s": round(t, 4), "card": state.card.uuid, "error": error}
                    )
                continue  # a failed read of a card that has the counter: the next one brackets the step
            if state.last_mj is None or state.last_t is None:
                out.append({"t_unix_s": round(t, 4), "card": state.card.uuid, "energy_mj": value, "first": True})
            elif value != state.last_mj:
                gap = t - state.last_t
                line = {"t_unix_s": round(state.last_t + gap / 2, 4), "card": state.card.uuid, "energy_mj": value}
                out.append({**line, "read_gap_s": round(gap, 4)})
            state.last_mj, state.last_t = value, t
        if out:
            self._write(out)

    def _write(self, lines: list[dict[str, Any]]) -> None:
        with self._lock:
            if self.path is None:
                self.lines.extend(lines)
            if self._fh is not None:
                for line in lines:
                    self._fh.write(json.dumps(line, separators=(",", ":")) + "\n")
                self._fh.flush()

    def close(self) -> list[str]:
        """Stop; the problems to report (failed reads)."""
        self.stop()
        if self.errors:
            return [f"GPU energy meter: {self.errors} failed reading(s), the last: {self.last_error}"]
        return []
