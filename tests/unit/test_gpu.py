"""pytest_kvcache.gpu against FakeNvml and a stand-in ``pynvml`` module.

These machines have no GPU, and the GPU the project borrows must never be changed: power limits
are set here only on the fake NVML layer. The real setter (``nvmlDeviceSetPowerManagementLimit``)
is exercised through a stand-in module whose setter raises NVML's own NoPermission error.
"""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest

from pytest_kvcache import gpu
from pytest_kvcache.gpu import (
    CardRef,
    DriftRules,
    FakeCard,
    FakeNvml,
    GpuError,
    RealNvml,
    RootRequiredError,
    Sampler,
)

UUID_A = "GPU-aaaa1111-0000-0000-0000-000000000000"
UUID_B = "GPU-bbbb2222-0000-0000-0000-000000000000"
UUID_C = "GPU-bbbb3333-0000-0000-0000-000000000000"


def two_cards(**kw: Any) -> FakeNvml:
    return FakeNvml([FakeCard(uuid=UUID_A), FakeCard(uuid=UUID_B)], **kw)


def refs(nvml: FakeNvml) -> list[CardRef]:
    return gpu.visible_cards(nvml, {})


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


# ------------------------------------------------------------------------------------------ decoding


def test_throttle_reason_bits_match_nvidia_ml_py() -> None:
    names = dict((name, bit) for bit, name in gpu.THROTTLE_REASON_BITS)
    assert names["gpu_idle"] == pynvml.nvmlClocksEventReasonGpuIdle
    assert names["applications_clocks_setting"] == pynvml.nvmlClocksEventReasonApplicationsClocksSetting
    assert names["sw_power_cap"] == pynvml.nvmlClocksEventReasonSwPowerCap
    assert names["hw_slowdown"] == pynvml.nvmlClocksEventReasonHwSlowdown
    assert names["sync_boost"] == pynvml.nvmlClocksEventReasonSyncBoost
    assert names["sw_thermal_slowdown"] == pynvml.nvmlClocksEventReasonSwThermalSlowdown
    assert names["hw_thermal_slowdown"] == pynvml.nvmlClocksEventReasonHwThermalSlowdown
    assert names["hw_power_brake_slowdown"] == pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown
    assert names["display_clock_setting"] == pynvml.nvmlClocksEventReasonDisplayClockSetting
    assert gpu.P2P_STATUS[pynvml.NVML_P2P_STATUS_OK] == "ok"
    assert gpu.P2P_STATUS[pynvml.NVML_P2P_STATUS_NOT_SUPPORTED] == "not_supported"


def test_throttle_reason_names() -> None:
    assert gpu.throttle_reason_names(None) is None
    assert gpu.throttle_reason_names(0) == []
    assert gpu.throttle_reason_names(0x4 | 0x40) == ["sw_power_cap", "hw_thermal_slowdown"]
    assert gpu.throttle_reason_names(0x1 | 0x10000) == ["gpu_idle", "unknown_0x10000"]
    assert gpu.format_cuda_version(12080) == "12.8" and gpu.format_cuda_version(None) is None


# ---------------------------------------------------------------------------------------- snapshot


def test_snapshot_fields() -> None:
    nvml = two_cards(p2p={(0, 1): 0, (1, 0): 5})
    nvml.cards[0].compute_processes = [(4242, 2048 * gpu.MIB)]
    nvml.cards[1].throttle_mask = 0x4
    snap = gpu.snapshot(nvml, refs(nvml), clock=lambda: 1234.5)
    assert snap["gpu"] is True and snap["taken_unix_s"] == 1234.5
    assert snap["driver_version"] == "570.133.20" and snap["cuda_driver_version"] == "12.8"
    assert snap["device_count"] == 2
    assert snap["p2p"] == [[None, "ok"], ["not_supported", None]]
    card = snap["cards"][0]
    assert card == {
        "index": 0,
        "uuid": UUID_A,
        "name": "NVIDIA H200",
        "power_limit_w": 700.0,
        "power_limit_default_w": 700.0,
        "power_limit_enforced_w": 700.0,
        "power_limit_min_w": 200.0,
        "power_limit_max_w": 700.0,
        "power_w": 80.0,
        "sm_clock_mhz": 345,
        "mem_clock_mhz": 2619,
        "sm_clock_max_mhz": 1980,
        "mem_clock_max_mhz": 2619,
        "sm_app_clock_mhz": 1980,
        "mem_app_clock_mhz": 2619,
        "sm_app_clock_default_mhz": 1980,
        "mem_app_clock_default_mhz": 2619,
        "pstate": 0,
        "temp_c": 30,
        "throttle_mask": 1,
        "throttle_reasons": ["gpu_idle"],
        "memory_used_mib": 600,
        "memory_total_mib": 143_771,
        "util_gpu_pct": 0,
        "util_mem_pct": 0,
        "pcie_gen": 5,
        "pcie_width": 16,
        "pcie_gen_max": 5,
        "pcie_width_max": 16,
        "persistence_mode": True,
        "compute_processes": [{"pid": 4242, "used_mib": 2048}],
    }
    assert snap["cards"][1]["throttle_reasons"] == ["sw_power_cap"]
    json.dumps(snap)  # JSON-ready


