"""Drift rules (`pytest_kvcache.gpu.drift`): which GPU events flag a request and which exclude it."""

from __future__ import annotations

from typing import Any

from pytest_kvcache.gpu.drift import DriftRules, drift
from tests.unit.gpu.helpers import UUID_A

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
    flags, reason = drift(window_with(throttle_reasons_seen=["hw_slowdown", "hw_thermal_slowdown"]))
    assert flags == ["gpu_thermal_throttle", "gpu_hw_slowdown"]
    assert reason == "gpu_thermal_throttle: hw_thermal_slowdown on GPU-aaaa1111"


def test_drift_power_cap_is_flagged_only() -> None:
    assert drift(window_with(throttle_reasons_seen=["sw_power_cap"])) == (["gpu_power_cap"], None)
    flags, reason = drift(window_with(throttle_reasons_seen=["sw_power_cap"]), DriftRules(exclude_power_cap=True))
    assert flags == ["gpu_power_cap"] and reason == "gpu_power_cap: sw_power_cap on GPU-aaaa1111"


def test_drift_temperature_limit() -> None:
    assert drift(window_with(max_temp_c=84)) == ([], None)
    flags, reason = drift(window_with(max_temp_c=84), DriftRules(max_temp_c=80))
    assert flags == ["gpu_temp_over_limit"] and reason == "gpu_temp_over_limit: 84 °C > 80 °C on GPU-aaaa1111"


def test_drift_power_limit_change_and_switches() -> None:
    flags, reason = drift(window_with(power_limit_changed=True))
    assert flags == ["gpu_power_limit_changed"] and reason is not None
    relaxed = DriftRules(exclude_thermal=False, exclude_hw_slowdown=False, exclude_power_limit_change=False)
    window = window_with(power_limit_changed=True, throttle_reasons_seen=["sw_thermal_slowdown", "hw_slowdown"])
    flags, reason = drift(window, relaxed)
    assert flags == ["gpu_thermal_throttle", "gpu_hw_slowdown", "gpu_power_limit_changed"] and reason is None
    assert drift(window_with(throttle_reasons_seen=["gpu_idle", "applications_clocks_setting"])) == ([], None)
