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