def test_snapshot_unsupported_fields_are_none() -> None:
    card = FakeCard(uuid=UUID_A, power_limit_constraints_mw=None, temperature_c=None, throttle_mask=None)
    card.memory_used_bytes = None
    card.compute_processes = None
    card.persistence_mode = None
    nvml = FakeNvml([card], driver_version=None, cuda_driver_version=None)
    snap = gpu.snapshot(nvml, refs(nvml))
    state = snap["cards"][0]
    for key in ("power_limit_min_w", "power_limit_max_w", "temp_c", "throttle_mask", "throttle_reasons"):
        assert state[key] is None, key
    assert state["memory_used_mib"] is None and state["memory_total_mib"] is None
    assert state["compute_processes"] is None and state["persistence_mode"] is None
    assert snap["driver_version"] is None and snap["cuda_driver_version"] is None
    assert gpu.memory_used_mib(snap) == {}


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
        return SimpleNamespace(used=1024 * gpu.MIB, total=143_771 * gpu.MIB, free=0)

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
    nvml = gpu.open_nvml(lib)
    assert isinstance(nvml, RealNvml) and gpu.last_open_error() is None
    cards = gpu.visible_cards(nvml, {})
    assert cards == [CardRef(0, UUID_A), CardRef(1, UUID_B)]
    snap = gpu.snapshot(nvml, cards)
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
        gpu.apply_power_limits(nvml, [CardRef(0, UUID_A)], gpu.parse_power_limit("300"))


def test_open_nvml_reports_why_when_nvml_cannot_init() -> None:
    assert gpu.open_nvml(StubPynvml(init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)) is None
    assert "NVML Shared Library Not Found" in (gpu.last_open_error() or "")
    assert gpu.open_nvml(StubPynvml(init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED)) is None
    assert "Driver Not Loaded" in (gpu.last_open_error() or "")
    lib = StubPynvml(count=0)
    assert gpu.open_nvml(lib) is None and lib.shut == 1
    assert gpu.last_open_error() == "NVML found no GPU"


def test_open_nvml_without_pynvml(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)
    assert gpu.open_nvml() is None
    assert "not importable" in (gpu.last_open_error() or "")


def test_open_nvml_on_this_host_never_raises() -> None:
    nvml = gpu.open_nvml()  # the real library: None on a host without a GPU, never an exception
    if nvml is None:
        assert gpu.last_open_error()
        assert gpu.visible_cards(None) == []
    else:  # pragma: no cover - a GPU host
        nvml.shutdown()


def test_no_gpu_snapshot() -> None:
    snap = gpu.no_gpu_snapshot("NVML did not initialise")
    assert snap == {"gpu": False, "reason": "NVML did not initialise"}
    assert gpu.memory_used_mib(snap) == {} and gpu.require_idle(snap) == []
    assert gpu.diff(snap, snap) == []
    problems = gpu.verify_power_limits(snap, gpu.parse_power_limit("verify:300"))
    assert problems == ["no GPU (NVML did not initialise): cannot check power limit 'verify:300'"]


# ------------------------------------------------------------------------------------ which cards


