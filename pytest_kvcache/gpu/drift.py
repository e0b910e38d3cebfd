"""Drift rules: which GPU events during a request (thermal or hardware slowdown, power cap, a power
limit changing, a temperature limit) flag it, and which exclude it from statistics. Input: a
``Sampler.window()``. Plain Python: no pytest, no server access."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

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
