"""``Sampler``: a background thread appending power, clocks, temperature and throttle reasons of every
card to ``gpu.jsonl``; ``Sampler.window()`` aggregates a request's time span (``aggregate()``), which
``pytest_kvcache.gpu.drift`` turns into flags. Plain Python: no pytest, no server access."""

from __future__ import annotations

import dataclasses
import json
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Self

from pytest_kvcache.gpu.nvml import _mib, _watts, throttle_reason_names
from pytest_kvcache.periodic import Looping, every

if TYPE_CHECKING:
    from pytest_kvcache.gpu.cards import CardRef
    from pytest_kvcache.gpu.nvml import Nvml


@dataclass(frozen=True, slots=True)
class GpuSample:
    """One reading of one card by the sampler (one ``gpu.jsonl`` line)."""

    t_unix_s: float
    card: str
    index: int
    power_w: float | None
    power_limit_w: float | None
    sm_clock_mhz: int | None
    mem_clock_mhz: int | None
    temp_c: int | None
    util_gpu_pct: int | None
    util_mem_pct: int | None
    memory_used_mib: int | None
    throttle_reasons: tuple[str, ...] | None

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["throttle_reasons"] = None if self.throttle_reasons is None else list(self.throttle_reasons)
        return data


def read_sample(nvml: Nvml, card: CardRef, t_unix_s: float) -> GpuSample:
    memory = nvml.memory_bytes(card.index)
    util = nvml.utilization_pct(card.index)
    reasons = throttle_reason_names(nvml.throttle_mask(card.index))
    return GpuSample(
        t_unix_s=t_unix_s,
        card=card.uuid,
        index=card.index,
        power_w=_watts(nvml.power_usage_mw(card.index)),
        power_limit_w=_watts(nvml.power_limit_mw(card.index)),
        sm_clock_mhz=nvml.clock_mhz(card.index, "sm", "current"),
        mem_clock_mhz=nvml.clock_mhz(card.index, "mem", "current"),
        temp_c=nvml.temperature_c(card.index),
        util_gpu_pct=util[0] if util else None,
        util_mem_pct=util[1] if util else None,
        memory_used_mib=_mib(memory[0]) if memory else None,
        throttle_reasons=None if reasons is None else tuple(reasons),
    )


def aggregate(samples: Sequence[GpuSample]) -> dict[str, Any]:
    """``max_temp_c``, ``min_sm_clock_mhz``, ``mean_power_w``, ``max_power_w``,
    ``throttle_reasons_seen``, ``power_limit_changed`` and ``samples`` over some samples."""
    temps = [s.temp_c for s in samples if s.temp_c is not None]
    clocks = [s.sm_clock_mhz for s in samples if s.sm_clock_mhz is not None]
    powers = [s.power_w for s in samples if s.power_w is not None]
    reasons = sorted({r for s in samples for r in s.throttle_reasons or ()})
    by_card: dict[str, set[float]] = {}
    for s in samples:
        if s.power_limit_w is not None:
            by_card.setdefault(s.card, set()).add(s.power_limit_w)
    changed = any(len(limits) > 1 for limits in by_card.values())
    return {
        "max_temp_c": max(temps) if temps else None,
        "min_sm_clock_mhz": min(clocks) if clocks else None,
        "mean_power_w": math.fsum(powers) / len(powers) if powers else None,
        "max_power_w": max(powers) if powers else None,
        "throttle_reasons_seen": reasons,
        "power_limit_changed": changed,
        "samples": len(samples),
    }


class CardThread(Looping):
    """What the GPU sampler and the energy meter share: ``nvml`` read for ``cards`` ``hz`` times a second (``HZ``
    unless given) on a thread (``kvcache-NAME``) stopped by ``_stop``, appending to a file of its own (``path``;
    ``_fh``, guarded by ``_lock``); ``_setup`` adds what a subclass holds besides. ``start`` runs the subclass's
    ``_prepare`` first, in the caller's thread, so what cannot work fails there (the file cannot be written); it
    says whether a thread is wanted at all. ``stop`` is idempotent; either is a context manager."""

    NAME: str
    HZ: float

    def __init__(
        self,
        nvml: Nvml,
        cards: Sequence[CardRef],
        path: Path | None = None,
        *,
        hz: float | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        hz = self.HZ if hz is None else hz
        if hz <= 0:
            raise ValueError(f"{self.NAME}: its rate must be positive, got {hz!r} Hz")
        self.nvml = nvml
        self.cards = list(cards)
        self.path = path
        self.hz = hz
        self.clock = clock
        self.errors = 0
        self.last_error: str | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._fh: IO[str] | None = None
        self._setup()

    def _setup(self) -> None:
        raise NotImplementedError

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


class Sampler(CardThread):
    """A background thread reading every card ``hz`` times a second into memory and ``path``.

    Each reading is one JSON line (``GpuSample.to_dict()``), appended and flushed as it is taken.
    ``window()`` aggregates a time span; ``sample_once()`` takes a reading on the caller's thread
    (the thread calls it too; usable without ``start()``). ``stop()`` joins the thread and closes
    the file; it is idempotent. Samples are also kept in memory (about 200 bytes each) for ``window()``.
    """

    NAME = "gpu-sampler"
    HZ = 4.0

    def _setup(self) -> None:
        self._samples: list[GpuSample] = []

    def _prepare(self) -> bool:
        with self._lock:
            self._open()
        return True

    def _open(self) -> None:
        """Open ``path`` for appending (caller holds the lock)."""
        if self._fh is None and self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fh = self.path.open("a", encoding="utf-8")

    def _run(self) -> None:
        every(1.0 / self.hz, self._stop, self.sample_once, self._failed)

    def sample_once(self) -> list[GpuSample]:
        """Read every card once, keep and write the readings."""
        t = self.clock()
        batch = [read_sample(self.nvml, card, t) for card in self.cards]
        with self._lock:
            self._samples.extend(batch)
            self._open()
            if self._fh is not None:
                for sample in batch:
                    self._fh.write(json.dumps(sample.to_dict(), separators=(",", ":")) + "\n")
                self._fh.flush()
        return batch

    def samples(self) -> list[GpuSample]:
        with self._lock:
            return list(self._samples)

    def window(self, t0_unix_s: float, t1_unix_s: float, cards: Sequence[CardRef] | None = None) -> dict[str, Any]:
        """Aggregate the samples of ``cards`` (default: every sampled card) taken in ``[t0, t1]``: overall
        and per card (UUID → same keys).

        ``power_limit_changed`` also compares with each card's last reading before ``t0``, so a
        change just before the window starts counts. ``samples`` is 0 when nothing was read
        in the span (a request shorter than the sampling interval).
        """
        chosen = list(self.cards) if cards is None else list(cards)
        uuids = {c.uuid for c in chosen}
        with self._lock:
            inside = [s for s in self._samples if t0_unix_s <= s.t_unix_s <= t1_unix_s and s.card in uuids]
            before: dict[str, GpuSample] = {}
            for s in self._samples:
                if s.t_unix_s < t0_unix_s:
                    before[s.card] = s
        result = aggregate(inside)
        per_card: dict[str, dict[str, Any]] = {}
        for card in chosen:
            own = [s for s in inside if s.card == card.uuid]
            agg = aggregate(own)
            if card.uuid in before and own:
                agg["power_limit_changed"] = aggregate([before[card.uuid], *own])["power_limit_changed"]
            per_card[card.uuid] = agg
        result["power_limit_changed"] = any(c["power_limit_changed"] for c in per_card.values())
        result.update({"t0_unix_s": t0_unix_s, "t1_unix_s": t1_unix_s, "cards": per_card})
        return result