def three_cards() -> FakeNvml:
    return FakeNvml([FakeCard(uuid=UUID_A), FakeCard(uuid=UUID_B), FakeCard(uuid=UUID_C)])


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, [0, 1, 2]),
        ("", []),
        ("2,0", [2, 0]),
        (" 1 ", [1]),
        ("GPU-aaaa", [0]),
        ("gpu-BBBB3333", [2]),
        ("GPU-bbbb3333-0000-0000-0000-000000000000,0", [2, 0]),
        ("0,7,1", [0]),  # CUDA stops at the first entry naming no card
        ("1,GPU-bbbb,0", [1]),  # ambiguous prefix: stop
        ("0,0,1", [0]),  # a card named twice: stop
        ("MIG-abc,0", []),
        ("GPU-", []),
    ],
)
def test_visible_cards_follow_cuda_visible_devices(value: str | None, expected: list[int]) -> None:
    nvml = three_cards()
    env = {} if value is None else {"CUDA_VISIBLE_DEVICES": value}
    assert [c.index for c in gpu.visible_cards(nvml, env)] == expected


def test_visible_cards_carry_uuids() -> None:
    nvml = three_cards()
    cards = gpu.visible_cards(nvml, {"CUDA_VISIBLE_DEVICES": "GPU-bbbb2"})
    assert cards == [CardRef(1, UUID_B)] and cards[0].label == "GPU 1 (GPU-bbbb2222)"
    assert gpu.visible_cards(None, {}) == []


# -------------------------------------------------------------------------------------------- diff


def test_diff_lines() -> None:
    nvml = two_cards()
    cards = refs(nvml)
    before = gpu.snapshot(nvml, cards)
    assert gpu.diff(before, gpu.snapshot(nvml, cards)) == []
    nvml.cards[0].power_limit_mw = 300_000
    nvml.cards[0].persistence_mode = False
    nvml.cards[1].sm_app_clock_mhz = 1500
    nvml.cards[1].compute_processes = [(111, 4096 * gpu.MIB), (222, None)]
    nvml._driver_version = "575.51.03"
    nvml.cards[1].temperature_c = 80  # not a setting: not reported
    after = gpu.snapshot(nvml, cards)
    assert gpu.diff(before, after, own_pids=[222]) == [
        "driver changed: 570.133.20 → 575.51.03",
        "GPU 0 (GPU-aaaa1111): power limit 700 W → 300 W",
        "GPU 0 (GPU-aaaa1111): enforced power limit 700 W → 300 W",
        "GPU 0 (GPU-aaaa1111): persistence mode on → off",
        "GPU 1 (GPU-bbbb2222): SM applications clock 1980 MHz → 1500 MHz",
        "GPU 1 (GPU-bbbb2222): new foreign compute process pid 111 (4096 MiB)",
    ]


def test_diff_cards_and_availability() -> None:
    nvml = two_cards()
    both = gpu.snapshot(nvml, refs(nvml))
    one = gpu.snapshot(nvml, refs(nvml)[:1])
    assert gpu.diff(both, one) == ["GPU 1 (GPU-bbbb2222) is gone"]
    assert gpu.diff(one, both) == ["GPU 1 (GPU-bbbb2222) appeared"]
    assert gpu.diff(both, gpu.no_gpu_snapshot("GPU is lost")) == ["GPU availability changed: available → GPU is lost"]


# ----------------------------------------------------------------------------------------- sampler


