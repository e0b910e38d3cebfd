"""The GPUs through NVML: what they are, what they were doing, and whether a measurement drifted.

* ``open_nvml()`` — the NVML library (``nvidia-ml-py``, imported as ``pynvml``) or None with a reason:
  no library, no driver, no GPU. Everything below then reports "no GPU" instead of failing.
* ``visible_cards()`` — the cards this run uses (``CUDA_VISIBLE_DEVICES`` honoured), by UUID.
* ``snapshot()`` / ``diff()`` — one JSON-ready picture of every visible card before and after a boot.
* ``Sampler`` — a background thread appending power, clocks, temperature and throttle reasons to
  ``gpu.jsonl``; ``window()`` aggregates a request's time span and ``drift()`` turns that into flags
  and an exclusion reason.
* ``parse_power_limit()`` / ``apply_power_limits()`` / ``verify_power_limits()`` /
  ``restore_power_limits()`` — the ``--kv-gpu-power-limit`` pinning (setting needs root).
* ``require_idle()`` / ``settle()`` — refuse a busy card; wait until a card has cooled down.

Every NVML read goes through a backend (``Nvml``): ``RealNvml`` wraps ``pynvml`` and turns every
NVML error (NotSupported, NoPermission, FunctionNotFound …) into ``None`` for that one field;
``FakeNvml`` is the in-memory stand-in the unit tests use. ``docs/gpu.md`` defines every field.

Plain Python: no pytest, no server access.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import math
import os
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Literal, Protocol

ClockDomain = Literal["sm", "mem"]
#: ``current`` the clock now; ``max`` the highest the card can run; ``app`` / ``app_default`` the
#: applications clock target now / by default (``nvidia-smi -ac`` changes the target).
ClockKind = Literal["current", "max", "app", "app_default"]
PcieField = Literal["gen", "width", "gen_max", "width_max"]

#: NVML clocks event (formerly "throttle") reason bits → names. Values from ``nvml.h``; the same in
#: nvidia-ml-py's ``nvmlClocksEventReason*`` and ``nvmlClocksThrottleReason*`` constants.
THROTTLE_REASON_BITS: tuple[tuple[int, str], ...] = (
    (0x0001, "gpu_idle"),
    (0x0002, "applications_clocks_setting"),  # applications clocks or locked clocks (user-defined)
    (0x0004, "sw_power_cap"),
    (0x0008, "hw_slowdown"),
    (0x0010, "sync_boost"),
    (0x0020, "sw_thermal_slowdown"),
    (0x0040, "hw_thermal_slowdown"),
    (0x0080, "hw_power_brake_slowdown"),
    (0x0100, "display_clock_setting"),
    (0x0200, "board_limit"),
    (0x0400, "reliability"),
)

#: ``nvmlDeviceGetP2PStatus`` results → names.
P2P_STATUS = {
    0: "ok",
    1: "chipset_not_supported",
    2: "gpu_not_supported",
    3: "ioh_topology_not_supported",
    4: "disabled_by_regkey",
    5: "not_supported",
    6: "unknown",
}
#: ``NVML_P2P_CAPS_INDEX_READ``. A literal: nvidia-ml-py 13.x defines the constant as the tuple ``(0,)``.
P2P_CAPS_INDEX_READ = 0

NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_CLOCK_SM = 1
NVML_CLOCK_MEM = 2
NVML_TEMPERATURE_GPU = 0
MIB = 1024 * 1024


class GpuError(Exception):
    """A GPU could not be put into (or checked against) the state a run asked for."""


class RootRequiredError(GpuError, PermissionError):
    """NVML refused a setter: changing a power limit needs root (or an admin-enabled capability)."""


def throttle_reason_names(mask: int | None) -> list[str] | None:
    """Decode a clocks event reason bitmask into names (unknown bits as ``unknown_0x…``)."""
    if mask is None:
        return None
    names = [name for bit, name in THROTTLE_REASON_BITS if mask & bit]
    known = 0
    for bit, _ in THROTTLE_REASON_BITS:
        known |= bit
    rest = mask & ~known
    bit = 1
    while rest:
        if rest & bit:
            names.append(f"unknown_{bit:#x}")
            rest &= ~bit
        bit <<= 1
    return names


def format_cuda_version(version: int | None) -> str | None:
    """``12080`` → ``"12.8"`` (NVML's ``nvmlSystemGetCudaDriverVersion`` encoding)."""
    if version is None:
        return None
    return f"{version // 1000}.{(version % 1000) // 10}"


# ---------------------------------------------------------------------------------------- backends


class Nvml(Protocol):
    """The NVML calls this module needs, by NVML device index. Reads return None when unsupported."""

    errors: dict[str, str]

    def device_count(self) -> int: ...
    def uuid(self, index: int) -> str | None: ...
    def name(self, index: int) -> str | None: ...
    def driver_version(self) -> str | None: ...
    def cuda_driver_version(self) -> int | None: ...
    def power_limit_mw(self, index: int) -> int | None: ...
    def power_limit_default_mw(self, index: int) -> int | None: ...
    def power_limit_enforced_mw(self, index: int) -> int | None: ...
    def power_limit_constraints_mw(self, index: int) -> tuple[int, int] | None: ...
    def power_usage_mw(self, index: int) -> int | None: ...
    def clock_mhz(self, index: int, domain: ClockDomain, kind: ClockKind) -> int | None: ...
    def pstate(self, index: int) -> int | None: ...
    def temperature_c(self, index: int) -> int | None: ...
    def throttle_mask(self, index: int) -> int | None: ...
    def memory_bytes(self, index: int) -> tuple[int, int] | None:
        """(used, total) in bytes."""

    def utilization_pct(self, index: int) -> tuple[int, int] | None:
        """(gpu, memory) in percent over NVML's last sample period."""

    def pcie_link(self, index: int, which: PcieField) -> int | None: ...
    def persistence_mode(self, index: int) -> bool | None: ...
    def compute_processes(self, index: int) -> list[tuple[int, int | None]] | None:
        """(pid, used bytes or None) of every compute process on the card."""

    def p2p_read_status(self, index_a: int, index_b: int) -> int | None: ...
    def set_power_limit_mw(self, index: int, limit_mw: int) -> None:
        """Change a card's power limit. Raises PermissionError when not allowed, GpuError otherwise."""

    def shutdown(self) -> None: ...


def _is_missing(exc: BaseException) -> bool:
    """The function does not exist in this driver's NVML (fall back to an older name)."""
    return getattr(exc, "value", None) == NVML_ERROR_FUNCTION_NOT_FOUND or type(exc).__name__ in (
        "NVMLLibraryMismatchError",
        "NVMLError_FunctionNotFound",
    )


class RealNvml:
    """``pynvml`` behind the ``Nvml`` seam. Every read that raises yields None (the error is kept in
    ``errors``, keyed by NVML function name); only the power-limit setter raises.

    ``lib`` is the ``pynvml`` module (or a stand-in with the same names, for tests); the caller has
    already called ``nvmlInit`` — use ``open_nvml()``.
    """

    _CLOCK_FUNCS: Mapping[ClockKind, str] = {
        "current": "nvmlDeviceGetClockInfo",
        "max": "nvmlDeviceGetMaxClockInfo",
        "app": "nvmlDeviceGetApplicationsClock",
        "app_default": "nvmlDeviceGetDefaultApplicationsClock",
    }
    _PCIE_FUNCS: Mapping[PcieField, str] = {
        "gen": "nvmlDeviceGetCurrPcieLinkGeneration",
        "width": "nvmlDeviceGetCurrPcieLinkWidth",
        "gen_max": "nvmlDeviceGetMaxPcieLinkGeneration",
        "width_max": "nvmlDeviceGetMaxPcieLinkWidth",
    }

    def __init__(self, lib: Any) -> None:
        self.lib = lib
        self.errors: dict[str, str] = {}
        self._handles: dict[int, Any] = {}
        self._lock = threading.Lock()
        self._closed = False

    def _call(self, names: str | Sequence[str], *args: Any) -> Any:
        """The first of ``names`` that exists, called with ``args``; None on any error."""
        for name in (names,) if isinstance(names, str) else names:
            fn = getattr(self.lib, name, None)
            if fn is None:
                self.errors[name] = "not in this nvidia-ml-py"
                continue
            try:
                return fn(*args)
            except Exception as exc:  # NVMLError and anything a broken driver throws: never fatal
                self.errors[name] = f"{type(exc).__name__}: {exc}"
                if _is_missing(exc):
                    continue
                return None
        return None

    def _handle(self, index: int) -> Any:
        with self._lock:
            if index not in self._handles:
                handle = self._call("nvmlDeviceGetHandleByIndex", index)
                if handle is None:
                    return None
                self._handles[index] = handle
            return self._handles[index]

    def _dev(self, names: str | Sequence[str], index: int, *args: Any) -> Any:
        handle = self._handle(index)
        if handle is None:
            return None
        return self._call(names, handle, *args)

    @staticmethod
    def _str(value: Any) -> str | None:
        if value is None:
            return None
        return value.decode() if isinstance(value, bytes) else str(value)

    @staticmethod
    def _int(value: Any) -> int | None:
        return None if value is None else int(value)

    def device_count(self) -> int:
        return self._int(self._call("nvmlDeviceGetCount")) or 0

    def uuid(self, index: int) -> str | None:
        return self._str(self._dev("nvmlDeviceGetUUID", index))

    def name(self, index: int) -> str | None:
        return self._str(self._dev("nvmlDeviceGetName", index))

    def driver_version(self) -> str | None:
        return self._str(self._call("nvmlSystemGetDriverVersion"))

    def cuda_driver_version(self) -> int | None:
        return self._int(self._call(("nvmlSystemGetCudaDriverVersion_v2", "nvmlSystemGetCudaDriverVersion")))

    def power_limit_mw(self, index: int) -> int | None:
        return self._int(self._dev("nvmlDeviceGetPowerManagementLimit", index))

    def power_limit_default_mw(self, index: int) -> int | None:
        return self._int(self._dev("nvmlDeviceGetPowerManagementDefaultLimit", index))

    def power_limit_enforced_mw(self, index: int) -> int | None:
        return self._int(self._dev("nvmlDeviceGetEnforcedPowerLimit", index))

    def power_limit_constraints_mw(self, index: int) -> tuple[int, int] | None:
        value = self._dev("nvmlDeviceGetPowerManagementLimitConstraints", index)
        if value is None:
            return None
        low, high = value
        return int(low), int(high)

    def power_usage_mw(self, index: int) -> int | None:
        return self._int(self._dev("nvmlDeviceGetPowerUsage", index))

    def clock_mhz(self, index: int, domain: ClockDomain, kind: ClockKind) -> int | None:
        clock_type = NVML_CLOCK_SM if domain == "sm" else NVML_CLOCK_MEM
        return self._int(self._dev(self._CLOCK_FUNCS[kind], index, clock_type))

    def pstate(self, index: int) -> int | None:
        return self._int(self._dev("nvmlDeviceGetPerformanceState", index))

    def temperature_c(self, index: int) -> int | None:
        return self._int(self._dev("nvmlDeviceGetTemperature", index, NVML_TEMPERATURE_GPU))

    def throttle_mask(self, index: int) -> int | None:
        return self._int(
            self._dev(("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"), index)
        )

    def memory_bytes(self, index: int) -> tuple[int, int] | None:
        info = self._dev("nvmlDeviceGetMemoryInfo", index)
        if info is None:
            return None
        return int(info.used), int(info.total)

    def utilization_pct(self, index: int) -> tuple[int, int] | None:
        rates = self._dev("nvmlDeviceGetUtilizationRates", index)
        if rates is None:
            return None
        return int(rates.gpu), int(rates.memory)

    def pcie_link(self, index: int, which: PcieField) -> int | None:
        return self._int(self._dev(self._PCIE_FUNCS[which], index))

    def persistence_mode(self, index: int) -> bool | None:
        mode = self._dev("nvmlDeviceGetPersistenceMode", index)
        return None if mode is None else bool(mode)

    def compute_processes(self, index: int) -> list[tuple[int, int | None]] | None:
        procs = self._dev(("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetComputeRunningProcesses_v2"), index)
        if procs is None:
            return None
        out: list[tuple[int, int | None]] = []
        for proc in procs:
            used = getattr(proc, "usedGpuMemory", None)
            out.append((int(proc.pid), None if used is None else int(used)))
        return out

    def p2p_read_status(self, index_a: int, index_b: int) -> int | None:
        handle_a, handle_b = self._handle(index_a), self._handle(index_b)
        if handle_a is None or handle_b is None:
            return None
        return self._int(self._call("nvmlDeviceGetP2PStatus", handle_a, handle_b, P2P_CAPS_INDEX_READ))

    def set_power_limit_mw(self, index: int, limit_mw: int) -> None:
        handle = self._handle(index)
        if handle is None:
            raise GpuError(f"GPU index {index}: no NVML handle ({self.errors.get('nvmlDeviceGetHandleByIndex')})")
        try:
            self.lib.nvmlDeviceSetPowerManagementLimit(handle, int(limit_mw))
        except Exception as exc:
            if getattr(exc, "value", None) == NVML_ERROR_NO_PERMISSION:
                raise PermissionError(f"nvmlDeviceSetPowerManagementLimit: {exc}") from exc
            raise GpuError(
                f"GPU index {index}: nvmlDeviceSetPowerManagementLimit({limit_mw} mW) failed: {exc}"
            ) from exc

    def shutdown(self) -> None:
        if not self._closed:
            self._closed = True
            self._call("nvmlShutdown")


_open_error: str | None = None


def open_nvml(lib: Any = None) -> RealNvml | None:
    """NVML, initialised; None when it cannot be used here (``last_open_error()`` says why).

    ``lib`` replaces the ``pynvml`` module (tests). Never raises.
    """
    global _open_error
    if lib is None:
        try:
            lib = importlib.import_module("pynvml")
        except Exception as exc:
            _open_error = f"nvidia-ml-py (pynvml) is not importable: {type(exc).__name__}: {exc}"
            return None
    try:
        lib.nvmlInit()
    except Exception as exc:
        _open_error = f"NVML did not initialise: {exc} ({type(exc).__name__})"
        return None
    nvml = RealNvml(lib)
    if nvml.device_count() == 0:
        error = nvml.errors.get("nvmlDeviceGetCount")
        nvml.shutdown()
        _open_error = "NVML found no GPU" + (f" ({error})" if error else "")
        return None
    _open_error = None
    return nvml


def last_open_error() -> str | None:
    """Why the last ``open_nvml()`` returned None (None after a successful open)."""
    return _open_error


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
    ) -> None:
        self.cards = list(cards) if cards is not None else [FakeCard(uuid="GPU-00000000-fake-0000-0000-000000000000")]
        self._driver_version = driver_version
        self._cuda_driver_version = cuda_driver_version
        self.allow_set = allow_set
        self.p2p = dict(p2p or {})
        self.errors: dict[str, str] = {}
        self.calls: list[tuple[str, int, int]] = []
        self.closed = False

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


