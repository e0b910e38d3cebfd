"""NVML itself (`pytest_kvcache.gpu.nvml`): decoding, and ``RealNvml`` / ``open_nvml`` against a stand-in
``pynvml`` module whose setter raises NVML's own NoPermission error (these machines have no GPU, and the GPU
the project borrows must never be changed).
"""

from __future__ import annotations

import sys
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest

from pytest_kvcache.config.grammars import parse_power_limit
from pytest_kvcache.gpu.cards import CardRef, visible_cards
from pytest_kvcache.gpu.nvml import (
    MIB,
    P2P_STATUS,
    THROTTLE_REASON_BITS,
    GpuError,
    RealNvml,
    RootRequiredError,
    format_cuda_version,
    last_open_error,
    open_nvml,
    throttle_reason_names,
)
from pytest_kvcache.gpu.power import apply_power_limits
from pytest_kvcache.gpu.snapshot import snapshot
from tests.unit.gpu.helpers import UUID_A, UUID_B

# ------------------------------------------------------------------------------------------ decoding


def test_throttle_reason_bits_match_nvidia_ml_py() -> None:
    names = dict((name, bit) for bit, name in THROTTLE_REASON_BITS)
    assert names["gpu_idle"] == pynvml.nvmlClocksEventReasonGpuIdle
    assert names["applications_clocks_setting"] == pynvml.nvmlClocksEventReasonApplicationsClocksSetting
    assert names["sw_power_cap"] == pynvml.nvmlClocksEventReasonSwPowerCap
    assert names["hw_slowdown"] == pynvml.nvmlClocksEventReasonHwSlowdown
    assert names["sync_boost"] == pynvml.nvmlClocksEventReasonSyncBoost
    assert names["sw_thermal_slowdown"] == pynvml.nvmlClocksEventReasonSwThermalSlowdown
    assert names["hw_thermal_slowdown"] == pynvml.nvmlClocksEventReasonHwThermalSlowdown
    assert names["hw_power_brake_slowdown"] == pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown
    assert names["display_clock_setting"] == pynvml.nvmlClocksEventReasonDisplayClockSetting
    assert P2P_STATUS[pynvml.NVML_P2P_STATUS_OK] == "ok"
    assert P2P_STATUS[pynvml.NVML_P2P_STATUS_NOT_SUPPORTED] == "not_supported"


def test_throttle_reason_names() -> None:
    assert throttle_reason_names(None) is None
    assert throttle_reason_names(0) == []
    assert throttle_reason_names(0x4 | 0x40) == ["sw_power_cap", "hw_thermal_slowdown"]
    assert throttle_reason_names(0x1 | 0x10000) == ["gpu_idle", "unknown_0x10000"]
    assert format_cuda_version(12080) == "12.8" and format_cuda_version(None) is None


def not_supported(*_: Any) -> Any:
    raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)


class StubPynvml:
    """A stand-in for the ``pynvml`` module: same function names, NVML's own error classes, no library."""

    NVMLError = pynvml.NVMLError

    def __init__(self, count: int = 2, init_error: int | None = None) -> None:
        self.count = count
        self.init_error = init_error
        self.p2p_args: list[tuple[Any, ...]] = []
        self.shut = 0

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise pynvml.NVMLError(self.init_error)

    def nvmlShutdown(self) -> None:
        self.shut += 1

    def nvmlDeviceGetCount(self) -> int:
        return self.count

    def nvmlDeviceGetHandleByIndex(self, index: int) -> str:
        return f"h{index}"

    def nvmlDeviceGetUUID(self, handle: str) -> bytes:
        return {"h0": UUID_A, "h1": UUID_B}[handle].encode()

    def nvmlDeviceGetName(self, handle: str) -> str:
        return "NVIDIA H200"

    def nvmlSystemGetDriverVersion(self) -> str:
        return "570.133.20"

    def nvmlSystemGetCudaDriverVersion_v2(self) -> int:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return 12080

    def nvmlDeviceGetPowerManagementLimit(self, handle: str) -> int:
        return 700_000

    nvmlDeviceGetPowerManagementDefaultLimit = staticmethod(not_supported)
    nvmlDeviceGetEnforcedPowerLimit = staticmethod(not_supported)

    def nvmlDeviceGetPowerManagementLimitConstraints(self, handle: str) -> list[int]:
        return [200_000, 700_000]

    def nvmlDeviceGetPowerUsage(self, handle: str) -> int:
        return 123_456

    def nvmlDeviceGetClockInfo(self, handle: str, clock_type: int) -> int:
        return {pynvml.NVML_CLOCK_SM: 1980, pynvml.NVML_CLOCK_MEM: 2619}[clock_type]

    nvmlDeviceGetMaxClockInfo = nvmlDeviceGetClockInfo
    nvmlDeviceGetApplicationsClock = staticmethod(not_supported)
    # nvmlDeviceGetDefaultApplicationsClock deliberately missing (an older/newer nvidia-ml-py)

    def nvmlDeviceGetPerformanceState(self, handle: str) -> int:
        return 0

    def nvmlDeviceGetTemperature(self, handle: str, sensor: int) -> int:
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return 41

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: str) -> int:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)  # an older driver

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: str) -> int:
        return 0x4

    def nvmlDeviceGetMemoryInfo(self, handle: str) -> Any:
        return SimpleNamespace(used=1024 * MIB, total=143_771 * MIB, free=0)

    def nvmlDeviceGetUtilizationRates(self, handle: str) -> Any:
        return SimpleNamespace(gpu=97, memory=40)

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: str) -> int:
        return 5

    nvmlDeviceGetCurrPcieLinkWidth = staticmethod(not_supported)
    nvmlDeviceGetMaxPcieLinkGeneration = nvmlDeviceGetCurrPcieLinkGeneration

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: str) -> int:
        raise RuntimeError("a driver bug, not even an NVMLError")

    def nvmlDeviceGetPersistenceMode(self, handle: str) -> int:
        return pynvml.NVML_FEATURE_ENABLED

    def nvmlDeviceGetComputeRunningProcesses(self, handle: str) -> list[Any]:
        return [SimpleNamespace(pid=7, usedGpuMemory=None)]

    def nvmlDeviceGetP2PStatus(self, a: str, b: str, index: Any) -> int:
        self.p2p_args.append((a, b, index))
        return pynvml.NVML_P2P_STATUS_OK

    def nvmlDeviceSetPowerManagementLimit(self, handle: str, limit: int) -> None:
        if limit == 1:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NO_PERMISSION)