def test_sampler_writes_jsonl_and_aggregates_windows(tmp_path: Path) -> None:
    clock = FakeClock(1000.0)
    nvml = two_cards()
    timeline = {
        # t: (card 0 temp, sm clock, power mW, mask, limit mW)
        1000.0: (40, 1980, 300_000, 0x0, 700_000),
        1000.25: (55, 1900, 650_000, 0x4, 700_000),
        1000.5: (70, 1700, 700_000, 0x4 | 0x20, 700_000),
        1000.75: (60, 1980, 500_000, 0x0, 600_000),
    }

    def value(slot: int) -> Any:
        return lambda: timeline[clock.now][slot]

    card = nvml.cards[0]
    card.temperature_c, card.sm_clock_mhz, card.power_usage_mw = value(0), value(1), value(2)
    card.throttle_mask, card.power_limit_mw = value(3), value(4)
    path = tmp_path / "run" / "gpu.jsonl"
    sampler = Sampler(nvml, refs(nvml), path, clock=clock)
    for t in timeline:  # no thread: sample_once() on the fake clock is fully deterministic
        clock.now = t
        sampler.sample_once()
    sampler.stop()

    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(lines) == 8
    assert lines[0] == {
        "t_unix_s": 1000.0,
        "card": UUID_A,
        "index": 0,
        "power_w": 300.0,
        "power_limit_w": 700.0,
        "sm_clock_mhz": 1980,
        "mem_clock_mhz": 2619,
        "temp_c": 40,
        "util_gpu_pct": 0,
        "util_mem_pct": 0,
        "memory_used_mib": 600,
        "throttle_reasons": [],
    }
    assert lines[1]["card"] == UUID_B

    w = sampler.window(1000.2, 1000.6)
    a = w["cards"][UUID_A]
    assert a == {
        "max_temp_c": 70,
        "min_sm_clock_mhz": 1700,
        "mean_power_w": pytest.approx(675.0),
        "max_power_w": 700.0,
        "throttle_reasons_seen": ["sw_power_cap", "sw_thermal_slowdown"],
        "power_limit_changed": False,
        "samples": 2,
    }
    assert w["samples"] == 4 and w["max_temp_c"] == 70 and w["min_sm_clock_mhz"] == 345  # card B idles
    assert w["mean_power_w"] == pytest.approx((650 + 700 + 80 + 80) / 4)
    assert w["cards"][UUID_B]["throttle_reasons_seen"] == ["gpu_idle"]
    assert w["throttle_reasons_seen"] == ["gpu_idle", "sw_power_cap", "sw_thermal_slowdown"]
    assert w["power_limit_changed"] is False
    assert (w["t0_unix_s"], w["t1_unix_s"]) == (1000.2, 1000.6)

    # the limit changed between the last sample before the window and the one inside it
    late = sampler.window(1000.7, 1001.0)
    assert late["power_limit_changed"] is True and late["cards"][UUID_A]["power_limit_changed"] is True
    assert late["cards"][UUID_B]["power_limit_changed"] is False

    empty = sampler.window(1000.1, 1000.2)
    assert empty["samples"] == 0 and empty["max_temp_c"] is None and empty["mean_power_w"] is None
    assert gpu.drift(empty) == ([], None)


def sampler_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "kvcache-gpu-sampler"]


def test_sampler_thread_samples_and_stops(tmp_path: Path) -> None:
    nvml = two_cards()
    temps = iter(range(30, 100_000))
    nvml.cards[0].temperature_c = lambda: next(temps)  # changes on every read
    path = tmp_path / "gpu.jsonl"
    sampler = Sampler(nvml, refs(nvml), path, hz=200)
    with sampler:
        assert sampler.running and len(sampler_threads()) == 1
        deadline = threading.Event()
        for _ in range(200):
            if len(sampler.samples()) >= 10:
                break
            deadline.wait(0.01)
        with pytest.raises(RuntimeError, match="already started"):
            sampler.start()
    assert not sampler.running and sampler_threads() == []
    sampler.stop()  # idempotent
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(lines) == len(sampler.samples()) >= 10
    temps_seen = [line["temp_c"] for line in lines if line["card"] == UUID_A]
    assert temps_seen == sorted(temps_seen) and len(set(temps_seen)) == len(temps_seen)
    times = [line["t_unix_s"] for line in lines]
    assert times == sorted(times)
    w = sampler.window(times[0], times[-1])
    assert w["samples"] == len(lines) and w["max_temp_c"] == max(temps_seen)
    assert sampler.errors == 0


def test_sampler_survives_a_failing_read() -> None:
    nvml = two_cards()
    calls = iter(range(1_000_000))

    def flaky() -> int:
        if next(calls) % 2 == 0:
            raise OSError("boom")
        return 50

    nvml.cards[0].temperature_c = flaky
    with Sampler(nvml, refs(nvml), None, hz=500) as sampler:
        for _ in range(200):
            if sampler.errors >= 2 and sampler.samples():
                break
            threading.Event().wait(0.01)
    assert sampler.errors >= 2 and sampler.last_error == "OSError: boom"
    assert sampler.samples() and sampler_threads() == []


def test_sampler_rejects_bad_rate() -> None:
    with pytest.raises(ValueError, match="positive"):
        Sampler(two_cards(), [], hz=0)


# -------------------------------------------------------------------------------------------- drift


def window_with(**card: Any) -> dict[str, Any]:
    agg = {
        "max_temp_c": 60,
        "min_sm_clock_mhz": 1980,
        "mean_power_w": 500.0,
        "max_power_w": 600.0,
        "throttle_reasons_seen": [],
        "power_limit_changed": False,
        "samples": 3,
    }
    agg.update(card)
    return {**agg, "cards": {UUID_A: agg}}