# ------------------------------------------------------------------------------------- which cards


@dataclass(frozen=True)
class CardRef:
    """One card: its NVML index (``nvidia-smi -i``) and its UUID (stable across reboots and renumbering)."""

    index: int
    uuid: str

    @property
    def label(self) -> str:
        return f"GPU {self.index} ({self.uuid[:12]})"


def _all_cards(nvml: Nvml) -> list[CardRef]:
    cards = []
    for index in range(nvml.device_count()):
        uuid = nvml.uuid(index)
        cards.append(CardRef(index, uuid or f"index-{index}"))
    return cards


def visible_cards(nvml: Nvml | None, env: Mapping[str, str] | None = None) -> list[CardRef]:
    """The cards a CUDA process started with ``env`` sees, in CUDA's order.

    ``CUDA_VISIBLE_DEVICES`` unset: every card. Set: a comma list of indices or ``GPU-…`` UUIDs or
    unique UUID prefixes; as in CUDA, the list ends at the first entry that names no card (or names
    one twice), and an empty value hides every card. ``MIG-…`` entries end the list (not supported).
    """
    if nvml is None:
        return []
    env = os.environ if env is None else env
    cards = _all_cards(nvml)
    spec = env.get("CUDA_VISIBLE_DEVICES")
    if spec is None:
        return cards
    chosen: list[CardRef] = []
    for raw in spec.split(","):
        item = raw.strip()
        card: CardRef | None = None
        if re.fullmatch(r"\d+", item):
            card = next((c for c in cards if c.index == int(item)), None)
        elif item[:4].upper() == "GPU-" and len(item) > 4:
            matches = [c for c in cards if c.uuid.lower().startswith(item.lower())]
            card = matches[0] if len(matches) == 1 else None
        if card is None or card in chosen:
            break
        chosen.append(card)
    return chosen