def test_real_nvml_turns_every_error_into_none() -> None:
    lib = StubPynvml()
    nvml = open_nvml(lib)
    assert isinstance(nvml, RealNvml) and last_open_error() is None
    cards = visible_cards(nvml, {})
    assert cards == [CardRef(0, UUID_A), CardRef(1, UUID_B)]
    snap = snapshot(nvml, cards)
    state = snap["cards"][0]
    assert state["power_limit_w"] == 700.0 and state["power_w"] == 123.456
    assert state["power_limit_default_w"] is None and state["power_limit_enforced_w"] is None
    assert state["sm_app_clock_mhz"] is None and state["sm_app_clock_default_mhz"] is None
    assert state["sm_clock_mhz"] == 1980 and state["mem_clock_max_mhz"] == 2619
    assert state["throttle_reasons"] == ["sw_power_cap"]  # fell back to the older ThrottleReasons name
    assert state["pcie_gen"] == 5 and state["pcie_width"] is None and state["pcie_width_max"] is None
    assert state["util_gpu_pct"] == 97 and state["memory_used_mib"] == 1024
    assert state["persistence_mode"] is True
    assert state["compute_processes"] == [{"pid": 7, "used_mib": None}]
    assert snap["cuda_driver_version"] == "12.8"
    assert snap["p2p"] == [[None, "ok"], ["ok", None]]
    assert {args[2] for args in lib.p2p_args} == {0}  # an int: pynvml's own READ constant is a tuple
    assert "Not Supported" in snap["nvml_errors"]["nvmlDeviceGetEnforcedPowerLimit"]
    assert "RuntimeError" in snap["nvml_errors"]["nvmlDeviceGetMaxPcieLinkWidth"]
    assert snap["nvml_errors"]["nvmlDeviceGetDefaultApplicationsClock"] == "not in this nvidia-ml-py"
    nvml.shutdown()
    nvml.shutdown()
    assert lib.shut == 1


def test_real_nvml_setter_maps_no_permission_to_permission_error() -> None:
    nvml = RealNvml(StubPynvml())
    with pytest.raises(PermissionError, match="Insufficient Permissions"):
        nvml.set_power_limit_mw(0, 300_000)
    with pytest.raises(GpuError, match="Invalid Argument"):
        nvml.set_power_limit_mw(0, 1)
    with pytest.raises(RootRequiredError, match="needs root"):
        apply_power_limits(nvml, [CardRef(0, UUID_A)], parse_power_limit("300"))


def test_open_nvml_reports_why_when_nvml_cannot_init() -> None:
    assert open_nvml(StubPynvml(init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)) is None
    assert "NVML Shared Library Not Found" in (last_open_error() or "")
    assert open_nvml(StubPynvml(init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED)) is None
    assert "Driver Not Loaded" in (last_open_error() or "")
    lib = StubPynvml(count=0)
    assert open_nvml(lib) is None and lib.shut == 1
    assert last_open_error() == "NVML found no GPU"


def test_open_nvml_without_pynvml(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)
    assert open_nvml() is None
    assert "not importable" in (last_open_error() or "")


def test_open_nvml_on_this_host_never_raises() -> None:
    nvml = open_nvml()  # the real library: None on a host without a GPU, never an exception
    if nvml is None:
        assert last_open_error()
        assert visible_cards(None) == []
    else:  # pragma: no cover - a GPU host
        nvml.shutdown()