def test_drift_thermal_is_excluded() -> None:
    flags, reason = gpu.drift(window_with(throttle_reasons_seen=["hw_slowdown", "hw_thermal_slowdown"]))
    assert flags == ["gpu_thermal_throttle", "gpu_hw_slowdown"]
    assert reason == "gpu_thermal_throttle: hw_thermal_slowdown on GPU-aaaa1111"


def test_drift_power_cap_is_flagged_only() -> None:
    assert gpu.drift(window_with(throttle_reasons_seen=["sw_power_cap"])) == (["gpu_power_cap"], None)
    flags, reason = gpu.drift(window_with(throttle_reasons_seen=["sw_power_cap"]), DriftRules(exclude_power_cap=True))
    assert flags == ["gpu_power_cap"] and reason == "gpu_power_cap: sw_power_cap on GPU-aaaa1111"


def test_drift_temperature_limit() -> None:
    assert gpu.drift(window_with(max_temp_c=84)) == ([], None)
    flags, reason = gpu.drift(window_with(max_temp_c=84), DriftRules(max_temp_c=80))
    assert flags == ["gpu_temp_over_limit"] and reason == "gpu_temp_over_limit: 84 °C > 80 °C on GPU-aaaa1111"


def test_drift_power_limit_change_and_switches() -> None:
    flags, reason = gpu.drift(window_with(power_limit_changed=True))
    assert flags == ["gpu_power_limit_changed"] and reason is not None
    relaxed = DriftRules(exclude_thermal=False, exclude_hw_slowdown=False, exclude_power_limit_change=False)
    window = window_with(power_limit_changed=True, throttle_reasons_seen=["sw_thermal_slowdown", "hw_slowdown"])
    flags, reason = gpu.drift(window, relaxed)
    assert flags == ["gpu_thermal_throttle", "gpu_hw_slowdown", "gpu_power_limit_changed"] and reason is None
    assert gpu.drift(window_with(throttle_reasons_seen=["gpu_idle", "applications_clocks_setting"])) == ([], None)


# ----------------------------------------------------------------------------------- power pinning


@pytest.mark.parametrize(
    ("spec", "verify", "all_w", "by_index", "by_uuid"),
    [
        ("300", False, 300.0, {}, {}),
        ("  450W ", False, 450.0, {}, {}),
        ("0:300,1:250", False, None, {0: 300.0, 1: 250.0}, {}),
        ("GPU-aaaa1111:300", False, None, {}, {"GPU-aaaa1111": 300.0}),
        ("0:300, GPU-bbbb:275.5", False, None, {0: 300.0}, {"GPU-bbbb": 275.5}),
        ("verify:300", True, 300.0, {}, {}),
        ("verify:0:300,1:250", True, None, {0: 300.0, 1: 250.0}, {}),
        ("Verify:GPU-aaaa:300", True, None, {}, {"GPU-aaaa": 300.0}),
    ],
)
def test_parse_power_limit(
    spec: str, verify: bool, all_w: float | None, by_index: dict[int, float], by_uuid: dict[str, float]
) -> None:
    plan = gpu.parse_power_limit(spec)
    assert (plan.verify_only, plan.all_w, dict(plan.by_index), dict(plan.by_uuid_prefix)) == (
        verify,
        all_w,
        by_index,
        by_uuid,
    )


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("", "nothing after the option"),
        ("verify:", "nothing after verify:"),
        ("abc", "'abc' is not a positive number of watts"),
        ("0", "'0' is not a positive number of watts"),
        ("-5", "'-5' is not a positive number of watts"),
        ("0:300,250", "'250' needs the form INDEX:WATTS"),
        ("0:300,:250", "':250' needs the form INDEX:WATTS"),
        ("0:fast", "'0:fast': 'fast' is not a positive number of watts"),
        ("gpu0:300", "'gpu0' in 'gpu0:300' is neither a GPU index nor a GPU-… UUID"),
        ("0:300,0:250", "GPU index 0 is given twice"),
        ("GPU-ab:300,gpu-AB:250", "gpu-AB is given twice"),
    ],
)
def test_parse_power_limit_errors(spec: str, message: str) -> None:
    with pytest.raises(ValueError) as info:
        gpu.parse_power_limit(spec)
    assert message in str(info.value)


