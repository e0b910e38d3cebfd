"""An in-memory NVML for tests of anything that reads GPUs: ``FakeNvml`` holding ``FakeCard``s.

It satisfies ``pytest_kvcache.gpu.nvml.Nvml``, so every function of ``pytest_kvcache.gpu`` (snapshots,
the sampler, drift, power pinning, ``GpuState``) runs on it without a GPU, a driver or ``pynvml``.
Card values may be constants, zero-argument callables (read on every call: a temperature that rises,
a throttle reason that appears) or None (NVML said NotSupported). The power-limit setter changes the
fake card and records the call in ``FakeNvml.calls``; ``allow_set=False`` makes it refuse as NVML
does for a non-root user.

NVML's total-energy counter (``total_energy_mj``) moves as an H200's does: in steps (``energy_step_s``,
~100 ms there), by default the card's power reading integrated over the fake's clock; ``None`` makes it
NotSupported, as on cards older than Volta. ``PowerTrace`` is a power schedule known exactly — its
``power_mw``/``energy_mj`` are card values and ``joules(t0, t1)`` is the truth a test compares an energy
figure with. See ``docs/testing.md``.
"""

from __future__ import annotations

import bisect
import itertools
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pytest_kvcache.gpu.nvml import MIB, ClockDomain, ClockKind, PcieField

if TYPE_CHECKING:
    from pytest_kvcache.gpu.nvml import Nvml

__all__ = ["FROM_POWER", "FakeCard", "FakeNvml", "PowerTrace"]

#: ``FakeCard.total_energy_mj``'s default: the counter integrates the card's ``power_usage_mw`` over the
#: ``FakeNvml``'s clock, updated every ``energy_step_s``.
FROM_POWER = "from power"
#: How often an H200's total-energy counter moves (driver 580, measured: 14 changes in 1 s idle, ~100 ms).
H200_ENERGY_STEP_S = 0.1


@dataclass
class FakeCard:
    """One fake card. Any value may be a zero-argument callable (read on every call) or None
    (NVML said NotSupported). Power in milliwatts, memory in bytes, as NVML reports them."""

    uuid: str
    name: str = "NVIDIA H200"
    power_limit_mw: Any = 700_000
    power_limit_default_mw: Any = 700_000
    power_limit_enforced_mw: Any = None  # None here: follows power_limit_mw
    power_limit_constraints_mw: Any = (200_000, 700_000)
    power_usage_mw: Any = 80_000
    sm_clock_mhz: Any = 345
    mem_clock_mhz: Any = 2619
    sm_clock_max_mhz: Any = 1980
    mem_clock_max_mhz: Any = 2619
    sm_app_clock_mhz: Any = 1980
    mem_app_clock_mhz: Any = 2619
    sm_app_clock_default_mhz: Any = 1980
    mem_app_clock_default_mhz: Any = 2619
    pstate: Any = 0
    temperature_c: Any = 30
    throttle_mask: Any = 0x1
    memory_used_bytes: Any = 600 * MIB
    memory_total_bytes: Any = 143_771 * MIB
    util_gpu_pct: Any = 0
    util_mem_pct: Any = 0
    pcie_gen: Any = 5
    pcie_width: Any = 16
    pcie_gen_max: Any = 5
    pcie_width_max: Any = 16
    persistence_mode: Any = True
    compute_processes: Any = field(default_factory=list)  # [(pid, used bytes)]
    #: NVML's total-energy counter (mJ): ``FROM_POWER`` follows ``power_usage_mw``; None is NotSupported.
    total_energy_mj: Any = FROM_POWER
    #: How often the counter moves (``FROM_POWER``): its value is the energy up to its last update.
    energy_step_s: float = H200_ENERGY_STEP_S

    def get(self, key: str) -> Any:
        value = getattr(self, key)
        return value() if callable(value) else value


