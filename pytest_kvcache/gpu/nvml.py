"""NVML itself: the ``Nvml`` seam, ``pynvml`` behind it, and how to read what it returns.

* ``open_nvml()`` — the NVML library (``nvidia-ml-py``, imported as ``pynvml``) or None with a reason
  (``last_open_error()``): no library, no driver, no GPU. Everything else then reports "no GPU"
  instead of failing.
* ``Nvml`` — the calls the rest of ``pytest_kvcache.gpu`` needs, by NVML device index. ``RealNvml``
  wraps ``pynvml`` and turns every NVML error (NotSupported, NoPermission, FunctionNotFound …) into
  ``None`` for that one field; only the power-limit setter raises. The in-memory stand-in for tests is
  ``pytest_kvcache.testing.fake_nvml.FakeNvml``.
* ``throttle_reason_names()`` / ``format_cuda_version()`` — decode NVML's encodings; ``GpuError`` and
  ``RootRequiredError`` — what the GPU modules raise.

``docs/gpu.md`` defines every field. Plain Python: no pytest, no server access.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, Protocol

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

#: The NVML function behind ``Nvml.total_energy_mj`` (its error, if any, is kept under this name).
ENERGY_FUNC = "nvmlDeviceGetTotalEnergyConsumption"
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


def _watts(milliwatts: int | None) -> float | None:
    """NVML milliwatts → watts."""
    return None if milliwatts is None else milliwatts / 1000.0


def _mib(value: int | None) -> int | None:
    """NVML bytes → MiB (floor)."""
    return None if value is None else value // MIB


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
    def total_energy_mj(self, index: int) -> int | None:
        """NVML's total-energy counter: millijoules since the driver last loaded (Volta and newer); None
        where the card lacks it (NotSupported) or the read failed (``errors`` says which)."""

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

    def total_energy_mj(self, index: int) -> int | None:
        return self._int(self._dev(ENERGY_FUNC, index))

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


if TYPE_CHECKING:  # the real backend satisfies the seam (the fake: pytest_kvcache.testing.fake_nvml)
    _real: Nvml = RealNvml(None)
