"""Replicated counterbalanced boots, boot-level CIs, confound refusal, output agreement, adaptive sampling."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pytest_kvcache import stats
from pytest_kvcache.config import values as v
from pytest_kvcache.config.arms import Arm
from pytest_kvcache.config.constants import SettingsError
from pytest_kvcache.config.plan import BootPlan, boot_order
from pytest_kvcache.jsonio import write_json
from pytest_kvcache.probes import agreement, registry
from pytest_kvcache.probes.runner import Adaptive, run_repeated
from pytest_kvcache.report import comparison, confounds, gates, judge, rounds, spread, verdicts
from pytest_kvcache.report import frame as report_frame
from pytest_kvcache.report.load import RunData
from pytest_kvcache.report.outputs.formats import fmt_delta
from pytest_kvcache.report.sections import agreement as agreement_section
from pytest_kvcache.report.sections import ci
from tests.factories import make_settings, measured_records

SPECS = registry.resolve()


class analysis:  # the report layer's functions, called with the stock probe specs and seed 0
    @staticmethod
    def frame(records: list[dict[str, Any]]) -> Any:
        return report_frame.frame(records, SPECS)  # type: ignore[arg-type]

    @staticmethod
    def compare(base: Any, other: Any, metric: str) -> Any:
        return report_frame.compare(base, other, metric, seed=0)

    @staticmethod
    def pair_key(record: dict[str, Any]) -> Any:
        return report_frame.pair_key(record, SPECS)  # type: ignore[arg-type]

    @staticmethod
    def delta_rows(data: Any, arms: list[str]) -> Any:
        return comparison.delta_rows(data, arms, SPECS, 0)


# ------------------------------------------------------------------------------ boot order and options


def order_of(arms: str, rounds: int, order: str, seed: int = 0) -> list[str]:
    named = [Arm(name=n, kv_cache_dtype="auto") for n in arms.split(",")]
    return [b.boot_id for b in boot_order(named, rounds, order, seed)]  # type: ignore[arg-type]


def test_abba_alternates_each_round() -> None:
    assert order_of("A,B", 4, "abba") == ["A.r1", "B.r1", "B.r2", "A.r2", "A.r3", "B.r3", "B.r4", "A.r4"]
    assert order_of("A,B,C", 2, "abba") == ["A.r1", "B.r1", "C.r1", "C.r2", "B.r2", "A.r2"]


def test_sequential_repeats_the_declared_order_and_one_boot_keeps_the_arm_name() -> None:
    assert order_of("A,B", 2, "sequential") == ["A.r1", "B.r1", "A.r2", "B.r2"]
    assert order_of("A,B", 1, "abba") == ["A", "B"]


def test_random_order_is_seeded_and_every_round_holds_every_arm() -> None:
    first = order_of("A,B,C", 6, "random", seed=7)
    assert first == order_of("A,B,C", 6, "random", seed=7)
    assert first != order_of("A,B,C", 6, "random", seed=8)
    for r in range(1, 7):
        assert sorted(b for b in first if b.endswith(f".r{r}")) == [f"A.r{r}", f"B.r{r}", f"C.r{r}"]


def resolve_cli(tmp_path: Path, **cli: Any) -> Any:
    return make_settings(tmp_path, arms="auto,float16", **cli)


def test_replicates_default_to_abba_and_name_boots(tmp_path: Path) -> None:
    s = resolve_cli(tmp_path, replicates="2")
    assert s.order == "abba"
    assert [b.boot_id for b in BootPlan.of(s).boots] == ["auto.r1", "float16.r1", "float16.r2", "auto.r2"]
    assert resolve_cli(tmp_path, replicates="2", order="random:5").order_seed == 5
    assert resolve_cli(tmp_path).order == "sequential"


def test_gates_plan_adaptive_rounds_up_to_a_budget_of_three_boots_per_arm(tmp_path: Path) -> None:
    gated = resolve_cli(tmp_path, fail=["decode_tps[short]: >= -5%"])
    assert gated.replicates == 1 and gated.max_replicates == 3 and gated.rounds == 3 and gated.order == "abba"
    assert [(b.boot_id, b.extra) for b in BootPlan.of(gated).boots] == [
        ("auto.r1", False),
        ("float16.r1", False),
        ("float16.r2", True),
        ("auto.r2", True),
        ("auto.r3", True),
        ("float16.r3", True),
    ]
    off = resolve_cli(tmp_path, fail=["decode_tps[short]: >= -5%"], max_replicates="1")
    assert off.max_replicates is None and [b.boot_id for b in BootPlan.of(off).boots] == ["auto", "float16"]
    assert resolve_cli(tmp_path).max_replicates is None  # no gates: boot what was asked
    five = resolve_cli(tmp_path, fail=["decode_tps[short]: >= -5%"], max_replicates="5")
    assert five.rounds == 5 and sum(b.extra for b in BootPlan.of(five).boots) == 8
    assert resolve_cli(tmp_path, fail=["decode_tps[short]: >= -5%"], replicates="4").max_replicates is None


def test_gates_decided_the_same_on_every_boot_plan_no_adaptive_rounds(tmp_path: Path) -> None:
    """Retrieval and fidelity gates are decided over needles and texts, which every boot answers alike: the plan
    lists no rounds another boot could never fill; a timing gate beside them brings the rounds back."""
    only = ["retrieval_acc[retrieval@1k]: float16 >= auto - 0.1", "logprob_drift[fidelity@1k]: float16 <= 0.1"]
    same = resolve_cli(tmp_path, fail=only)
    assert same.max_replicates is None and [b.boot_id for b in BootPlan.of(same).boots] == ["auto", "float16"]
    assert resolve_cli(tmp_path, fail=only, max_replicates="1").max_replicates is None
    with pytest.raises(SettingsError, match="not fidelity or retrieval"):
        resolve_cli(tmp_path, fail=only, max_replicates="3")
    assert resolve_cli(tmp_path, fail=[*only, "decode_tps[short]: >= -5%"]).max_replicates == 3
    assert [v.gate_probe(g) for g in [*only, "ttft_s[prefill@10k]: <= +10%"]] == ["retrieval", "fidelity", "prefill"]


def test_target_ci_plans_adaptive_rounds_up_to_the_cap(tmp_path: Path) -> None:
    s = resolve_cli(tmp_path, replicates="2", target_ci="1.5%")
    assert s.target_ci_pct == 1.5 and s.max_replicates == 4
    boots = BootPlan.of(s).boots
    assert [b.boot_id for b in boots if b.extra] == ["auto.r3", "float16.r3", "float16.r4", "auto.r4"]


@pytest.mark.parametrize(
    ("cli", "message"),
    [
        ({"order": "abab"}, "expected sequential, abba, random or random:SEED"),
        ({"order": "abba:3"}, "expected sequential, abba, random or random:SEED"),
        ({"replicates": "0"}, "expected a whole number >= 1"),
        ({"target_ci": "0"}, "between 0 and 100"),
        ({"max_runs": "9"}, "only applies with --kv-target-ci"),
        ({"max_replicates": "3"}, "adds boots only to decide a gate"),
        ({"fail": ["decode_tps[short]: >= -5%"], "replicates": "2", "max_replicates": "1"}, "at least --kv-replicates"),
        ({"target_ci": "2", "runs": "5", "max_runs": "3"}, "must be at least --kv-runs"),
        ({"allow_diff": ["cache config"]}, "expected a dotted evidence path"),
        ({"noise": "nope"}, "no stored run 'nope'"),
        ({"concurrency": "1,x"}, "bad part 'x'"),
        ({"self_check": True, "no_self_check": True}, "contradict"),
    ],
)
def test_bad_options_are_named(tmp_path: Path, cli: dict[str, Any], message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        resolve_cli(tmp_path, **cli)


def test_noise_must_name_a_stored_a_a_run(tmp_path: Path) -> None:
    baselines = tmp_path / ".kvcache" / "baselines"
    write_json(baselines / "ab" / "run.json", {"settings": {"arms": [{"name": "a", "typed_as": "a"}, {"name": "b"}]}})
    write_json(
        baselines / "aa" / "run.json",
        {"settings": {"arms": [{"name": "auto", "typed_as": "auto"}, {"name": "auto.2", "typed_as": "auto"}]}},
    )
    for name in ("ab", "aa"):
        (baselines / name / "requests.jsonl").write_text("")
    with pytest.raises(SettingsError, match="not an A/A run"):
        resolve_cli(tmp_path, noise="ab")
    assert resolve_cli(tmp_path, noise="aa").noise == "aa"


# ------------------------------------------------------------------------------ boot-level statistics


def test_hierarchical_ci_is_wider_than_pooled_when_boots_drift() -> None:
    rng = np.random.default_rng(0)
    base = [rng.normal(100, 0.2, 8) + shift for shift in (0.0, 3.0, -3.0)]
    arm = [rng.normal(100, 0.2, 8) + shift for shift in (2.0, -2.0, 1.0)]
    ratio, lo, hi = stats.ratio_ci_boots(base, arm)
    _, plo, phi = stats.ratio_ci(np.concatenate(base), np.concatenate(arm))
    # the ratio of the geometric means of the boot means (the t-interval is on their log)
    geometric = np.exp(np.mean(np.log([a.mean() for a in arm])) - np.mean(np.log([b.mean() for b in base])))
    assert ratio == pytest.approx(geometric)
    assert lo is not None and hi is not None and plo is not None and phi is not None
    assert (hi - lo) > 2 * (phi - plo)
    assert lo < 1 < hi


def test_one_boot_per_side_gives_no_boot_ci() -> None:
    assert stats.ratio_ci_boots([[1.0, 2.0]], [[2.0, 3.0], [2.0]])[1:] == (None, None)
    assert stats.ratio_ci_boots([], [[1.0]]) == (None, None, None)


def records(arm: str, boot: str, replicate: int, values: list[float], shape: str = "code") -> list[dict[str, Any]]:
    return measured_records(arm, values, boot=boot, replicate=replicate, shape=shape)


def test_compare_switches_to_boots_with_three_boots_per_arm() -> None:
    two = analysis.frame(
        records("a", "a.r1", 1, [100, 101])
        + records("a", "a.r2", 2, [104, 105])
        + records("b", "b.r1", 1, [110, 111])
        + records("b", "b.r2", 2, [114, 115])
    )
    row = analysis.compare(two[two["arm"] == "a"], two[two["arm"] == "b"], "decode_tps")
    assert row["ci_method"] == "within-boot" and row["boots_arm"] == 2
    three = analysis.frame(
        records("a", "a.r1", 1, [100, 101])
        + records("a", "a.r2", 2, [104, 105])
        + records("a", "a.r3", 3, [102, 103])
        + records("b", "b.r1", 1, [110, 111])
        + records("b", "b.r2", 2, [114, 115])
        + records("b", "b.r3", 3, [112, 113])
    )
    row = analysis.compare(three[three["arm"] == "a"], three[three["arm"] == "b"], "decode_tps")
    assert row["ci_method"] == "boots" and row["boots_baseline"] == 3
    assert row["ratio"] == pytest.approx(112.5 / 102.5, rel=1e-4)  # geometric mean of boot means
    assert row["baseline_value"] == pytest.approx(102.5) and row["arm_value"] == pytest.approx(112.5)


def test_pairs_stay_within_a_replicate() -> None:
    assert analysis.pair_key({"probe": "prefill", "depth": 2000, "index": 1, "replicate": 2}) == (2, 2000, 1)
    assert analysis.pair_key({"probe": "prefill", "depth": 2000, "index": 1}) == (1, 2000, 1)


def test_rounds_check_reports_the_widest_delta() -> None:
    recs = records("a", "a", 1, [100, 100.1, 99.9]) + records("b", "b", 1, [110, 110.2, 109.8])
    assert rounds.rounds_check(recs, ["a", "b"], SPECS, 5.0, 0)[0]  # type: ignore[arg-type]
    noisy = records("a", "a", 1, [80, 120, 100]) + records("b", "b", 1, [110, 70, 140])
    done, widest = rounds.rounds_check(noisy, ["a", "b"], SPECS, 5.0, 0)  # type: ignore[arg-type]
    assert not done and widest is not None and float(widest["half_width_pct"]) > 5.0  # type: ignore[arg-type]
    assert widest["arm"] == "b" and widest["metric"] == "decode_tps"


def test_rounds_check_stops_on_a_decided_gate_and_not_before() -> None:
    """One rule with the gates, the report's own evaluation: a round is needed while a gate is undecided —
    however narrow its CI — and not once every gate is decided, however wide; a gate missed or met far beyond
    boot-to-boot variation is decided by one boot per arm (the within-boot CI widened by the default band)."""

    def boots(arm: str, levels: list[float], spread: float) -> list[dict[str, Any]]:
        return [
            r
            for i, level in enumerate(levels, 1)
            for r in records(arm, f"{arm}.r{i}", i, [level - spread, level, level + spread])
        ]

    narrow = boots("a", [100.0, 100.2, 99.8], 0.1) + boots("b", [110.0, 110.2, 109.8], 0.1)
    noisy = boots("a", [80.0, 120.0, 100.0], 20) + boots("b", [110.0, 70.0, 140.0], 20)
    check = rounds.rounds_check
    assert not check(noisy, ["a", "b"], SPECS, 5.0, 0)[0]  # type: ignore[arg-type]
    assert check(noisy, ["a", "b"], SPECS, 5.0, 0, ["decode_tps[short]: >= -80%"])[0]  # type: ignore[arg-type]
    done, widest = check(narrow, ["a", "b"], SPECS, 5.0, 0, ["decode_tps[short]: >= +10%"])  # type: ignore[arg-type]
    assert not done and widest is not None and widest["gate"] == "decode_tps[short@code]: >= +10% (b/a)"
    assert widest["boots_to_decide"] is None  # +10.0% against +10%: on the threshold
    assert check(narrow, ["a", "b"], SPECS, 5.0, 0, ["decode_tps[short]: b >= a * 1.05"])[0]  # type: ignore[arg-type]
    # gates only (no --kv-target-ci): a decided gate ends the rounds
    assert check(narrow, ["a", "b"], SPECS, None, 0, ["decode_tps[short]: b >= a * 1.05"])[0]  # type: ignore[arg-type]
    one_boot = records("a", "a", 1, [100, 100.1, 99.9]) + records("b", "b", 1, [110, 110.2, 109.8])
    done, widest = check(one_boot, ["a", "b"], SPECS, None, 0, ["decode_tps[short]: >= +5%"])  # type: ignore[arg-type]
    assert not done and widest is not None and widest["gate"] == "decode_tps[short@code]: >= +5% (b/a)"
    assert check(one_boot, ["a", "b"], SPECS, None, 0, ["decode_tps[short]: >= -90%"])[0]  # type: ignore[arg-type]
    assert check(one_boot, ["a", "b"], SPECS, None, 0, ["decode_tps[short]: b >= a * 9"])[0]  # type: ignore[arg-type]


def test_ci_statement_says_what_the_cis_cover() -> None:
    boots = [{"boot": f"{a}.r{r}", "arm": a, "status": "stopped"} for r in (1, 2) for a in ("a", "b")]
    text = ci.ci_statement(boots, ["a", "b"])  # type: ignore[arg-type]
    assert text["method"] == "within-boot" and "within-boot noise only" in text["text"]
    boots += [{"boot": f"{a}.r3", "arm": a, "status": "stopped"} for a in ("a", "b")]
    assert ci.ci_statement(boots, ["a", "b"])["method"] == "boots"  # type: ignore[arg-type]
    external = ci.ci_statement(boots, ["a", "b"], "external")  # type: ignore[arg-type]
    assert external["method"] == "within-boot" and external["boots_per_arm"] == {"a": 1, "b": 1}
    assert "repeats against one server per arm" in external["text"] and "repeats per arm: a 3, b 3" in external["text"]


def test_repeats_against_one_external_server_are_one_resampling_unit() -> None:
    """Three "boots" of an external endpoint are the same server: with the loader's ``unit`` column set to
    the arm, the comparison stays within-boot instead of claiming a CI over boots."""
    recs = [r for i in (1, 2, 3) for arm in ("a", "b") for r in records(arm, f"{arm}.r{i}", i, [100 + i, 101 + i])]
    booted = analysis.frame(recs)
    assert analysis.delta_rows(booted, ["a", "b"])[0]["ci_method"] == "boots"
    repeats = booted.assign(unit=booted["arm"])
    assert analysis.delta_rows(repeats, ["a", "b"])[0]["ci_method"] == "within-boot"


# ------------------------------------------------------------------------------ A/A noise band


def test_noise_band_widens_gates_and_verdicts() -> None:
    data = analysis.frame(records("a", "a", 1, [100, 100.1, 99.9]) + records("b", "b", 1, [102, 102.1, 101.9]))
    gate = gates.parse("decode_tps[short]: <= +1%", arms=["a", "b"])
    one_boot = gates.evaluate([gate], data, ["a", "b"], seed=0)[0]
    # one boot each: the within-boot CI (+2% [+1.8, +2.2]) widened by the default CPU band straddles +1%
    assert one_boot["outcome"] == "inconclusive" and one_boot["evidence"]["kind"] == "default band"
    wide_aa = {("short", "code", "decode_tps"): spread.from_aa(0.03, 4, "aa")}  # σ̂ 3% over 4 df
    widened = gates.evaluate([gate], data, ["a", "b"], seed=0, noise=wide_aa)[0]
    assert widened["outcome"] == "inconclusive" and "the A/A noise run aa (SD 3.0%, 4 df" in widened["reason"]
    assert widened["evidence"]["kind"] == "noise run" and widened["evidence"]["df"] == 4  # in place of the band
    quiet_aa = {("short", "code", "decode_tps"): spread.from_aa(0.001, 4, "aa")}
    narrow = gates.evaluate([gate], data, ["a", "b"], seed=0, noise=quiet_aa)[0]
    assert narrow["outcome"] == "fail" and narrow["ci_method"] == "noise band"
    # the A/A's spread is scaled by this run's boots: 1 boot a side widens by σ̂·√2, not by a flat margin
    lo, hi = narrow["evidence"]["within_ci"]
    assert narrow["ci_low"] < lo and narrow["ci_high"] > hi
    report: Any = {"deltas": analysis.delta_rows(data, ["a", "b"]), "arms": [], "crossovers": []}
    report["agreement"] = {"rows": [], "notes": []}
    assert report["deltas"][0]["verdict"] == "better"
    assert report["deltas"][0]["provisional"] == "1 boot per arm: within-boot CI only"
    spread.judge_deltas(report["deltas"], "cpu")  # what build() does: +2% is within the CPU band
    assert report["deltas"][0]["verdict"] == "inconclusive" and "default CPU" in report["deltas"][0]["verdict_note"]
    judge.apply_noise(report, wide_aa, "aa", SPECS)
    assert report["deltas"][0]["verdict"] == "inconclusive"
    assert report["deltas"][0]["verdict_note"].startswith("within the A/A noise run aa (SD 3.0%, 4 df")
    assert "provisional" not in report["deltas"][0] and report["bands"]["spreads"].keys() == {"noise run"}
    judge.apply_noise(report, quiet_aa, "aa", SPECS)
    assert report["deltas"][0]["verdict"] == "better"  # judged again from the within-boot CI, not from the band's


def test_verdict_words_say_when_they_rest_on_a_within_boot_ci() -> None:
    one = analysis.frame(records("a", "a", 1, [100, 100.1, 99.9]) + records("b", "b", 1, [110, 110.2, 109.8]))
    (row,) = analysis.delta_rows(one, ["a", "b"])
    assert fmt_delta(row) == "+10.0% [+9.8, +10.2] better (1 boot per arm: within-boot CI only)"
    sentences = verdicts.verdict_sentences([row], [], ["a", "b"], SPECS)
    assert sentences == [
        "b wins short requests on decode_tps (code +10.0%) — provisional (1 boot per arm: within-boot CI only)."
    ]
    three = analysis.frame(
        [r for i in (1, 2, 3) for r in records("a", f"a.r{i}", i, [100 + i, 100.1 + i])]
        + [r for i in (1, 2, 3) for r in records("b", f"b.r{i}", i, [110 + i, 110.2 + i])]
    )
    (row,) = analysis.delta_rows(three, ["a", "b"])
    assert row["ci_method"] == "boots" and "provisional" not in row and fmt_delta(row).endswith("] better")


def test_one_sample_a_side_is_not_judged_in_words() -> None:
    single = analysis.frame(records("a", "a", 1, [100.0]) + records("b", "b", 1, [80.0]))
    (row,) = analysis.delta_rows(single, ["a", "b"])
    assert row["ci_low"] is None and row["verdict"] == "inconclusive"
    assert verdicts.verdict_sentences([row], [], ["a", "b"], SPECS) == [
        "b vs a on short requests is not judged: 1 sample(s) a side, no CI (more --kv-runs / --kv-depth-runs, "
        "or boots) (code -20.0%)."
    ]


# ------------------------------------------------------------------------------ confounds


def evidence(boot: str, arm: dict[str, Any], **over: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "boot": boot,
        "status": "stopped",
        "arm": {"name": arm["name"], "kv_cache_dtype": None, "args": [], "env": {}, "image": None, **arm},
        "argv": ["python", "-m", "vllm", "--model", "/m", "--port", "1111"],
        "env": {"VLLM_CPU_KVCACHE_SPACE": "2"},
        "engine_version": "0.32.0",
        "served_model": "/m",
        "cache_config": {"cache_dtype": "auto", "block_size": "16", "kv_cache_size_tokens": "1000", "engine": "0"},
        "log": {"non_default_args": {"model": "/m", "port": 1111}},
        "gpu_before": {"gpu": True, "cards": [{"index": 0, "name": "H200", "power_limit_w": 700.0}]},
    }
    for key, value in over.items():
        base[key] = value
    return base


def with_dtype(ev: dict[str, Any], dtype: str, capacity: str = "1000") -> dict[str, Any]:
    ev = copy.deepcopy(ev)
    ev["argv"] = [*ev["argv"], "--kv-cache-dtype", dtype]
    ev["cache_config"].update(cache_dtype=dtype, kv_cache_size_tokens=capacity)
    ev["log"]["non_default_args"]["kv_cache_dtype"] = dtype
    return ev


def test_declared_dtype_and_its_capacity_are_not_confounds() -> None:
    a = with_dtype(evidence("auto", {"name": "auto", "kv_cache_dtype": "auto"}), "auto")
    b = with_dtype(evidence("fp8", {"name": "fp8", "kv_cache_dtype": "fp8_e4m3"}), "fp8_e4m3", "2000")
    b["argv"][6] = "2222"  # another port: per boot by construction
    found = confounds.find([a, b])
    assert found["status"] == "clean", found["confounds"]
    assert {d["path"] for d in found["declared"]} == {
        "argv.--kv-cache-dtype",
        "cache_config.cache_dtype",
        "cache_config.kv_cache_size_tokens",
        "non_default_args.kv_cache_dtype",
    }


def test_an_undeclared_engine_arg_is_a_confound_unless_allowed() -> None:
    a = evidence("auto", {"name": "auto", "kv_cache_dtype": "auto"})
    b = evidence("f16x", {"name": "f16x", "kv_cache_dtype": "float16", "args": ["--max-num-seqs", "4"]})
    b["argv"] += ["--max-num-seqs", "4"]
    b["log"]["non_default_args"]["max_num_seqs"] = 4
    assert confounds.find([a, b])["status"] == "clean"  # the arm declares its args
    b["arm"]["knobs"] = ["kv_cache_dtype"]  # … unless it says its knob is the dtype only
    found = confounds.find([a, b])
    assert found["status"] == "CONFOUNDED"
    assert {c["path"] for c in found["confounds"]} == {"argv.--max-num-seqs", "non_default_args.max_num_seqs"}
    assert confounds.describe(found["confounds"][0]) == 'argv.--max-num-seqs: "4" in f16x vs absent in auto'
    allowed = confounds.find([a, b], allow=["argv", "non_default_args.max_num_seqs"])
    assert allowed["status"] == "clean" and len(allowed["allowed"]) == 2


@pytest.mark.parametrize(
    ("path", "change"),
    [
        ("engine_version", lambda e: e.update(engine_version="0.33.0")),
        ("cache_config.block_size", lambda e: e["cache_config"].update(block_size="32")),
        ("gpu.0.power_limit_w", lambda e: e["gpu_before"]["cards"][0].update(power_limit_w=300.0)),
        ("served_model", lambda e: e.update(served_model="/other")),
        ("env.VLLM_CPU_KVCACHE_SPACE", lambda e: e["env"].update(VLLM_CPU_KVCACHE_SPACE="4")),
    ],
)
def test_version_config_gpu_cap_model_and_env_differences_are_confounds(path: str, change: Any) -> None:
    a = evidence("a", {"name": "a"})
    b = evidence("b", {"name": "b"})
    change(b)
    found = confounds.find([a, b])
    assert [c["path"] for c in found["confounds"]] == [path]


def test_boots_of_one_arm_are_compared_with_that_arms_first_boot() -> None:
    a1, b1 = evidence("a.r1", {"name": "a"}), evidence("b.r1", {"name": "b", "kv_cache_dtype": "float16"})
    b1["cache_config"]["cache_dtype"] = "float16"
    b2 = copy.deepcopy(b1)
    b2["boot"] = "b.r2"
    b2["cache_config"]["kv_cache_size_tokens"] = "990"  # memory profiling moved it: expected
    assert confounds.find([a1, b1, b2])["status"] == "clean"
    b2["cache_config"]["block_size"] = "32"
    found = confounds.find([a1, b1, b2])
    assert [(c["path"], c["reference"]) for c in found["confounds"]] == [("cache_config.block_size", "b.r1")]


def test_too_few_boots_is_unknown_not_clean() -> None:
    failed = evidence("b", {"name": "b"}, status="failed")
    assert confounds.find([evidence("a", {"name": "a"}), failed])["status"] == "unknown"


# ------------------------------------------------------------------------------ output agreement


def body(ids: list[int], logprobs: list[float]) -> dict[str, Any]:
    content = [{"token": f"token_id:{i}", "logprob": lp} for i, lp in zip(ids, logprobs, strict=True)]
    return {"choices": [{"logprobs": {"content": content}}]}


def test_agreement_compares_ids_and_logprobs_over_the_common_prefix() -> None:
    a = agreement.parse_response(body([1, 2, 3, 4], [-0.1, -0.2, -0.3, -0.4]))
    b = agreement.parse_response(body([1, 2, 9, 4], [-0.1, -0.25, -1.0, -0.4]))
    pair = agreement.compare_pair(a, b)
    assert pair["identical"] is False and pair["first_divergence"] == 2 and pair["common_prefix"] == 2
    assert pair["mean_abs_logprob_diff"] == pytest.approx(0.025)
    same = agreement.compare_pair(a, a)
    assert same["identical"] and same["first_divergence"] is None and same["mean_abs_logprob_diff"] == 0
    summary = agreement.summarize([pair, same])
    assert summary["identical_share"] == 0.5 and summary["mean_first_divergence"] == 2


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ({"choices": [{"message": {}}]}, "carries no logprobs"),
        ({"choices": [{"logprobs": {"content": [{"token": "hello", "logprob": -1}]}}]}, "token_id:N"),
    ],
)
def test_agreement_says_why_tokens_are_missing(payload: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        agreement.parse_response(payload)


def test_agreement_report_pairs_arms_by_replicate(tmp_path: Path) -> None:
    rows = []
    for arm, boot, rep, ids in (
        ("a", "a.r1", 1, [1, 2, 3]),
        ("b", "b.r1", 1, [1, 2, 3]),
        ("b", "b.r2", 2, [1, 5, 3]),
        ("a", "a.r2", 2, [1, 2, 3]),
    ):
        for index in (0, 1):
            rows.append(
                {
                    "arm": arm,
                    "boot": boot,
                    "replicate": rep,
                    "shape": "code",
                    "index": index,
                    "ok": True,
                    "ids": ids,
                    "logprobs": [-0.5] * 3,
                }
            )
    (tmp_path / "agreement.jsonl").write_text("\n".join(__import__("json").dumps(r) for r in rows) + "\n")
    run = RunData(path=tmp_path, meta={}, records=[], agreement=rows)  # type: ignore[arg-type]
    found_rows = agreement_section.agreement_report(run, ["a", "b"])["rows"]
    found = {(r["kind"], r["arm"]): r for r in found_rows}
    assert verdicts.agreement_sentences(found_rows, ["a", "b"]) == [
        "b changes greedy outputs: 2 of 4 sequences identical to a's; first divergence (mean) code at token 1."
    ]
    assert found[("between arms", "b")]["identical_share"] == 0.5
    assert found[("between arms", "b")]["mean_first_divergence"] == 1
    assert found[("within a boot", "a")]["identical_share"] == 1.0
    assert found[("across boots", "b")]["identical_share"] == 0.0


# ------------------------------------------------------------------------------ adaptive sampling


class FakeSample:
    def __init__(self, ok: bool = True) -> None:
        self.ok = ok
        self.error_kind = None if ok else "engine_died"


def fake_loop(values: list[float], adaptive: Adaptive) -> Any:
    feed = iter(values)

    def send(phase: str, index: int) -> tuple[Any, dict[str, Any]]:
        return FakeSample(), {"value": next(feed)}

    def record(sample: Any, **context: Any) -> dict[str, Any]:
        return {
            "phase": context["phase"],
            "ok": True,
            "excluded_reason": None,
            "flags": [],
            "metrics": {"decode_tps": context["value"]},
            "index": context["index"],
        }

    return run_repeated(send, record, label="t", warmups=0, runs=3, adaptive=adaptive)  # type: ignore[arg-type]


def test_adaptive_sampling_stops_at_the_target() -> None:
    outcome = fake_loop([100, 130, 70, 100.1, 99.9, 100, 100, 100, 100, 100, 100, 100], Adaptive("decode_tps", 10, 12))
    assert outcome.sampling is not None and outcome.sampling["reason"].startswith("target reached")
    assert 3 < outcome.sampling["n"] < 12 and outcome.sampling["half_width_pct"] <= 10


def test_adaptive_sampling_stops_at_the_cap_and_says_so() -> None:
    outcome = fake_loop([50, 150] * 10, Adaptive("decode_tps", 1, 6))
    assert outcome.sampling is not None and outcome.sampling["n"] == 6
    assert outcome.sampling["reason"].startswith("cap reached: 6 request(s)")


def test_llamacpp_cache_types_declared_by_the_dtype_are_not_confounds() -> None:
    def llama(name: str, dtype: str) -> dict[str, Any]:
        ev = evidence(name, {"name": name, "kv_cache_dtype": dtype})
        ev["argv"] = ["llama-server", "--model", "/m.gguf", "--cache-type-k", dtype, "--cache-type-v", dtype]
        return ev

    a, b = llama("f16", "f16"), llama("q8_0", "q8_0")
    found = confounds.find([a, b])
    assert found["status"] == "clean", found["confounds"]
    assert {d["path"] for d in found["declared"]} == {"argv.--cache-type-k", "argv.--cache-type-v"}
    b["argv"] += ["--threads", "1"]  # anything else still is one
    assert [c["path"] for c in confounds.find([a, b])["confounds"]] == ["argv.--threads"]