class FakeNvml:
    """An in-memory NVML for tests: configurable cards, recorded setter calls, no hardware.

    ``allow_set=False`` makes the setter raise PermissionError, as NVML does for a non-root user;
    ``p2p`` maps ``(index_a, index_b)`` to an NVML P2P status code (default 0, ``ok``).
    """

    def __init__(
        self,
        cards: Sequence[FakeCard] | None = None,
        *,
        driver_version: str | None = "570.133.20",
        cuda_driver_version: int | None = 12080,
        allow_set: bool = True,
        p2p: Mapping[tuple[int, int], int | None] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.cards = list(cards) if cards is not None else [FakeCard(uuid="GPU-00000000-fake-0000-0000-000000000000")]
        self._driver_version = driver_version
        self._cuda_driver_version = cuda_driver_version
        self.allow_set = allow_set
        self.p2p = dict(p2p or {})
        self.errors: dict[str, str] = {}
        self.calls: list[tuple[str, int, int]] = []
        self.closed = False
        self.clock = clock
        self._energy: dict[int, tuple[float, float]] = {}  # card index → (last update, mJ up to it)

    def _card(self, index: int) -> FakeCard:
        return self.cards[index]

    def device_count(self) -> int:
        return len(self.cards)

    def uuid(self, index: int) -> str | None:
        return self._card(index).uuid

    def name(self, index: int) -> str | None:
        return str(self._card(index).get("name"))

    def driver_version(self) -> str | None:
        return self._driver_version

    def cuda_driver_version(self) -> int | None:
        return self._cuda_driver_version

    def power_limit_mw(self, index: int) -> int | None:
        value = self._card(index).get("power_limit_mw")
        return None if value is None else int(value)

    def power_limit_default_mw(self, index: int) -> int | None:
        value = self._card(index).get("power_limit_default_mw")
        return None if value is None else int(value)

    def power_limit_enforced_mw(self, index: int) -> int | None:
        card = self._card(index)
        value = card.get("power_limit_enforced_mw")
        if value is None:
            value = card.get("power_limit_mw")
        return None if value is None else int(value)

    def power_limit_constraints_mw(self, index: int) -> tuple[int, int] | None:
        value = self._card(index).get("power_limit_constraints_mw")
        return None if value is None else (int(value[0]), int(value[1]))

    def power_usage_mw(self, index: int) -> int | None:
        value = self._card(index).get("power_usage_mw")
        return None if value is None else int(value)

    def total_energy_mj(self, index: int) -> int | None:
        """The card's counter. ``FROM_POWER``: every ``energy_step_s`` boundary passed since the last update
        adds the power read now over those steps (exact for a constant power; a power that changes between
        reads counts from the read that sees it), so the value moves in steps as an H200's does."""
        card = self._card(index)
        value = card.total_energy_mj
        if value is None:
            self.errors["nvmlDeviceGetTotalEnergyConsumption"] = "NVMLError_NotSupported: Not Supported"
            return None
        if value != FROM_POWER:
            found = card.get("total_energy_mj")
            return None if found is None else int(found)
        now = self.clock()
        last, energy = self._energy.setdefault(index, (now, 0.0))
        steps = math.floor((now - last) / card.energy_step_s)
        if steps > 0:
            power = self.power_usage_mw(index) or 0
            energy += power * steps * card.energy_step_s  # mW × s = mJ
            self._energy[index] = (last + steps * card.energy_step_s, energy)
        return int(energy)

    def clock_mhz(self, index: int, domain: ClockDomain, kind: ClockKind) -> int | None:
        key = {
            "current": f"{domain}_clock_mhz",
            "max": f"{domain}_clock_max_mhz",
            "app": f"{domain}_app_clock_mhz",
            "app_default": f"{domain}_app_clock_default_mhz",
        }[kind]
        value = self._card(index).get(key)
        return None if value is None else int(value)

    def pstate(self, index: int) -> int | None:
        return self._card(index).get("pstate")  # type: ignore[no-any-return]

    def temperature_c(self, index: int) -> int | None:
        return self._card(index).get("temperature_c")  # type: ignore[no-any-return]

    def throttle_mask(self, index: int) -> int | None:
        return self._card(index).get("throttle_mask")  # type: ignore[no-any-return]

    def memory_bytes(self, index: int) -> tuple[int, int] | None:
        card = self._card(index)
        used, total = card.get("memory_used_bytes"), card.get("memory_total_bytes")
        return None if used is None or total is None else (int(used), int(total))

    def utilization_pct(self, index: int) -> tuple[int, int] | None:
        card = self._card(index)
        gpu, mem = card.get("util_gpu_pct"), card.get("util_mem_pct")
        return None if gpu is None or mem is None else (int(gpu), int(mem))

    def pcie_link(self, index: int, which: PcieField) -> int | None:
        return self._card(index).get(f"pcie_{which}")  # type: ignore[no-any-return]

    def persistence_mode(self, index: int) -> bool | None:
        return self._card(index).get("persistence_mode")  # type: ignore[no-any-return]

    def compute_processes(self, index: int) -> list[tuple[int, int | None]] | None:
        procs = self._card(index).get("compute_processes")
        return None if procs is None else [(int(pid), used) for pid, used in procs]

    def p2p_read_status(self, index_a: int, index_b: int) -> int | None:
        return self.p2p.get((index_a, index_b), 0)

    def set_power_limit_mw(self, index: int, limit_mw: int) -> None:
        self.calls.append(("set_power_limit_mw", index, limit_mw))
        if not self.allow_set:
            raise PermissionError("Insufficient Permissions")
        self._card(index).power_limit_mw = limit_mw

    def shutdown(self) -> None:
        self.closed = True


@dataclass
class PowerTrace:
    """A card's power over time, known exactly: a test's ground truth for energy.

    ``levels`` are ``(start unix s, watts)`` in time order; the power holds each level until the next starts
    (before the first, the first level's). Hand ``power_mw`` and ``energy_mj`` to a ``FakeCard``
    (``power_usage_mw=trace.power_mw, total_energy_mj=trace.energy_mj``): the counter then reads what an
    H200's does — the exact energy since ``levels[0]``'s start up to its last update, updating every
    ``step_s`` — and ``joules(t0, t1)`` is the exact energy of any span, to compare a measured figure with.
    """

    levels: Sequence[tuple[float, float]]
    clock: Callable[[], float] = time.time
    step_s: float = H200_ENERGY_STEP_S
    base_mj: int = 1_000_000_000  # the counter counts from the driver's load, long before the trace

    def __post_init__(self) -> None:
        if not self.levels:
            raise ValueError("a power trace needs at least one (start, watts) level")
        starts = [t for t, _ in self.levels]
        if starts != sorted(starts):
            raise ValueError("power trace levels must be in time order")

    @property
    def start(self) -> float:
        return self.levels[0][0]

    def watts_at(self, t: float) -> float:
        i = bisect.bisect_right([s for s, _ in self.levels], t) - 1
        return self.levels[max(i, 0)][1]

    def joules(self, t0: float, t1: float) -> float:
        """The exact energy from ``t0`` to ``t1`` (J)."""
        if t1 <= t0:
            return 0.0
        edges = [t0, *(s for s, _ in self.levels if t0 < s < t1), t1]
        return math.fsum(self.watts_at(a) * (b - a) for a, b in itertools.pairwise(edges))

    def power_mw(self) -> int:
        return round(self.watts_at(self.clock()) * 1000)

    def energy_mj(self) -> int:
        now = self.clock()
        updated = self.start + math.floor((now - self.start) / self.step_s) * self.step_s
        return self.base_mj + round(self.joules(self.start, max(updated, self.start)) * 1000)


if TYPE_CHECKING:  # the fake satisfies the seam
    _fake: Nvml = FakeNvml()