def test_plan_targets_name_only_visible_cards() -> None:
    cards = [CardRef(0, UUID_A), CardRef(1, UUID_B), CardRef(2, UUID_C)]
    assert gpu.parse_power_limit("0:300,GPU-bbbb3:250").targets(cards) == {UUID_A: 300.0, UUID_C: 250.0}
    with pytest.raises(GpuError, match="GPU index 5 is not a visible card"):
        gpu.parse_power_limit("5:300").targets(cards)
    with pytest.raises(GpuError, match="GPU-bbbb matches 2 cards"):
        gpu.parse_power_limit("GPU-bbbb:300").targets(cards)
    with pytest.raises(GpuError, match="GPU-ffff matches no visible card"):
        gpu.parse_power_limit("GPU-ffff:300").targets(cards)
    with pytest.raises(GpuError, match="named twice"):
        gpu.parse_power_limit("0:300,GPU-aaaa:250").targets(cards)


def test_apply_verify_restore_on_the_fake() -> None:
    nvml = two_cards()
    cards = refs(nvml)
    plan = gpu.parse_power_limit("0:300,1:250")
    assert gpu.verify_power_limits(gpu.snapshot(nvml, cards), plan) == [
        "GPU 0 (GPU-aaaa1111): power limit is 700 W, wanted 300 W",
        "GPU 1 (GPU-bbbb2222): power limit is 700 W, wanted 250 W",
    ]
    originals = gpu.apply_power_limits(nvml, cards, plan)
    assert originals == {UUID_A: 700.0, UUID_B: 700.0}
    assert nvml.calls == [("set_power_limit_mw", 0, 300_000), ("set_power_limit_mw", 1, 250_000)]
    assert gpu.verify_power_limits(gpu.snapshot(nvml, cards), plan) == []
    assert gpu.verify_power_limits(gpu.snapshot(nvml, cards), gpu.parse_power_limit("verify:0:300")) == []
    gpu.restore_power_limits(nvml, originals)
    assert [c.power_limit_mw for c in nvml.cards] == [700_000, 700_000]
    assert nvml.calls[-2:] == [("set_power_limit_mw", 0, 700_000), ("set_power_limit_mw", 1, 700_000)]


def test_verify_only_plan_never_sets() -> None:
    nvml = two_cards()
    assert gpu.apply_power_limits(nvml, refs(nvml), gpu.parse_power_limit("verify:300")) == {}
    assert nvml.calls == []


def test_verify_reports_enforced_and_unreadable_limits() -> None:
    nvml = two_cards()
    nvml.cards[0].power_limit_mw = 300_000
    nvml.cards[0].power_limit_enforced_mw = 280_000
    nvml.cards[1].power_limit_mw = None
    problems = gpu.verify_power_limits(gpu.snapshot(nvml, refs(nvml)), gpu.parse_power_limit("verify:300"))
    assert problems == [
        "GPU 0 (GPU-aaaa1111): enforced power limit is 280 W, below the wanted 300 W",
        "GPU 1 (GPU-bbbb2222): power limit unreadable, wanted 300 W",
    ]
    assert gpu.verify_power_limits(gpu.snapshot(nvml, refs(nvml)), gpu.parse_power_limit("9:300")) == [
        "--kv-gpu-power-limit '9:300': GPU index 9 is not a visible card (visible: 0, 1)"
    ]


def test_apply_out_of_range_sets_nothing() -> None:
    nvml = two_cards()
    with pytest.raises(GpuError) as info:
        gpu.apply_power_limits(nvml, refs(nvml), gpu.parse_power_limit("0:300,1:150"))
    assert str(info.value) == (
        "--kv-gpu-power-limit '0:300,1:150': 150 W is outside GPU 1 (GPU-bbbb2222)'s range 200–700 W"
    )
    assert nvml.calls == []


def test_apply_without_root_raises_root_required() -> None:
    nvml = two_cards(allow_set=False)
    with pytest.raises(RootRequiredError) as info:
        gpu.apply_power_limits(nvml, refs(nvml), gpu.parse_power_limit("300"))
    assert isinstance(info.value, PermissionError) and isinstance(info.value, GpuError)
    message = str(info.value)
    assert "needs root" in message and "--kv-gpu-power-limit=verify:300" in message
    assert "nvidia-smi -i 0 -pl 300" in message
    assert [c.power_limit_mw for c in nvml.cards] == [700_000, 700_000]


