"""The run-level GPU state on a fake NVML layer: setting power caps cannot run on these machines (no GPU
here, and the lent H200 must never be changed), so the setter path is tested only against FakeNvml."""

from __future__ import annotations

import json
import time
from pathlib import Path

from pytest_kvcache.gpu.state import GpuOptions, GpuState
from pytest_kvcache.testing.fake_nvml import FakeCard, FakeNvml


def test_no_gpu_records_why(tmp_path: Path) -> None:
    state = GpuState(GpuOptions())
    state.open(tmp_path)  # this machine has no NVML
    snap, problems = state.before_boot()
    assert snap["gpu"] is False and snap["reason"] and problems == []
    assert state.drift(0.0, 1.0) == (None, [], None)
    assert state.close() == []


def test_pin_verify_sample_drift_and_restore(tmp_path: Path) -> None:
    hot = {"value": 0x1}
    card = FakeCard(uuid="GPU-aaaa-1111", throttle_mask=lambda: hot["value"], temperature_c=40)
    nvml = FakeNvml([card])
    state = GpuState(GpuOptions(power_limit="450", hz=50.0))
    state.open(tmp_path, nvml=nvml)
    assert state.originals == {"GPU-aaaa-1111": 700.0}
    snap, problems = state.before_boot()
    assert problems == [] and snap["cards"][0]["power_limit_w"] == 450.0
    t0 = time.time()
    time.sleep(0.15)
    window, flags, excluded = state.drift(t0, time.time())
    assert window is not None and window["samples"] > 0 and flags == [] and excluded is None
    hot["value"] = 0x40  # hardware thermal slowdown: that window's samples must not count
    t1 = time.time()
    time.sleep(0.15)
    _, flags, excluded = state.drift(t1, time.time())
    assert "gpu_thermal_throttle" in flags and excluded is not None and "hw_thermal_slowdown" in excluded
    assert state.close() == []
    assert nvml.power_limit_mw(0) == 700_000  # restored
    lines = (tmp_path / "gpu.jsonl").read_text().splitlines()
    assert lines and json.loads(lines[0])["card"] == "GPU-aaaa-1111"


def test_verify_only_never_sets_and_reports_a_mismatch(tmp_path: Path) -> None:
    nvml = FakeNvml([FakeCard(uuid="GPU-bbbb")])
    state = GpuState(GpuOptions(power_limit="verify:300"))
    state.open(tmp_path, nvml=nvml)
    _, problems = state.before_boot()
    assert problems and "300" in problems[0]
    assert nvml.calls == []
    state.close()


def test_without_root_every_boot_is_refused_with_the_reason(tmp_path: Path) -> None:
    nvml = FakeNvml([FakeCard(uuid="GPU-cccc")], allow_set=False)
    state = GpuState(GpuOptions(power_limit="300"))
    state.open(tmp_path, nvml=nvml)
    _, problems = state.before_boot()
    assert problems and "cannot set GPU power limits (300)" in problems[0] and "root" in problems[0].lower()
    state.close()


def test_each_boot_follows_only_the_cards_its_engine_sees(tmp_path: Path) -> None:
    """Four cards, two arms pinned to two each (CUDA_VISIBLE_DEVICES 0,1 and 2,3): each boot's snapshot,
    idle check and drift name only its cards; the sampler follows the union."""
    hot = {"value": 0x1}
    cards = [
        FakeCard(uuid=f"GPU-{i}{i}{i}{i}-0000", throttle_mask=(lambda: hot["value"]) if i == 0 else (lambda: 0x1))
        for i in range(4)
    ]
    nvml = FakeNvml(cards)
    state = GpuState(GpuOptions(hz=50.0, require_idle=True))
    state.open(tmp_path, nvml=nvml, devices=["0,1", "2,3"])
    assert [c.index for c in state.cards] == [0, 1, 2, 3]
    first, second = state.cards_of("0,1"), state.cards_of("2,3")
    assert [c.index for c in second] == [2, 3] and state.cards_of(None) == state.cards
    nvml.cards[2].compute_processes = [(4242, 1024)]  # someone else's job on card 2: the second group is busy
    snap, problems = state.before_boot(first)
    assert [c["uuid"] for c in snap["cards"]] == ["GPU-0000-0000", "GPU-1111-0000"] and problems == []
    snap, problems = state.before_boot(second)
    assert [c["uuid"] for c in snap["cards"]] == ["GPU-2222-0000", "GPU-3333-0000"]
    assert problems and "4242" in problems[0]
    hot["value"] = 0x40  # card 0 slows down: a request on cards 2,3 is not flagged, one on 0,1 is
    t0 = time.time()
    time.sleep(0.15)
    window, flags, _ = state.drift(t0, time.time(), second)
    assert window is not None and set(window["cards"]) == {"GPU-2222-0000", "GPU-3333-0000"} and flags == []
    assert "gpu_thermal_throttle" in state.drift(t0, time.time(), first)[1]
    none = state.snapshot(state.cards_of(""))
    assert none["gpu"] is False and none["reason"] == "this engine sees no GPU"
    state.close()
    state = GpuState(GpuOptions())
    state.open(tmp_path, nvml=FakeNvml(cards), devices=[""])  # docker without --kv-gpus: no card at all
    assert not state.available and state.reason == "no arm's engine sees a GPU"
    state.close()