# ---------------------------------------------------------------------------------------- snapshot


def _watts(milliwatts: int | None) -> float | None:
    return None if milliwatts is None else milliwatts / 1000.0


def _mib(value: int | None) -> int | None:
    return None if value is None else value // MIB


def card_state(nvml: Nvml, card: CardRef) -> dict[str, Any]:
    """Everything NVML tells about one card, JSON-ready; None for what this card/driver cannot say."""
    i = card.index
    constraints = nvml.power_limit_constraints_mw(i)
    memory = nvml.memory_bytes(i)
    util = nvml.utilization_pct(i)
    mask = nvml.throttle_mask(i)
    procs = nvml.compute_processes(i)
    return {
        "index": i,
        "uuid": card.uuid,
        "name": nvml.name(i),
        "power_limit_w": _watts(nvml.power_limit_mw(i)),
        "power_limit_default_w": _watts(nvml.power_limit_default_mw(i)),
        "power_limit_enforced_w": _watts(nvml.power_limit_enforced_mw(i)),
        "power_limit_min_w": _watts(constraints[0]) if constraints else None,
        "power_limit_max_w": _watts(constraints[1]) if constraints else None,
        "power_w": _watts(nvml.power_usage_mw(i)),
        "sm_clock_mhz": nvml.clock_mhz(i, "sm", "current"),
        "mem_clock_mhz": nvml.clock_mhz(i, "mem", "current"),
        "sm_clock_max_mhz": nvml.clock_mhz(i, "sm", "max"),
        "mem_clock_max_mhz": nvml.clock_mhz(i, "mem", "max"),
        "sm_app_clock_mhz": nvml.clock_mhz(i, "sm", "app"),
        "mem_app_clock_mhz": nvml.clock_mhz(i, "mem", "app"),
        "sm_app_clock_default_mhz": nvml.clock_mhz(i, "sm", "app_default"),
        "mem_app_clock_default_mhz": nvml.clock_mhz(i, "mem", "app_default"),
        "pstate": nvml.pstate(i),
        "temp_c": nvml.temperature_c(i),
        "throttle_mask": mask,
        "throttle_reasons": throttle_reason_names(mask),
        "memory_used_mib": _mib(memory[0]) if memory else None,
        "memory_total_mib": _mib(memory[1]) if memory else None,
        "util_gpu_pct": util[0] if util else None,
        "util_mem_pct": util[1] if util else None,
        "pcie_gen": nvml.pcie_link(i, "gen"),
        "pcie_width": nvml.pcie_link(i, "width"),
        "pcie_gen_max": nvml.pcie_link(i, "gen_max"),
        "pcie_width_max": nvml.pcie_link(i, "width_max"),
        "persistence_mode": nvml.persistence_mode(i),
        "compute_processes": None if procs is None else [{"pid": pid, "used_mib": _mib(used)} for pid, used in procs],
    }


