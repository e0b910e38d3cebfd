"""Energy per token from NVML's total-energy counter (`pytest_kvcache.gpu.energy`, `pytest_kvcache.report.energy`)
on the fake NVML: a power schedule known exactly, a counter that moves in ~100 ms steps as an H200's does, a card
without the counter (NotSupported) whose power samples are integrated instead — and the known joules back.

No GPU can run here: the fake NVML stands in for the card (docs/testing.md); the counter's behaviour it copies
(steps about every 100 ms, 0 mJ over a 12 ms window) was measured on the H200 (docs/gpu.md).
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from pytest_kvcache.gpu.energy import EnergyMeter
from pytest_kvcache.gpu.sampler import Sampler
from pytest_kvcache.metrics.catalogue import joules_text
from pytest_kvcache.model.evidence import Evidence
from pytest_kvcache.report.energy import (
    MIN_STEPS_MEAN,
    MIN_STEPS_TOTAL,
    CardTrace,
    Energy,
    judge_unit,
    method_line,
    request_windows,
    with_energy,
)
from pytest_kvcache.testing.fake_nvml import FakeCard, FakeNvml, PowerTrace
from tests.unit.gpu.helpers import UUID_A, UUID_B, FakeClock, refs

METER_DT = 0.02  # the meter's 50 Hz


def evidence_for(*cards: str) -> dict[str, Evidence]:
    """One boot ``b`` on ``cards`` (its ``gpu_before``, where the report finds a boot's cards)."""
    return {"b": {"gpu_before": {"gpu": True, "cards": [{"uuid": c, "index": i} for i, c in enumerate(cards)]}}}


def run_meter(meter: EnergyMeter, clock: FakeClock, until: float, dt: float = METER_DT) -> None:
    """The meter's thread, on a fake clock: one read every ``dt`` (jittered as a real thread's wake-ups are)."""
    jitter = np.random.default_rng(7)
    while clock.now < until:
        clock.now += dt * (1 + 0.2 * (jitter.random() - 0.5))
        meter.read_once()


# ------------------------------------------------------------------------------------------ the fake's counter


def test_the_fake_counter_moves_in_steps_of_the_cards_power() -> None:
    clock = FakeClock(1000.0)
    nvml = FakeNvml([FakeCard(uuid=UUID_A, power_usage_mw=80_000)], clock=clock)
    assert nvml.total_energy_mj(0) == 0  # the first read starts the counter
    clock.now = 1000.05
    assert nvml.total_energy_mj(0) == 0  # inside a step: a short window reads 0 mJ, as on the H200
    clock.now = 1000.1
    assert nvml.total_energy_mj(0) == 8_000  # 80 W × 100 ms
    clock.now = 1000.39
    assert nvml.total_energy_mj(0) == 24_000  # two more steps; the third not yet over


def test_a_card_without_the_counter_is_not_supported() -> None:
    nvml = FakeNvml([FakeCard(uuid=UUID_A, total_energy_mj=None)])
    assert nvml.total_energy_mj(0) is None
    assert "NotSupported" in nvml.errors["nvmlDeviceGetTotalEnergyConsumption"]


def test_a_power_trace_knows_its_joules_and_counts_them_in_steps() -> None:
    clock = FakeClock(1000.0)
    trace = PowerTrace([(1000.0, 100.0), (1001.0, 500.0), (1002.5, 100.0)], clock=clock)
    assert trace.joules(1000.5, 1003.0) == pytest.approx(0.5 * 100 + 1.5 * 500 + 0.5 * 100)
    clock.now = 1001.25
    assert trace.power_mw() == 500_000
    assert trace.energy_mj() - trace.base_mj == round(trace.joules(1000.0, 1001.2) * 1000)  # up to the last step
    with pytest.raises(ValueError, match="time order"):
        PowerTrace([(2.0, 1.0), (1.0, 1.0)])


# ------------------------------------------------------------------------------------------ the meter


def test_the_meter_writes_a_line_per_step_dated_between_the_two_reads(tmp_path: Path) -> None:
    clock = FakeClock(1000.0)
    nvml = FakeNvml([FakeCard(uuid=UUID_A, power_usage_mw=200_000)], clock=clock)
    path = tmp_path / "energy.jsonl"
    meter = EnergyMeter(nvml, refs(nvml), path, clock=clock)
    for t in (1000.0, 1000.04, 1000.08, 1000.12, 1000.16, 1000.2, 1000.24):
        clock.now = t
        meter.read_once()
    meter.stop()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert lines[0] == {"kind": "meter", "t_unix_s": 1000.0, "hz": 50.0, "cards": [UUID_A]}
    assert lines[1] == {"t_unix_s": 1000.0, "card": UUID_A, "energy_mj": 0, "first": True}
    # the counter stepped at 1000.1 and 1000.2: seen at the reads of 1000.12 and 1000.2, dated between the reads
    assert lines[2] == {"t_unix_s": 1000.1, "card": UUID_A, "energy_mj": 20_000, "read_gap_s": 0.04}
    assert lines[3] == {"t_unix_s": 1000.18, "card": UUID_A, "energy_mj": 40_000, "read_gap_s": 0.04}
    assert len(lines) == 4  # unchanged readings write nothing


def test_a_card_without_the_counter_is_named_once_and_no_thread_reads_it(tmp_path: Path) -> None:
    nvml = FakeNvml([FakeCard(uuid=UUID_A, total_energy_mj=None), FakeCard(uuid=UUID_B, total_energy_mj=None)])
    meter = EnergyMeter(nvml, refs(nvml), tmp_path / "energy.jsonl").start()
    try:
        assert not meter.running and meter.unsupported == [UUID_A, UUID_B]
    finally:
        meter.stop()
    lines = [json.loads(line) for line in (tmp_path / "energy.jsonl").read_text().splitlines()]
    assert [line.get("kind") for line in lines] == ["meter", "unsupported", "unsupported"]
    assert "NotSupported" in lines[1]["error"]


def test_the_meter_thread_reads_until_stopped() -> None:
    nvml = FakeNvml([FakeCard(uuid=UUID_A, power_usage_mw=300_000, energy_step_s=0.01)])
    meter = EnergyMeter(nvml, refs(nvml)).start()  # no file: lines kept in memory
    try:
        deadline = time.monotonic() + 5
        while len(meter.lines) < 6 and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        meter.stop()
    assert not meter.running and len(meter.lines) >= 6 and meter.errors == 0
    assert threading.active_count() >= 1
    with pytest.raises(ValueError, match="positive"):
        EnergyMeter(nvml, refs(nvml), hz=0)


# ------------------------------------------------------------------------------------------ known joules back


def edge_bound(trace: PowerTrace, edges: list[float], step_s: float, gap_s: float) -> float:
    """What the counter's resolution can misplace at ``edges``: at each, the power swing across the step around
    it, over half a step plus the dating's half read gap."""
    bound = 0.0
    for t in edges:
        watts = [trace.watts_at(t + d) for d in (-step_s, 0.0, step_s)]
        swing = max(watts) - min(watts)
        bound += swing * (step_s / 2 + gap_s / 2) + max(watts) * gap_s / 2
    return bound


def test_energy_of_a_window_from_the_counter_matches_the_known_joules() -> None:
    """The issue's check: a fake NVML trace with known power, read as the meter reads it, gives the known joules."""
    clock = FakeClock(1000.0)
    # idle, then a 3.04 s load at 600 W whose edges fall between the counter's steps, then idle again
    trace = PowerTrace([(1000.0, 90.0), (1002.03, 600.0), (1005.07, 90.0)], clock=clock)
    nvml = FakeNvml([FakeCard(uuid=UUID_A, power_usage_mw=trace.power_mw, total_energy_mj=trace.energy_mj)])
    meter = EnergyMeter(nvml, refs(nvml), clock=clock)
    run_meter(meter, clock, until=1008.0)
    energy = Energy.build(meter.lines, list, evidence_for(UUID_A))
    card = energy.cards[UUID_A]
    assert card.source == "counter"
    assert card.step_s == pytest.approx(0.1, abs=0.01)  # the counter's step, found from its own trace
    assert card.read_gap_s == pytest.approx(METER_DT, rel=0.2)
    known = trace.joules(1002.03, 1005.07)  # 1,824 J
    measured = float(card.between(np.array([1002.03]), np.array([1005.07]))[0])
    assert abs(measured - known) <= edge_bound(trace, [1002.03, 1005.07], 0.1, METER_DT)
    assert abs(measured - known) / known < 0.03
    # the idle stretch in between, at constant power: exact to the dating of the steps
    idle = float(card.between(np.array([1005.5]), np.array([1007.5]))[0])
    assert idle == pytest.approx(trace.joules(1005.5, 1007.5), abs=90.0 * METER_DT)
    # a window the trace does not cover has no energy
    assert np.isnan(card.between(np.array([999.0]), np.array([1001.0]))[0])


def test_one_short_window_straight_off_the_counter_reads_nothing_and_the_rule_refuses_it() -> None:
    clock = FakeClock(1000.0)
    trace = PowerTrace([(1000.0, 600.0)], clock=clock)
    nvml = FakeNvml([FakeCard(uuid=UUID_A, power_usage_mw=trace.power_mw, total_energy_mj=trace.energy_mj)])
    clock.now = 1000.101
    before = nvml.total_energy_mj(0)
    clock.now = 1000.113  # 12 ms later, as the H200's TTFT window
    assert nvml.total_energy_mj(0) == before  # 0 mJ: what an edge-read would divide
    why = judge_unit([0.012], 0.1)
    assert why is not None and "under 10 steps" in why
    assert judge_unit([0.3] * 20, 0.1) is not None  # 6 s in all, but 300 ms a window: edges dominate
    assert "on average" in str(judge_unit([0.3] * 20, 0.1))
    assert judge_unit([0.6, 0.5], 0.1) is None
    assert judge_unit([], 0.1) == "no window with a measured energy"
    assert judge_unit([5.0], None) == "no energy trace on this boot's cards"
    assert MIN_STEPS_TOTAL == 10 and MIN_STEPS_MEAN == 5


def test_without_the_counter_the_power_samples_are_integrated_to_the_known_joules() -> None:
    clock = FakeClock(1000.0)
    trace = PowerTrace([(1000.0, 100.0), (1002.1, 450.0), (1006.3, 100.0)], clock=clock)
    card = FakeCard(uuid=UUID_A, power_usage_mw=trace.power_mw, total_energy_mj=None)
    nvml = FakeNvml([card], clock=clock)
    meter = EnergyMeter(nvml, refs(nvml), clock=clock).start()
    meter.stop()
    assert meter.unsupported == [UUID_A]
    sampler = Sampler(nvml, refs(nvml), clock=clock)  # the run's 4 Hz sampler (gpu.jsonl)
    while clock.now < 1009.0:
        sampler.sample_once()
        clock.sleep(0.25)
    samples = [s.to_dict() for s in sampler.samples()]
    energy = Energy.build(meter.lines, lambda: samples, evidence_for(UUID_A))
    found = energy.cards[UUID_A]
    assert found.source == "power" and found.step_s == pytest.approx(0.25)
    known = trace.joules(1002.1, 1006.3)
    measured = float(found.between(np.array([1002.1]), np.array([1006.3]))[0])
    assert abs(measured - known) <= edge_bound(trace, [1002.1, 1006.3], 0.25, 0.0)
    steady = float(found.between(np.array([1003.0]), np.array([1006.0]))[0])
    assert steady == pytest.approx(trace.joules(1003.0, 1006.0))  # constant power: trapezoids are exact
    how = energy.unsupported[UUID_A]
    assert "NotSupported" in how
    line = method_line(
        {
            "meter_hz": 50.0,
            "min_steps_total": 10,
            "min_steps_mean": 5,
            "cards": [
                {"card": UUID_A, "source": "power", "step_s": 0.25, "read_gap_s": None, "points": 36, "error": how}
            ],
        }
    )
    assert line is not None and "power samples taken every 250 ms" in line and "NotSupported" in line


def test_a_boots_energy_sums_its_own_cards_only() -> None:
    steady = {
        c: CardTrace(c, "counter", np.array([0.0, 100.0]), np.array([0.0, 100.0 * w]), 0.1)
        for c, w in ((UUID_A, 300.0), (UUID_B, 200.0))
    }
    energy = Energy(cards=steady, boot_cards={"one": [UUID_A], "both": [UUID_A, UUID_B], "none": []})
    assert [t.card for t in energy.traces_of("both") or []] == [UUID_A, UUID_B]
    assert energy.traces_of("none") is None and energy.step_s("none") is None
    assert energy.source("one") == "counter" and energy.step_s("both") == 0.1


# ------------------------------------------------------------------------------------------ the report frame


def frame_of(rows: list[dict[str, Any]]) -> pd.DataFrame:
    base = {"arm": "a", "probe": "short", "point": "code", "valid": True}
    return pd.DataFrame([{**base, **r} for r in rows])


def decode(boot: str, t0: float, seconds: float, tokens: int, **extra: Any) -> dict[str, Any]:
    return {
        "boot": boot,
        **request_windows(
            {
                "ok": True,
                "send_unix_s": t0,
                "first_token_s": 0.02,
                "last_token_s": 0.02 + seconds,
                "completion_tokens": tokens + 1,
                "prompt_tokens": 40,
            }
        ),
        **extra,
    }


def test_energy_per_token_is_joules_over_tokens_per_boot_and_left_out_where_windows_are_short() -> None:
    watts = 400.0
    cards = {UUID_A: CardTrace(UUID_A, "counter", np.array([0.0, 1000.0]), np.array([0.0, 1000.0 * watts]), 0.1)}
    energy = Energy(cards=cards, boot_cards={"r1": [UUID_A], "r2": [UUID_A]})
    rows = [
        decode("r1", 10.0, 1.0, 100),  # 400 J over 100 tokens
        decode("r1", 20.0, 2.0, 300),  # 800 J over 300 tokens
        decode("r1", 30.0, 9.0, 10, valid=False),  # excluded: no part of any figure
        decode("r2", 40.0, 0.2, 50),  # 200 ms windows: under 5 steps of 100 ms on average
        decode("r2", 50.0, 0.2, 50),
    ]
    data = with_energy(frame_of(rows), energy)
    r1 = data[(data["boot"] == "r1") & data["valid"]]
    assert float(r1["energy_per_token"].mean()) == pytest.approx((400 + 800) / (100 + 300))  # Σ J / Σ tokens
    assert data.loc[data["boot"] == "r2", "energy_per_token"].isna().all()
    assert data.loc[~data["valid"], "energy_per_token"].isna().all()
    assert data["energy_per_prompt_token"].isna().all()  # 20 ms prefill windows: never divided
    assert list(data["decode_j"][:2]) == pytest.approx([400.0, 800.0])
    # no trace at all: the frame is left as it was
    assert "energy_per_token" not in with_energy(frame_of(rows), Energy())


def test_a_request_without_a_decode_window_has_none() -> None:
    assert request_windows({"ok": False, "send_unix_s": 1.0})["decode_t0_unix_s"] is None
    one = request_windows(
        {
            "ok": True,
            "send_unix_s": 1.0,
            "first_token_s": 0.1,
            "last_token_s": 0.1,
            "completion_tokens": 1,
            "prompt_tokens": 10,
            "cached_tokens": 4,
        }
    )
    assert one["decode_tokens"] is None and one["prefill_tokens"] == 6.0
    spec = request_windows(
        {
            "ok": True,
            "send_unix_s": 1.0,
            "first_token_s": 0.1,
            "last_token_s": 1.1,
            "completion_tokens": 40,
            "first_chunk_tokens": 3,
            "token_clock": "usage",
        }
    )
    assert spec["decode_tokens"] == 37.0 and spec["prefill_tokens"] is None  # prompt size unknown


def test_joules_are_written_with_their_unit() -> None:
    assert [joules_text(v) for v in (2.0, 0.0542, 9_900.0, 1.5e6, None)] == [
        "2.00 J",
        "54.2 mJ",
        "9.90 kJ",
        "1.50 MJ",
        "–",
    ]


def test_a_scale_out_runs_traces_are_read_from_every_lane(tmp_path: Path) -> None:
    """Under pytest-xdist each lane's energy.jsonl lands in lanes/<N>/ (run.forward): the report reads them all."""
    from pytest_kvcache.report.load import lane_jsonl

    for lane, card in ((0, UUID_A), (1, UUID_B)):
        folder = tmp_path / "lanes" / str(lane)
        folder.mkdir(parents=True)
        lines = [{"t_unix_s": 1000.0 + 0.1 * k, "card": card, "energy_mj": 100 * k} for k in range(5)]
        (folder / "energy.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    found = lane_jsonl(tmp_path, "energy.jsonl")
    assert {line["card"] for line in found} == {UUID_A, UUID_B} and len(found) == 10
    energy = Energy.build(found, list, {"a": evidence_for(UUID_A)["b"], "b": evidence_for(UUID_B)["b"]})
    assert [t.card for t in energy.traces_of("a") or []] == [UUID_A]
    assert [t.card for t in energy.traces_of("b") or []] == [UUID_B]