class PartlyRootNvml(FakeNvml):
    """Card 0 may be changed, card 1 refuses: the changed card must be put back."""

    def set_power_limit_mw(self, index: int, limit_mw: int) -> None:
        if index == 1:
            self.calls.append(("set_power_limit_mw", index, limit_mw))
            raise PermissionError("Insufficient Permissions")
        super().set_power_limit_mw(index, limit_mw)


def test_apply_failing_midway_restores_what_it_changed() -> None:
    nvml = PartlyRootNvml([FakeCard(uuid=UUID_A), FakeCard(uuid=UUID_B)])
    with pytest.raises(RootRequiredError):
        gpu.apply_power_limits(nvml, refs(nvml), gpu.parse_power_limit("300"))
    assert nvml.calls == [
        ("set_power_limit_mw", 0, 300_000),
        ("set_power_limit_mw", 1, 300_000),
        ("set_power_limit_mw", 0, 700_000),
    ]
    assert nvml.cards[0].power_limit_mw == 700_000


def test_restore_tries_every_card_and_reports_failures() -> None:
    nvml = PartlyRootNvml([FakeCard(uuid=UUID_A), FakeCard(uuid=UUID_B)])
    nvml.cards[0].power_limit_mw = 300_000
    with pytest.raises(GpuError) as info:
        gpu.restore_power_limits(nvml, {UUID_A: 700.0, UUID_B: 700.0, "GPU-ffff": 700.0})
    assert str(info.value) == (
        "could not restore GPU power limits: GPU 1 (GPU-bbbb2222): Insufficient Permissions; GPU-ffff: card not found"
    )
    assert nvml.cards[0].power_limit_mw == 700_000


# ---------------------------------------------------------------------------------- idle and settle


def test_require_idle() -> None:
    nvml = two_cards()
    assert gpu.require_idle(gpu.snapshot(nvml, refs(nvml))) == []
    nvml.cards[0].compute_processes = [(4242, 2048 * gpu.MIB), (os_pid := 99, 10 * gpu.MIB)]
    nvml.cards[1].util_gpu_pct = 35
    snap = gpu.snapshot(nvml, refs(nvml))
    assert gpu.require_idle(snap, own_pids=[os_pid]) == [
        "GPU 0 (GPU-aaaa1111): foreign compute process pid 4242 (2048 MiB)",
        "GPU 1 (GPU-bbbb2222): utilization 35% > 10%",
    ]
    assert gpu.require_idle(snap, max_util_pct=50, own_pids=[4242, 99]) == []


def test_settle_waits_for_the_card_to_cool() -> None:
    clock = FakeClock(0.0)
    nvml = two_cards()
    nvml.cards[0].temperature_c = lambda: max(40, 70 - int(clock.now) * 5)  # 70 °C falling 5 °C/s
    nvml.cards[1].power_usage_mw = lambda: 90_000 if clock.now < 2 else 70_000
    result = gpu.settle(
        nvml, refs(nvml), max_temp_c=50, max_power_w=80, timeout_s=60, poll_s=1, clock=clock, sleep=clock.sleep
    )
    assert result["settled"] is True and result["waited_s"] == 4.0 and result["polls"] == 5
    assert result["cards"] == {UUID_A: {"temp_c": 50, "power_w": 80.0}, UUID_B: {"temp_c": 30, "power_w": 70.0}}


def test_settle_gives_up_at_the_timeout() -> None:
    clock = FakeClock(0.0)
    nvml = two_cards()
    nvml.cards[0].temperature_c = 90
    nvml.cards[1].temperature_c = None  # unreadable: does not block
    result = gpu.settle(
        nvml, refs(nvml), max_temp_c=50, max_power_w=None, timeout_s=2.5, poll_s=1, clock=clock, sleep=clock.sleep
    )
    assert result["settled"] is False and result["waited_s"] == 2.5 and result["polls"] == 4
    assert result["cards"][UUID_A]["temp_c"] == 90


def test_memory_used_mib() -> None:
    nvml = two_cards()
    nvml.cards[1].memory_used_bytes = 120_000 * gpu.MIB
    assert gpu.memory_used_mib(gpu.snapshot(nvml, refs(nvml))) == {UUID_A: 600, UUID_B: 120_000}