def snapshot(nvml: Nvml, cards: Sequence[CardRef], *, clock: Callable[[], float] = time.time) -> dict[str, Any]:
    """One JSON-ready picture of the host's GPUs: driver, every visible card, and P2P between them.

    ``p2p[a][b]`` is the READ peer-to-peer status from ``cards[a]`` to ``cards[b]`` (None on the
    diagonal and where NVML cannot say).
    """
    taken = clock()
    states = [card_state(nvml, card) for card in cards]
    p2p: list[list[str | None]] = []
    for a in cards:
        row: list[str | None] = []
        for b in cards:
            status = None if a.index == b.index else nvml.p2p_read_status(a.index, b.index)
            row.append(None if status is None else P2P_STATUS.get(status, f"status_{status}"))
        p2p.append(row)
    return {
        "gpu": True,
        "taken_unix_s": taken,
        "driver_version": nvml.driver_version(),
        "cuda_driver_version": format_cuda_version(nvml.cuda_driver_version()),
        "device_count": nvml.device_count(),
        "cards": states,
        "p2p": p2p,
        "nvml_errors": dict(sorted(dict(nvml.errors).items())),
    }


def no_gpu_snapshot(reason: str) -> dict[str, Any]:
    """What a snapshot says where there is no usable GPU."""
    return {"gpu": False, "reason": reason}


