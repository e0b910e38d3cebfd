"""Snapshots, diffs, idleness and settling (`pytest_kvcache.gpu.snapshot`) on the fake NVML."""

from __future__ import annotations

import json

from pytest_kvcache.config.grammars import parse_power_limit
from pytest_kvcache.gpu.nvml import MIB
from pytest_kvcache.gpu.power import verify_power_limits
from pytest_kvcache.gpu.snapshot import diff, memory_used_mib, no_gpu_snapshot, require_idle, settle, snapshot
from pytest_kvcache.testing.fake_nvml import FakeCard, FakeNvml
from tests.unit.gpu.helpers import UUID_A, UUID_B, FakeClock, refs, two_cards

# ---------------------------------------------------------------------------------------- snapshot


def test_snapshot_fields() -> None:
    nvml = two_cards(p2p={(0, 1): 0, (1, 0): 5})
    nvml.cards[0].compute_processes = [(4242, 2048 * MIB)]
    nvml.cards[1].throttle_mask = 0x4
    snap = snapshot(nvml, refs(nvml), clock=lambda: 1234.5)
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
    snap = snapshot(nvml, refs(nvml))
    state = snap["cards"][0]
    for key in ("power_limit_min_w", "power_limit_max_w", "temp_c", "throttle_mask", "throttle_reasons"):
        assert state[key] is None, key
    assert state["memory_used_mib"] is None and state["memory_total_mib"] is None
    assert state["compute_processes"] is None and state["persistence_mode"] is None
    assert snap["driver_version"] is None and snap["cuda_driver_version"] is None
    assert memory_used_mib(snap) == {}


def test_no_gpu_snapshot() -> None:
    snap = no_gpu_snapshot("NVML did not initialise")
    assert snap == {"gpu": False, "reason": "NVML did not initialise"}
    assert memory_used_mib(snap) == {} and require_idle(snap) == []
    assert diff(snap, snap) == []
    problems = verify_power_limits(snap, parse_power_limit("verify:300"))
    assert problems == ["no GPU (NVML did not initialise): cannot check power limit 'verify:300'"]


# -------------------------------------------------------------------------------------------- diff


def test_diff_lines() -> None:
    nvml = two_cards()
    cards = refs(nvml)
    before = snapshot(nvml, cards)
    assert diff(before, snapshot(nvml, cards)) == []
    nvml.cards[0].power_limit_mw = 300_000
    nvml.cards[0].persistence_mode = False
    nvml.cards[1].sm_app_clock_mhz = 1500
    nvml.cards[1].compute_processes = [(111, 4096 * MIB), (222, None)]
    nvml._driver_version = "575.51.03"
    nvml.cards[1].temperature_c = 80  # not a setting: not reported
    after = snapshot(nvml, cards)
    assert diff(before, after, own_pids=[222]) == [
        "driver changed: 570.133.20 → 575.51.03",
        "GPU 0 (GPU-aaaa1111): power limit 700 W → 300 W",
        "GPU 0 (GPU-aaaa1111): enforced power limit 700 W → 300 W",
        "GPU 0 (GPU-aaaa1111): persistence mode on → off",
        "GPU 1 (GPU-bbbb2222): SM applications clock 1980 MHz → 1500 MHz",
        "GPU 1 (GPU-bbbb2222): new foreign compute process pid 111 (4096 MiB)",
    ]


def test_diff_cards_and_availability() -> None:
    nvml = two_cards()
    both = snapshot(nvml, refs(nvml))
    one = snapshot(nvml, refs(nvml)[:1])
    assert diff(both, one) == ["GPU 1 (GPU-bbbb2222) is gone"]
    assert diff(one, both) == ["GPU 1 (GPU-bbbb2222) appeared"]
    assert diff(both, no_gpu_snapshot("GPU is lost")) == ["GPU availability changed: available → GPU is lost"]


# ---------------------------------------------------------------------------------- idle and settle


def test_require_idle() -> None:
    nvml = two_cards()
    assert require_idle(snapshot(nvml, refs(nvml))) == []
    nvml.cards[0].compute_processes = [(4242, 2048 * MIB), (os_pid := 99, 10 * MIB)]
    nvml.cards[1].util_gpu_pct = 35
    snap = snapshot(nvml, refs(nvml))
    assert require_idle(snap, own_pids=[os_pid]) == [
        "GPU 0 (GPU-aaaa1111): foreign compute process pid 4242 (2048 MiB)",
        "GPU 1 (GPU-bbbb2222): utilization 35% > 10%",
    ]
    assert require_idle(snap, max_util_pct=50, own_pids=[4242, 99]) == []


def test_settle_waits_for_the_card_to_cool() -> None:
    clock = FakeClock(0.0)
    nvml = two_cards()
    nvml.cards[0].temperature_c = lambda: max(40, 70 - int(clock.now) * 5)  # 70 °C falling 5 °C/s
    nvml.cards[1].power_usage_mw = lambda: 90_000 if clock.now < 2 else 70_000
    result = settle(
        nvml, refs(nvml), max_temp_c=50, max_power_w=80, timeout_s=60, poll_s=1, clock=clock, sleep=clock.sleep
    )
    assert result["settled"] is True and result["waited_s"] == 4.0 and result["polls"] == 5
    assert result["cards"] == {UUID_A: {"temp_c": 50, "power_w": 80.0}, UUID_B: {"temp_c": 30, "power_w": 70.0}}


def test_settle_gives_up_at_the_timeout() -> None:
    clock = FakeClock(0.0)
    nvml = two_cards()
    nvml.cards[0].temperature_c = 90
    nvml.cards[1].temperature_c = None  # unreadable: does not block
    result = settle(
        nvml, refs(nvml), max_temp_c=50, max_power_w=None, timeout_s=2.5, poll_s=1, clock=clock, sleep=clock.sleep
    )
    assert result["settled"] is False and result["waited_s"] == 2.5 and result["polls"] == 4
    assert result["cards"][UUID_A]["temp_c"] == 90


def test_memory_used_mib() -> None:
    nvml = two_cards()
    nvml.cards[1].memory_used_bytes = 120_000 * MIB
    assert memory_used_mib(snapshot(nvml, refs(nvml))) == {UUID_A: 600, UUID_B: 120_000}
