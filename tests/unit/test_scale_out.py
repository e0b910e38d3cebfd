"""Scale-out with pytest-xdist, its plain parts: the Latin-square placement of blocks on lanes, CIs that
resample boots within lanes (deltas and crossovers), each lane's cards, the usage errors, and a worker's
writes reaching the controller's run folder."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pytest_kvcache import distributed, stats
from pytest_kvcache.config.settings import Arm, SettingsError, boot_order, lane_order, parse_gpu_groups, resolve
from pytest_kvcache.distributed import Role, boot_of_nodeid, check, check_lane_cards
from pytest_kvcache.engines import make_engine, visible_devices
from pytest_kvcache.engines.registry import EngineRegistry
from pytest_kvcache.gpu.state import GpuOptions, GpuState
from pytest_kvcache.run.forward import Outbox, apply, target
from pytest_kvcache.run.run import Run
from pytest_kvcache.testing.fake_nvml import FakeCard, FakeNvml

A, B, C = (Arm(name, name) for name in ("a", "b", "c"))


@pytest.mark.parametrize("lanes", [2, 3, 4])
@pytest.mark.parametrize("arms", [(A, B), (A, B, C)])
@pytest.mark.parametrize("per_lane", [1, 2, 3])
def test_blocks_form_a_latin_square_over_time(lanes: int, arms: tuple[Arm, ...], per_lane: int) -> None:
    rounds = lanes * per_lane
    boots = lane_order(arms, rounds, lanes, "abba")
    assert len(boots) == rounds * len(arms) and [b.index for b in boots] == list(range(len(boots)))
    for block in range(1, rounds + 1):  # a block is one boot of every arm, on one lane
        mine = [b for b in boots if b.block == block]
        assert sorted(b.arm.name for b in mine) == sorted(a.name for a in arms)
        assert {b.lane for b in mine} == {(block - 1) % lanes}
    slots: dict[int, list[str]] = {}
    for lane in range(lanes):  # each lane runs its blocks back to back; its k-th boot is time slot k
        for slot, boot in enumerate(b for b in boots if b.lane == lane):
            slots.setdefault(slot, []).append(boot.arm.name)
    for running in slots.values():  # at every slot the lanes run the arms as evenly as they can
        counts = Counter(running)
        if len(running) >= len(arms):
            assert max(counts.values()) - min(counts.get(a.name, 0) for a in arms) <= 1
        else:
            assert max(counts.values()) == 1  # fewer lanes than arms: all different
        assert len(counts) == min(len(running), len(arms))


def test_two_arms_on_two_lanes_run_abba_and_baab() -> None:
    boots = lane_order((A, B), 4, 2, "abba")
    per_lane = {lane: [b.boot_id for b in boots if b.lane == lane] for lane in (0, 1)}
    assert per_lane == {0: ["a.r1", "b.r1", "b.r3", "a.r3"], 1: ["b.r2", "a.r2", "a.r4", "b.r4"]}
    assert lane_order((A, B), 4, 1, "abba") == boot_order((A, B), 4, "abba")  # one lane: the plain order
    extra = lane_order((A, B), 6, 2, "abba", planned=4)
    assert sorted(b.block for b in extra if b.extra) == [5, 5, 6, 6]


def test_gpu_groups_parse_and_refuse_a_card_twice() -> None:
    assert parse_gpu_groups("0,1; 2,3") == ("0,1", "2,3")
    for bad, said in [
        ("0,1;1,2", r"card\(s\) 1 in more than one group"),
        (";", "expected GPU groups"),
        ("0,x/y", "comma-separated"),
    ]:
        with pytest.raises(SettingsError, match=said):
            parse_gpu_groups(bad)


def _settings(tmp_path: Path, **cli: Any) -> Any:
    return resolve({"arms": "auto,float16", **cli}, {}, {}, {}, tmp_path)


def test_each_lane_sees_only_its_group(tmp_path: Path) -> None:
    """The engine's CUDA_VISIBLE_DEVICES (process), the container's device ids (docker) and the GPU state
    follow the lane's group; on a fake NVML of four cards, each lane's snapshots name only its cards."""
    st = replace(_settings(tmp_path, gpu_groups="0,1;2,3", replicates="2"), lanes=2)
    boots = st.boots()
    assert {b.boot_id: b.lane for b in boots} == {"auto.r1": 0, "float16.r1": 0, "float16.r2": 1, "auto.r2": 1}
    assert [visible_devices(st, st.arms[0], lane) for lane in (0, 1)] == ["0,1", "2,3"]
    second = next(b for b in boots if b.lane == 1)
    engine: Any = make_engine(st, second, tmp_path / "arm", EngineRegistry(tmp_path))
    assert engine.env["CUDA_VISIBLE_DEVICES"] == "2,3"
    docker = replace(st, launcher="docker", image="img")
    assert make_engine(docker, second, tmp_path / "arm", EngineRegistry(tmp_path)).gpus == "2,3"  # type: ignore[attr-defined]
    nvml = FakeNvml([FakeCard(uuid=f"GPU-{i}") for i in range(4)])
    state = GpuState(GpuOptions())
    state.open(tmp_path, nvml=nvml, devices=[visible_devices(st, a, lane) for a in st.arms for lane in (0, 1)])
    for lane, uuids in ((0, ["GPU-0", "GPU-1"]), (1, ["GPU-2", "GPU-3"])):
        snap = state.snapshot(state.cards_of(visible_devices(st, st.arms[0], lane)))
        assert [c["uuid"] for c in snap["cards"]] == uuids
    state.close()


def test_distributed_usage_errors(tmp_path: Path) -> None:
    two = Role("controller", 2)
    with pytest.raises(SettingsError, match="--kv-replicates=1 leaves a worker idle; use --kv-replicates=2"):
        check(replace(_settings(tmp_path), lanes=2), two)
    with pytest.raises(SettingsError, match="names 3 group"):
        check(replace(_settings(tmp_path, replicates="2", gpu_groups="0;1;2"), lanes=2), two)
    endpoints = {
        "arms": "auto,float16",
        "endpoint": ["auto=http://127.0.0.1:1", "float16=http://127.0.0.1:2"],
        "replicates": "2",
        "launcher": "external",
    }
    external = resolve(endpoints, {}, {}, {}, tmp_path)
    with pytest.raises(SettingsError, match="external endpoints are one server per arm"):
        check(replace(external, lanes=2), two)
    grouped = replace(_settings(tmp_path, replicates="2", gpu_groups="0,1;2,3"), lanes=2)
    check(grouped, two)
    with pytest.raises(SettingsError, match="gpu-host has 2 GPU"):
        check_lane_cards(grouped, 1, 2, "gpu-host")
    with pytest.raises(SettingsError, match="has no NVML"):
        check_lane_cards(grouped, 0, None, "cpu-host")
    check_lane_cards(grouped, 1, 4, "gpu-host")


def test_local_workers_may_not_share_a_gpu(tmp_path: Path) -> None:
    """Two engines starting side by side on one card starve each other's KV cache (measured on an H200):
    local workers on a host with GPUs need --kv-gpu-groups; CPU hosts and containers without cards may share."""
    two = Role("controller", 2)
    shared = replace(_settings(tmp_path, replicates="2"), lanes=2)
    with pytest.raises(SettingsError, match=r"same 1 GPU\(s\).*--kv-gpu-groups \(e.g. 0\)"):
        distributed.check_shared_cards(shared, two, 1)
    with pytest.raises(SettingsError, match=r"e.g. 0;1\)"):
        distributed.check_shared_cards(shared, two, 8)
    distributed.check_shared_cards(shared, two, None)  # no NVML: CPU lanes share the host, as tested here
    distributed.check_shared_cards(replace(shared, gpu_groups=("0", "1")), two, 2)
    distributed.check_shared_cards(replace(shared, launcher="docker", image="img"), two, 2)  # no --kv-gpus


def test_a_test_id_names_its_boot() -> None:
    boots = lane_order((Arm("fp8", "fp8"), Arm("fp8.x", "fp8")), 2, 2, "abba")
    assert boot_of_nodeid("suite/test_short.py::test_short[fp8.r2-code]", boots).boot_id == "fp8.r2"  # type: ignore[union-attr]
    assert boot_of_nodeid("t.py::test_x[fp8.x.r1]", boots).boot_id == "fp8.x.r1"  # type: ignore[union-attr]
    assert boot_of_nodeid("t.py::test_plain", boots) is None


# ----------------------------------------------------------------------------- CIs within lanes


def _boots(rng: np.random.Generator, mean: float, boots: int, scale: float = 1.0) -> list[list[float]]:
    return [list(scale * rng.normal(mean + rng.normal(0, 1.0), 1.0, 6)) for _ in range(boots)]


def test_a_lane_faster_for_both_arms_leaves_the_delta_and_its_ci_unchanged() -> None:
    """Two lanes, three boots of each arm on each. Lane 1 10% faster for both arms changes nothing in the
    stratified estimate (ratios are taken within lanes) — while pooling boots across lanes widens the CI."""
    rng = np.random.default_rng(7)
    base = _boots(rng, 100.0, 6)
    arm = _boots(rng, 95.0, 6)
    strata = [0, 0, 0, 1, 1, 1]
    fast = [[v * 1.1 for v in b] if lane else b for b, lane in zip(base, strata, strict=True)]
    fast_arm = [[v * 1.1 for v in b] if lane else b for b, lane in zip(arm, strata, strict=True)]
    plain = stats.ratio_ci_boots(base, arm, base_strata=strata, arm_strata=strata)
    shifted = stats.ratio_ci_boots(fast, fast_arm, base_strata=strata, arm_strata=strata)
    assert np.allclose(plain, shifted, rtol=1e-12)
    assert plain[1] is not None and plain[1] < plain[0] < plain[2] < 1.0  # type: ignore[operator]
    pooled = stats.ratio_ci_boots(fast, fast_arm)
    assert pooled[2] - pooled[1] > 1.5 * (plain[2] - plain[1])  # type: ignore[operator]
    # One stratum is exactly the unstratified estimate.
    assert stats.ratio_ci_boots(base, arm, base_strata=[0] * 6, arm_strata=[0] * 6) == stats.ratio_ci_boots(base, arm)
    # A lane holding only one arm (its worker died) is left out.
    ratio, _, _ = stats.ratio_ci_boots(base, arm[:3], base_strata=strata, arm_strata=strata[:3])
    assert ratio == pytest.approx(stats.ratio_ci_boots(base[:3], arm[:3])[0])


def test_the_crossover_ci_resamples_boots_within_lanes() -> None:
    """A curve whose delta changes sign between 8k and 16k, three boots per arm and lane: the estimate sits
    between them, its CI comes from resampling whole boots, and a lane faster for both arms moves nothing."""
    rng = np.random.default_rng(3)
    xs = [4000.0, 8000.0, 16000.0, 32000.0]
    truth = [1.10, 1.04, 0.96, 0.85]
    lanes = {f"b{i}": i // 3 for i in range(6)} | {f"a{i}": i // 3 for i in range(6)}

    def curve(prefix: str, ratio: list[float], lane_scale: float) -> list[dict[str, list[float]]]:
        level = {f"{prefix}{i}": rng.normal(0, 0.01) for i in range(6)}
        return [
            {
                boot: list(100 * r * (1 + shift) * (lane_scale if lanes[boot] else 1.0) * (1 + rng.normal(0, 0.01, 5)))
                for boot, shift in level.items()
            }
            for r in ratio
        ]

    state = rng.bit_generator.state
    base, arm = curve("b", [1.0] * 4, 1.0), curve("a", truth, 1.0)
    found = stats.crossover_boots(xs, base, arm, strata=lanes, seed=0)
    assert 8000 < found["estimate"] < 16000 and found["ci_low"] <= found["estimate"] <= found["ci_high"]
    assert found["share"] > 0.9
    rng.bit_generator.state = state
    base2, arm2 = curve("b", [1.0] * 4, 1.1), curve("a", truth, 1.1)
    again = stats.crossover_boots(xs, base2, arm2, strata=lanes, seed=0)
    assert again["estimate"] == pytest.approx(found["estimate"], rel=1e-9)
    assert again["ci_low"] == pytest.approx(found["ci_low"], rel=1e-9)
    assert again["ci_high"] == pytest.approx(found["ci_high"], rel=1e-9)


# ----------------------------------------------------------------------------- one run folder


def test_a_workers_writes_reach_the_controllers_folder(tmp_path: Path) -> None:
    """What a worker's run writes — records, evidence, side logs, its engine log, its own run.json — lands
    in the controller's folder: per-boot files and shared logs in place, the worker's own under lanes/N."""
    st = replace(_settings(tmp_path, replicates="2", report_dir=str(tmp_path / "runs")), lanes=2)
    controller = Run(st, make_engine=lambda *a: None, role="controller", invocation=["pytest"])
    folder = controller.open()
    outbox = Outbox()
    worker = Run(
        st, make_engine=lambda *a: None, role="worker", lane=1, run_id=folder.run_id, outbox=outbox, invocation=[]
    )
    worker.settings = replace(st, self_check="off")
    wfolder = worker.open()
    assert wfolder.path.parent == tmp_path / "runs" / "workers" and wfolder.run_id == folder.run_id
    assert not (tmp_path / "runs" / "latest").resolve().name.startswith(f"{folder.run_id}-lane")
    wfolder.append({"arm": "float16", "boot": "float16.r2", "phase": "measured", "run_id": folder.run_id})
    wfolder.write("arms/float16.r2/evidence.json", {"boot": "float16.r2", "status": "stopped", "lane": 1})
    wfolder.log("agreement.jsonl", {"boot": "float16.r2", "ok": True})
    log = wfolder.arm_dir("float16.r2") / "engine.log"
    log.write_text("booting\n")
    outbox.sync("arms/float16.r2/engine.log", log)
    log.write_text("booting\nready\n")
    outbox.sync("arms/float16.r2/engine.log", log)
    events = outbox.drain()
    assert outbox.drain() == [] and all(isinstance(x, str) for e in events for x in e)
    apply(controller, 1, events)
    assert [r["boot"] for r in controller.records] == ["float16.r2"]
    assert json.loads((folder.path / "requests.jsonl").read_text().splitlines()[0])["boot"] == "float16.r2"
    assert controller.evidence["float16.r2"]["status"] == "stopped"
    assert (folder.path / "arms/float16.r2/engine.log").read_text() == "booting\nready\n"
    assert (folder.path / "agreement.jsonl").read_text().count("float16.r2") == 1
    assert json.loads((folder.path / "lanes/1/run.json").read_text())["role"] == "worker"
    assert controller.lane_meta[1]["lane"] == 1
    assert target("hostcpu.jsonl", 1) == "lanes/1/hostcpu.jsonl" and target("sampling.jsonl", 1) == "sampling.jsonl"
    worker.close()
    controller.close()