def _cards_by_uuid(snap: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    return {card["uuid"]: card for card in snap.get("cards") or []}


def _card_label(card: Mapping[str, Any]) -> str:
    return f"GPU {card.get('index')} ({str(card.get('uuid'))[:12]})"


def _fmt(value: Any, unit: str) -> str:
    if value is None:
        return "unknown"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return f"{value}{unit}"


#: (snapshot field, what it is, unit) — the card fields ``diff`` reports when they change.
DIFF_FIELDS: tuple[tuple[str, str, str], ...] = (
    ("power_limit_w", "power limit", " W"),
    ("power_limit_enforced_w", "enforced power limit", " W"),
    ("persistence_mode", "persistence mode", ""),
    ("sm_app_clock_mhz", "SM applications clock", " MHz"),
    ("mem_app_clock_mhz", "memory applications clock", " MHz"),
    ("sm_clock_max_mhz", "SM max clock", " MHz"),
    ("name", "name", ""),
)


def diff(before: Mapping[str, Any], after: Mapping[str, Any], *, own_pids: Iterable[int] = ()) -> list[str]:
    """What changed between two snapshots that matters for a comparison, one line per change.

    Power limits, persistence mode, applications clocks, driver/CUDA version, cards appearing or
    vanishing, and compute processes that are new in ``after`` and not in ``own_pids``.
    """
    lines: list[str] = []
    if not before.get("gpu") or not after.get("gpu"):
        if before.get("gpu") != after.get("gpu"):
            lines.append(
                f"GPU availability changed: {'available' if before.get('gpu') else before.get('reason')} → "
                f"{'available' if after.get('gpu') else after.get('reason')}"
            )
        return lines
    for key, what in (("driver_version", "driver"), ("cuda_driver_version", "CUDA driver version")):
        if before.get(key) != after.get(key):
            lines.append(f"{what} changed: {before.get(key)} → {after.get(key)}")
    old, new = _cards_by_uuid(before), _cards_by_uuid(after)
    for uuid in old.keys() - new.keys():
        lines.append(f"{_card_label(old[uuid])} is gone")
    for uuid in new.keys() - old.keys():
        lines.append(f"{_card_label(new[uuid])} appeared")
    own = set(own_pids)
    for uuid in [u for u in old if u in new]:
        a, b = old[uuid], new[uuid]
        label = _card_label(b)
        for key, what, unit in DIFF_FIELDS:
            if a.get(key) != b.get(key):
                lines.append(f"{label}: {what} {_fmt(a.get(key), unit)} → {_fmt(b.get(key), unit)}")
        seen = {p["pid"] for p in a.get("compute_processes") or []}
        for proc in b.get("compute_processes") or []:
            if proc["pid"] not in seen and proc["pid"] not in own:
                lines.append(
                    f"{label}: new foreign compute process pid {proc['pid']} ({_fmt(proc.get('used_mib'), ' MiB')})"
                )
    return lines


def memory_used_mib(snap: Mapping[str, Any]) -> dict[str, int]:
    """UUID → memory used (MiB), for the cards whose memory NVML could read."""
    return {
        card["uuid"]: int(card["memory_used_mib"])
        for card in snap.get("cards") or []
        if card.get("memory_used_mib") is not None
    }


def require_idle(snap: Mapping[str, Any], max_util_pct: float = 10, *, own_pids: Iterable[int] = ()) -> list[str]:
    """Problems that make a card unfit to measure on: compute processes that are not ours, or GPU
    utilization above ``max_util_pct``. Empty when every card is idle (or there is no GPU)."""
    problems: list[str] = []
    own = set(own_pids)
    for card in snap.get("cards") or []:
        label = _card_label(card)
        for proc in card.get("compute_processes") or []:
            if proc["pid"] not in own:
                problems.append(
                    f"{label}: foreign compute process pid {proc['pid']} ({_fmt(proc.get('used_mib'), ' MiB')})"
                )
        util = card.get("util_gpu_pct")
        if util is not None and util > max_util_pct:
            problems.append(f"{label}: utilization {util}% > {max_util_pct:g}%")
    return problems


def settle(
    nvml: Nvml,
    cards: Sequence[CardRef],
    *,
    max_temp_c: float | None,
    max_power_w: float | None,
    timeout_s: float,
    poll_s: float = 1.0,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[str, Any]:
    """Wait until every card is at or below ``max_temp_c`` and ``max_power_w`` (None: not checked;
    an unreadable value counts as settled), or ``timeout_s`` passed.

    Returns ``settled`` (bool), ``waited_s``, ``polls`` and the last ``cards`` readings (UUID →
    ``temp_c``, ``power_w``).
    """
    start = clock()
    polls = 0
    while True:
        polls += 1
        readings: dict[str, dict[str, float | None]] = {}
        ok = True
        for card in cards:
            temp = nvml.temperature_c(card.index)
            power = _watts(nvml.power_usage_mw(card.index))
            readings[card.uuid] = {"temp_c": temp, "power_w": power}
            if max_temp_c is not None and temp is not None and temp > max_temp_c:
                ok = False
            if max_power_w is not None and power is not None and power > max_power_w:
                ok = False
        waited = clock() - start
        if ok or waited >= timeout_s:
            return {
                "settled": ok,
                "waited_s": waited,
                "polls": polls,
                "max_temp_c": max_temp_c,
                "max_power_w": max_power_w,
                "timeout_s": timeout_s,
                "cards": readings,
            }
        sleep(min(poll_s, max(0.0, timeout_s - waited)))


# ----------------------------------------------------------------------------------------- sampler


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
        return {
            "t_unix_s": self.t_unix_s,
            "card": self.card,
            "index": self.index,
            "power_w": self.power_w,
            "power_limit_w": self.power_limit_w,
            "sm_clock_mhz": self.sm_clock_mhz,
            "mem_clock_mhz": self.mem_clock_mhz,
            "temp_c": self.temp_c,
            "util_gpu_pct": self.util_gpu_pct,
            "util_mem_pct": self.util_mem_pct,
            "memory_used_mib": self.memory_used_mib,
            "throttle_reasons": None if self.throttle_reasons is None else list(self.throttle_reasons),
        }


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


class Sampler:
    """A background thread reading every card ``hz`` times a second into memory and ``path``.

    Each reading is one JSON line (``GpuSample.to_dict()``), appended and flushed as it is taken.
    ``window()`` aggregates a time span; ``sample_once()`` takes a reading on the caller's thread
    (the thread calls it too; usable without ``start()``). ``stop()`` joins the thread and closes
    the file; it is idempotent. Samples are also kept in memory (about 200 bytes each) for ``window()``.
    """

    def __init__(
        self,
        nvml: Nvml,
        cards: Sequence[CardRef],
        path: Path | None = None,
        *,
        hz: float = 4.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if hz <= 0:
            raise ValueError(f"sampler rate must be positive, got {hz!r} Hz")
        self.nvml = nvml
        self.cards = list(cards)
        self.path = path
        self.hz = hz
        self.clock = clock
        self.errors = 0
        self.last_error: str | None = None
        self._samples: list[GpuSample] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._fh: IO[str] | None = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> Sampler:
        if self._thread is not None:
            raise RuntimeError("sampler already started")
        try:
            with self._lock:
                self._open()  # fail here, not in the thread, when the file cannot be written
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="kvcache-gpu-sampler", daemon=True)
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

    def __enter__(self) -> Sampler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _open(self) -> None:
        """Open ``path`` for appending (caller holds the lock)."""
        if self._fh is None and self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fh = self.path.open("a", encoding="utf-8")

    def _run(self) -> None:
        interval = 1.0 / self.hz
        next_at = time.monotonic()
        while not self._stop.is_set():
            try:
                self.sample_once()
            except Exception as exc:  # a sampler must never take the run down
                self.errors += 1
                self.last_error = f"{type(exc).__name__}: {exc}"
            next_at += interval
            now = time.monotonic()
            if next_at < now:  # fell behind: skip the missed ticks, keep the phase
                next_at += interval * math.ceil((now - next_at) / interval)
            self._stop.wait(next_at - now)

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

    def window(self, t0_unix_s: float, t1_unix_s: float) -> dict[str, Any]:
        """Aggregate the samples taken in ``[t0, t1]``: overall and per card (UUID → same keys).

        ``power_limit_changed`` also compares with each card's last reading before ``t0``, so a
        change just before the window starts counts. ``samples`` is 0 when nothing was read
        in the span (a request shorter than the sampling interval).
        """
        with self._lock:
            inside = [s for s in self._samples if t0_unix_s <= s.t_unix_s <= t1_unix_s]
            before: dict[str, GpuSample] = {}
            for s in self._samples:
                if s.t_unix_s < t0_unix_s:
                    before[s.card] = s
        result = aggregate(inside)
        cards: dict[str, dict[str, Any]] = {}
        for card in self.cards:
            own = [s for s in inside if s.card == card.uuid]
            agg = aggregate(own)
            if card.uuid in before and own:
                agg["power_limit_changed"] = aggregate([before[card.uuid], *own])["power_limit_changed"]
            cards[card.uuid] = agg
        result["power_limit_changed"] = any(c["power_limit_changed"] for c in cards.values())
        result.update({"t0_unix_s": t0_unix_s, "t1_unix_s": t1_unix_s, "cards": cards})
        return result


# ------------------------------------------------------------------------------------- drift rules

THERMAL_REASONS = ("hw_thermal_slowdown", "sw_thermal_slowdown")
HW_SLOWDOWN_REASONS = ("hw_slowdown", "hw_power_brake_slowdown")
POWER_CAP_REASONS = ("sw_power_cap",)


@dataclass(frozen=True)
class DriftRules:
    """Which GPU events during a request exclude it from statistics (every event is flagged anyway).

    Power-cap throttling is what a deliberate ``--kv-gpu-power-limit`` produces, so by default it is
    only flagged; thermal and hardware slowdowns and a power limit changing mid-request exclude.
    """

    exclude_thermal: bool = True
    exclude_hw_slowdown: bool = True
    exclude_power_limit_change: bool = True
    max_temp_c: float | None = None
    exclude_power_cap: bool = False


def drift(window: Mapping[str, Any], rules: DriftRules | None = None) -> tuple[list[str], str | None]:
    """Flags for what happened on the GPUs during ``window`` (from ``Sampler.window``), and the reason
    to exclude the sample (None to keep it). Flags: ``gpu_thermal_throttle``, ``gpu_hw_slowdown``,
    ``gpu_power_cap``, ``gpu_power_limit_changed``, ``gpu_temp_over_limit``."""
    rules = rules or DriftRules()
    cards: Mapping[str, Mapping[str, Any]] = window.get("cards") or {"all": window}
    flags: list[str] = []
    reasons: list[str] = []

    def hit(flag: str, exclude: bool, why: str) -> None:
        if flag not in flags:
            flags.append(flag)
        if exclude:
            reasons.append(f"{flag}: {why}")

    for uuid, agg in cards.items():
        label = uuid[:12]
        seen = set(agg.get("throttle_reasons_seen") or [])
        if found := sorted(seen.intersection(THERMAL_REASONS)):
            hit("gpu_thermal_throttle", rules.exclude_thermal, f"{', '.join(found)} on {label}")
        if found := sorted(seen.intersection(HW_SLOWDOWN_REASONS)):
            hit("gpu_hw_slowdown", rules.exclude_hw_slowdown, f"{', '.join(found)} on {label}")
        if agg.get("power_limit_changed"):
            hit("gpu_power_limit_changed", rules.exclude_power_limit_change, f"power limit changed on {label}")
        temp = agg.get("max_temp_c")
        if rules.max_temp_c is not None and temp is not None and temp > rules.max_temp_c:
            hit("gpu_temp_over_limit", True, f"{temp} °C > {rules.max_temp_c:g} °C on {label}")
        if seen.intersection(POWER_CAP_REASONS):
            hit("gpu_power_cap", rules.exclude_power_cap, f"sw_power_cap on {label}")
    return flags, (reasons[0] if reasons else None)


# ------------------------------------------------------------------------------------- power pinning

_WATTS = re.compile(r"(?i)^(\d+(?:\.\d+)?)\s*w?$")


@dataclass(frozen=True)
class PowerPlan:
    """A parsed ``--kv-gpu-power-limit``: watts for every card, per NVML index, or per UUID prefix.

    ``verify_only`` plans (``verify:…``) never set anything; they only check the limits in place.
    """

    spec: str
    verify_only: bool = False
    all_w: float | None = None
    by_index: Mapping[int, float] = field(default_factory=dict)
    by_uuid_prefix: Mapping[str, float] = field(default_factory=dict)

    def targets(self, cards: Sequence[CardRef]) -> dict[str, float]:
        """UUID → watts for ``cards``. GpuError when an index or prefix names no card (or several)."""
        if self.all_w is not None:
            return {card.uuid: self.all_w for card in cards}
        out: dict[str, float] = {}
        for index, watts in self.by_index.items():
            match = [c for c in cards if c.index == index]
            if not match:
                raise GpuError(
                    f"--kv-gpu-power-limit {self.spec!r}: GPU index {index} is not a visible card "
                    f"(visible: {', '.join(str(c.index) for c in cards) or 'none'})"
                )
            out[match[0].uuid] = watts
        for prefix, watts in self.by_uuid_prefix.items():
            match = [c for c in cards if c.uuid.lower().startswith(prefix.lower())]
            if len(match) != 1:
                what = "no visible card" if not match else f"{len(match)} cards"
                raise GpuError(f"--kv-gpu-power-limit {self.spec!r}: {prefix} matches {what}")
            if match[0].uuid in out:
                raise GpuError(f"--kv-gpu-power-limit {self.spec!r}: {match[0].label} is named twice")
            out[match[0].uuid] = watts
        return out


def _parse_watts(text: str, part: str) -> float:
    m = _WATTS.match(text.strip())
    if not m or float(m.group(1)) <= 0:
        raise ValueError(f"power limit {part!r}: {text.strip()!r} is not a positive number of watts")
    return float(m.group(1))


def parse_power_limit(spec: str) -> PowerPlan:
    """Parse ``300`` | ``0:300,1:250`` | ``GPU-abc…:300`` | ``verify:`` + any of those.

    Indices are NVML indices (``nvidia-smi -i``), not CUDA's renumbering after ``CUDA_VISIBLE_DEVICES``.
    Raises ValueError naming the bad part.
    """
    text = spec.strip()
    verify = False
    if text.lower().startswith("verify:"):
        verify, text = True, text[len("verify:") :].strip()
    if not text:
        raise ValueError(f"power limit {spec!r}: nothing after {'verify:' if verify else 'the option'}")
    if ":" not in text and "," not in text:
        return PowerPlan(spec=spec, verify_only=verify, all_w=_parse_watts(text, text))
    by_index: dict[int, float] = {}
    by_uuid: dict[str, float] = {}
    for raw in text.split(","):
        part = raw.strip()
        key, sep, value = part.rpartition(":")
        key = key.strip()
        if not sep or not key:
            raise ValueError(
                f"power limit {spec!r}: {part!r} needs the form INDEX:WATTS or GPU-UUID:WATTS "
                "(a bare number applies to all cards and must stand alone)"
            )
        watts = _parse_watts(value, part)
        if re.fullmatch(r"\d+", key):
            if int(key) in by_index:
                raise ValueError(f"power limit {spec!r}: GPU index {key} is given twice")
            by_index[int(key)] = watts
        elif re.fullmatch(r"(?i)GPU-[0-9a-f][0-9a-f-]*", key):
            if key.lower() in (k.lower() for k in by_uuid):
                raise ValueError(f"power limit {spec!r}: {key} is given twice")
            by_uuid[key] = watts
        else:
            raise ValueError(f"power limit {spec!r}: {key!r} in {part!r} is neither a GPU index nor a GPU-… UUID")
    return PowerPlan(spec=spec, verify_only=verify, by_index=by_index, by_uuid_prefix=by_uuid)


def apply_power_limits(nvml: Nvml, cards: Sequence[CardRef], plan: PowerPlan) -> dict[str, float]:
    """Set the plan's limits; return UUID → the limit (W) each changed card had before.

    A ``verify:`` plan sets nothing and returns ``{}``. Every target is checked against the card's
    allowed range before anything is set; if a setter fails midway the cards already changed are put
    back. NVML's NoPermission becomes RootRequiredError (setting needs root).
    """
    if plan.verify_only:
        return {}
    targets = plan.targets(cards)
    by_uuid = {card.uuid: card for card in cards}
    for uuid, watts in targets.items():
        card = by_uuid[uuid]
        constraints = nvml.power_limit_constraints_mw(card.index)
        if constraints is not None and not constraints[0] <= watts * 1000 <= constraints[1]:
            raise GpuError(
                f"--kv-gpu-power-limit {plan.spec!r}: {watts:g} W is outside {card.label}'s range "
                f"{constraints[0] / 1000:g}–{constraints[1] / 1000:g} W"
            )
    originals: dict[str, float] = {}
    try:
        for uuid, watts in targets.items():
            card = by_uuid[uuid]
            current = nvml.power_limit_mw(card.index)
            if current is None:
                raise GpuError(f"{card.label}: cannot read the current power limit, so it could not be restored")
            originals[uuid] = current / 1000.0
            try:
                nvml.set_power_limit_mw(card.index, round(watts * 1000))
            except PermissionError as exc:
                del originals[uuid]
                raise RootRequiredError(
                    f"setting a GPU power limit needs root (NVML: {exc}); run as root, or set the limit "
                    f"beforehand (nvidia-smi -i {card.index} -pl {watts:g}) and pass "
                    f"--kv-gpu-power-limit=verify:{plan.spec.removeprefix('verify:')} to only check it"
                ) from exc
            except GpuError:
                del originals[uuid]
                raise
    except BaseException:
        with contextlib.suppress(GpuError):
            restore_power_limits(nvml, originals)
        raise
    return originals


def verify_power_limits(snap: Mapping[str, Any], plan: PowerPlan, *, tolerance_w: float = 1.0) -> list[str]:
    """Problems with the limits in ``snap`` against ``plan`` (empty: every card is as asked)."""
    if not snap.get("gpu"):
        return [f"no GPU ({snap.get('reason')}): cannot check power limit {plan.spec!r}"]
    states = snap.get("cards") or []
    cards = [CardRef(int(c["index"]), str(c["uuid"])) for c in states]
    try:
        targets = plan.targets(cards)
    except GpuError as exc:
        return [str(exc)]
    problems: list[str] = []
    for state in states:
        if state["uuid"] not in targets:
            continue
        want = targets[state["uuid"]]
        label = _card_label(state)
        limit, enforced = state.get("power_limit_w"), state.get("power_limit_enforced_w")
        if limit is None:
            problems.append(f"{label}: power limit unreadable, wanted {want:g} W")
        elif abs(limit - want) > tolerance_w:
            problems.append(f"{label}: power limit is {limit:g} W, wanted {want:g} W")
        elif enforced is not None and enforced < want - tolerance_w:
            problems.append(f"{label}: enforced power limit is {enforced:g} W, below the wanted {want:g} W")
    return problems


def restore_power_limits(nvml: Nvml, originals: Mapping[str, float]) -> None:
    """Put back the limits ``apply_power_limits`` returned. Tries every card; GpuError lists failures."""
    index_of = {card.uuid: card.index for card in _all_cards(nvml)}
    failures: list[str] = []
    for uuid, watts in originals.items():
        if uuid not in index_of:
            failures.append(f"{uuid[:12]}: card not found")
            continue
        try:
            nvml.set_power_limit_mw(index_of[uuid], round(watts * 1000))
        except (PermissionError, GpuError) as exc:
            failures.append(f"GPU {index_of[uuid]} ({uuid[:12]}): {exc}")
    if failures:
        raise GpuError("could not restore GPU power limits: " + "; ".join(failures))


if TYPE_CHECKING:  # both backends satisfy the seam
    _real: Nvml = RealNvml(None)
    _fake: Nvml = FakeNvml()
