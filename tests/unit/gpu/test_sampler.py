"""The GPU sampler (`pytest_kvcache.gpu.sampler`) on the fake NVML: ``gpu.jsonl``, windows, its thread."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest

from pytest_kvcache.gpu.drift import drift
from pytest_kvcache.gpu.sampler import Sampler
from tests.unit.gpu.helpers import UUID_A, UUID_B, FakeClock, refs, two_cards

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
    assert drift(empty) == ([], None)


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
