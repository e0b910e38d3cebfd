"""What the verdict cost (`pytest_kvcache.report.cost`): device-seconds split into booting, measuring and waiting,
the compile cache's saving, and the open gates' boots to decide — from a run folder written here by hand."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pytest_kvcache.report import cost
from pytest_kvcache.report.load import load
from pytest_kvcache.report.sections.entries import boot_entries

T0 = 1_700_000_000.0


def card(uuid: str) -> dict[str, Any]:
    return {"gpu": True, "cards": [{"uuid": uuid, "index": 0}]}


def boot(name: str, arm: str, start: float, ready_s: float, up_s: float, cache: str, cards: int = 1) -> dict[str, Any]:
    gpus = {"gpu": True, "cards": [{"uuid": f"GPU-{i}", "index": i} for i in range(cards)]}
    return {
        "boot": name,
        "arm": {"name": arm},
        "status": "stopped",
        "started_unix_s": start,
        "ready_s": ready_s - 1.0,  # the engine's own readiness, before the evidence was collected
        "ready_unix_s": start + ready_s,
        "stopping_unix_s": start + ready_s + up_s,
        "stopped_unix_s": start + ready_s + up_s + 2.0,
        "gpu_before": gpus,
        "log": {"compile_cache": cache},
    }


def request(boot_id: str, arm: str, send: float, seconds: float) -> dict[str, Any]:
    return {
        "arm": arm,
        "boot": boot_id,
        "phase": "measured",
        "probe": "short",
        "sample": {"send_unix_s": send, "end_s": seconds},
    }


def write_run(path: Path, boots: list[dict[str, Any]], records: list[dict[str, Any]], end: float) -> Path:
    path.mkdir()
    plan = [{"boot": b["boot"], "arm": b["arm"]["name"]} for b in boots]
    meta = {"run_id": "r", "started_unix_s": T0, "updated_unix_s": end, "plan": plan, "settings": {}}
    (path / "run.json").write_text(json.dumps(meta))
    (path / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    for b in boots:
        (path / "arms" / b["boot"]).mkdir(parents=True)
        (path / "arms" / b["boot"] / "evidence.json").write_text(json.dumps(b))
    return path


def test_device_seconds_split_into_booting_measuring_and_waiting(tmp_path: Path) -> None:
    boots = [
        boot("a", "a", T0 + 10, 100.0, 50.0, "miss"),  # compiled: ready after 100 s (99 s engine + evidence)
        boot("b", "b", T0 + 170, 30.0, 40.0, "hit"),  # from the cache: 30 s
    ]
    records = [
        request("a", "a", T0 + 115, 10.0),
        request("a", "a", T0 + 120, 10.0),  # overlaps the first: 15 s of union, not 20
        request("a", "a", T0 + 140, 5.0),
        request("b", "b", T0 + 205, 20.0),
    ]
    run = load(write_run(tmp_path / "run", boots, records, end=T0 + 250.0))
    found = cost.section(run, boot_entries(run))
    assert found is not None
    assert found["unit"] == "GPU-s" and found["cards"] == 1 and found["wall_s"] == pytest.approx(250.0)
    assert found["booting"] == pytest.approx(100 + 30 + 2 + 2)  # ready times and both stops
    assert found["stopping"] == pytest.approx(4.0)
    assert found["measuring"] == pytest.approx(15 + 5 + 20)
    assert found["waiting"] == pytest.approx(250 - 134 - 40)
    assert found["compile_cache_saved"] == pytest.approx(99.0 - 29.0)  # b against the run's compiling boot
    line = cost.cost_line(found)
    assert line == (
        "Cost: 250 GPU-s (1 card × 4.2 min): booting 134 GPU-s (54%, 2 boots, stops 4 GPU-s; the compile cache "
        "saved 70 GPU-s), measuring 40 GPU-s (16%), waiting 76 GPU-s (30%)."
    )


def test_a_boot_on_two_cards_costs_twice_and_without_a_gpu_wall_time_is_given(tmp_path: Path) -> None:
    boots = [boot("a", "a", T0, 20.0, 10.0, "", cards=2)]
    run = load(write_run(tmp_path / "two", boots, [request("a", "a", T0 + 21, 5.0)], end=T0 + 40.0))
    found = cost.section(run, boot_entries(run))
    assert found is not None and found["cards"] == 2
    assert found["total"] == pytest.approx(80.0) and found["booting"] == pytest.approx(2 * 22.0)
    assert found["measuring"] == pytest.approx(10.0) and found["compile_cache_saved"] is None
    cpu = boot("c", "c", T0, 20.0, 10.0, "")
    cpu["gpu_before"] = {"gpu": False, "reason": "NVML Shared Library Not Found"}
    run = load(write_run(tmp_path / "cpu", [cpu], [request("c", "c", T0 + 21, 5.0)], end=T0 + 40.0))
    found = cost.section(run, boot_entries(run))
    assert found is not None and found["unit"] == "s"
    assert cost.cost_line(found) == (
        "Cost: 40 s of wall time (no GPU recorded): booting 22 s (55%, 1 boot, stops 2 s), measuring 5 s (12%), "
        "waiting 13 s (32%)."
    )


def test_a_run_that_booted_nothing_has_no_cost(tmp_path: Path) -> None:
    run = load(write_run(tmp_path / "none", [], [], end=T0 + 5))
    assert cost.section(run, boot_entries(run)) is None
    assert cost.first_screen({"cost": None, "gates": []}) == []


def test_open_gates_show_how_many_boots_would_decide_them_when_the_gate_says() -> None:
    gates = [
        {"name": "decode_tps[short@code]: <= +10% (int8/fp8)", "outcome": "inconclusive", "boots_to_decide": 4},
        {"name": "ttft_s[short@code]: <= +10% (int8/fp8)", "outcome": "inconclusive", "boots_to_decide": None},
        {"name": "x[short@code]: >= 1 (fp8)", "outcome": "pass", "boots_to_decide": 3},  # decided: not shown
        {"name": "y[short@code]: >= 1 (fp8)", "outcome": "inconclusive"},  # no estimate made: not shown
        {"name": "z[short@code]: >= 1 (fp8)", "outcome": "inconclusive", "boots_to_decide": {"boots": 1}},
    ]
    assert cost.open_gate_lines(gates) == [
        "Open gate decode_tps[short@code]: <= +10% (int8/fp8): ~4 more boots per arm would decide it.",
        "Open gate ttft_s[short@code]: <= +10% (int8/fp8): more boots are not likely to decide it (or it has no CI "
        "yet).",
        "Open gate z[short@code]: >= 1 (fp8): ~1 more boot per arm would decide it.",
    ]
