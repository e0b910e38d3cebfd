from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd
import pytest

from pytest_kvcache import crossing, stats
from pytest_kvcache.metrics import catalogue
from pytest_kvcache.probes import registry
from pytest_kvcache.report import bands, comparison, gate_outcome, gates, spread, verdicts
from pytest_kvcache.report import frame as report_frame
from pytest_kvcache.report.frame import compare
from pytest_kvcache.report.points import point_of
from tests.factories import measured_records

SPECS = registry.resolve()


def frame(records: list[dict]) -> pd.DataFrame:
    return report_frame.frame(records, SPECS)  # type: ignore[arg-type]


def test_ratio_ci_of_constant_samples_is_exact() -> None:
    assert stats.ratio_ci([10.0, 10.0, 10.0], [12.0, 12.0, 12.0]) == pytest.approx((1.2, 1.2, 1.2))


def test_values_per_boot_keep_the_units_first_order_and_block_and_skip_what_has_none() -> None:
    """A unit's values are its valid, present ones; units keep the order they first appear in (an invalid row
    counts), each with its first row's block; a unit with no value, and a row without a unit, give none."""
    nan = float("nan")
    group = pd.DataFrame(
        {
            "unit": ["b", "a", "b", None, "c", "a", "d"],
            "block": [1, 2, 3, 4, 5, 6, 7],
            "valid": [False, True, True, True, True, True, True],
            "ttft_s": [9.0, 1.0, 2.0, 8.0, nan, 3.0, None],
        }
    )
    assert report_frame.by_boot_strata(group, "ttft_s") == ([[2.0], [1.0, 3.0]], [1, 2])
    assert report_frame.by_boot_strata(group, "decode_tps") == ([], [])
    assert report_frame.by_boot_strata(group.drop(columns="block"), "ttft_s")[1] == [0, 0]


def test_paired_ci_removes_shared_noise() -> None:
    base = [1.0, 2.0, 3.0, 4.0]
    arm = [2.0, 4.0, 6.0, 8.0]  # exactly 2× per pair, but the pairs differ widely
    ratio, lo, hi = stats.ratio_ci(base, arm, paired=True)
    assert (ratio, lo, hi) == pytest.approx((2.0, 2.0, 2.0))
    _, ulo, uhi = stats.ratio_ci(base, arm, paired=False)
    assert ulo < 2.0 < uhi and uhi - ulo > 1.0


def test_bootstrap_matches_an_independent_computation_with_the_same_seed() -> None:
    base, arm = np.array([9.0, 10.0, 11.0, 10.5]), np.array([12.0, 11.0, 13.0, 12.5, 12.2])
    rng = np.random.default_rng(3)
    bi = rng.integers(0, 4, size=(500, 4))
    ai = rng.integers(0, 5, size=(500, 5))
    boot = arm[ai].mean(axis=1) / base[bi].mean(axis=1)
    expected = (arm.mean() / base.mean(), *np.percentile(boot, [2.5, 97.5]))
    assert stats.ratio_ci(base, arm, n_boot=500, seed=3) == pytest.approx(expected)


def test_ratio_ci_edge_cases() -> None:
    assert stats.ratio_ci([], [1.0]) == (None, None, None)
    assert stats.ratio_ci([2.0], [3.0]) == (1.5, None, None)
    assert stats.mean_ci([5.0]) == (5.0, None, None)
    mean, lo, hi = stats.mean_ci([1.0, 2.0, 3.0], seed=1)
    assert mean == 2.0 and 1.0 <= lo <= 2.0 <= hi <= 3.0


@pytest.mark.parametrize(
    ("metric", "lo", "hi", "expected"),
    [
        ("decode_tps", 1.05, 1.2, "better"),
        ("decode_tps", 0.8, 0.95, "worse"),
        ("ttft_s", 1.05, 1.2, "worse"),
        ("ttft_s", 0.8, 0.95, "better"),
        ("ttft_s", 0.9, 1.1, "inconclusive"),
        ("decode_tps", None, None, "inconclusive"),
    ],
)
def test_verdicts_are_direction_aware(metric: str, lo: float | None, hi: float | None, expected: str) -> None:
    assert stats.verdict(metric, lo, hi) == expected


def test_crossover_on_a_synthetic_curve_with_a_known_crossing() -> None:
    xs = [1000.0, 2000.0, 4000.0, 8000.0]
    base = [[100.0, 100.0, 100.0]] * 4
    arm = [[150.0] * 3, [120.0] * 3, [90.0] * 3, [60.0] * 3]
    found = crossing.crossover(xs, base, arm)
    known = 2000 + 2000 * math.log(1.2) / (math.log(1.2) - math.log(0.9))  # linear in log(ratio): 3267.6
    assert found["estimate"] == pytest.approx(known)
    assert found["ci_low"] == pytest.approx(known) and found["ci_high"] == pytest.approx(known)
    assert found["share"] == 1.0


def test_crossover_with_noise_has_a_ci_around_the_crossing() -> None:
    rng = np.random.default_rng(0)
    xs = [1000.0, 2000.0, 4000.0, 8000.0]
    base = [list(100 + rng.normal(0, 1, 5)) for _ in xs]
    arm = [list(v + rng.normal(0, 1, 5)) for v in (150.0, 120.0, 90.0, 60.0)]
    found = crossing.crossover(xs, base, arm, seed=1)
    assert 2000 < found["ci_low"] <= found["estimate"] <= found["ci_high"] < 4000


def test_identical_arms_or_a_touch_of_one_is_no_crossover() -> None:
    """The H200 spec-decode run: both arms accepted every draft (ratio exactly 1 at every depth), and the
    old rule reported a crossing at the first point."""
    same = crossing.crossover([4000.0, 32000.0], [[3.5, 3.5]] * 2, [[3.5, 3.5]] * 2)
    assert same["estimate"] is None and same["share"] == 0.0
    touch = crossing.crossover([1.0, 2.0, 3.0], [[1.0]] * 3, [[1.0], [1.2], [1.1]])
    assert touch["estimate"] is None
    through = crossing.crossover([1.0, 2.0, 3.0], [[1.0]] * 3, [[1.2], [1.0], [0.8]])
    assert through["estimate"] == 2.0


def test_no_crossover() -> None:
    found = crossing.crossover([1.0, 2.0, 3.0], [[1.0, 1.0]] * 3, [[2.0, 2.0]] * 3)
    assert found["estimate"] is None and found["share"] == 0.0


# ------------------------------------------------------------------------------------------- gates


def test_gate_grammar() -> None:
    g = gates.parse("decode_tps[short]: int8 >= fp8 * 1.20", arms=["fp8", "int8"])
    assert (g.kind, g.arm, g.other, g.op, g.threshold, g.point) == ("between", "int8", "fp8", ">=", 1.2, None)
    g = gates.parse("ttft_s[prefill@10k]: <= +10%")
    assert (g.kind, g.op, g.threshold, g.point) == ("baseline", "<=", pytest.approx(1.1), "10k")
    g = gates.parse("decode_tps[agentic@turn15]: >= 30")
    assert (g.kind, g.arm, g.threshold) == ("absolute", None, 30.0)
    g = gates.parse("decode_tps[agentic@turn15]: fp8 > 30", arms=["fp8"])
    assert (g.kind, g.arm, g.op) == ("absolute", "fp8", ">")
    g = gates.parse("ttft_s[prefill]: <= saved +5%")
    assert (g.kind, g.threshold) == ("saved", pytest.approx(1.05))
    assert gates.parse("ttft_s[short]: < saved * 0.9").threshold == 0.9
    assert gates.parse("wall_tps[short]: >= -5%").threshold == pytest.approx(0.95)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("decode_tps short >= 1", "expected METRIC[SELECTOR]: CONDITION"),
        ("speed[short]: >= 1", "unknown metric 'speed' for probe short; known: wall_tps, decode_tps, ttft_s"),
        ("decode_tps[long]: >= 1", "unknown probe 'long'; known: short, prefill, agentic, concurrency"),
        ("decode_tps[short long]: >= 1", "a selector is PROBE or PROBE@POINT, got [short long]"),
        ("decode_tps[short]: int9 >= fp8", "unknown arm 'int9'; arms: fp8, int8"),
        ("decode_tps[short]: >= lots", "cannot read the condition '>= lots'"),
        ("decode_tps[short@]: >= 1", "empty point after '@'"),
    ],
)
def test_malformed_gates_point_at_the_bad_part(text: str, message: str) -> None:
    with pytest.raises(gates.GateError) as exc:
        gates.parse(text, arms=["fp8", "int8"], specs=SPECS)
    assert message in str(exc.value)


@pytest.mark.parametrize(
    ("op", "lo", "hi", "threshold", "outcome"),
    [
        (">=", 1.25, 1.4, 1.2, "pass"),
        (">=", 1.0, 1.15, 1.2, "fail"),
        (">=", 1.1, 1.3, 1.2, "inconclusive"),
        ("<=", 0.9, 1.05, 1.1, "pass"),
        ("<=", 1.12, 1.3, 1.1, "fail"),
        ("<", 1.0, 1.1, 1.1, "inconclusive"),
        (">", 1.1, 1.2, 1.1, "inconclusive"),
        (">=", None, None, 1.0, "inconclusive"),
    ],
)
def test_a_gate_fails_only_when_the_ci_excludes_the_threshold(op, lo, hi, threshold, outcome) -> None:
    assert gate_outcome.judge(op, lo, hi, threshold) == outcome


def _records(arm: str, values: list[float], probe: str = "short", shape: str = "code", boots: int = 1) -> list[dict]:
    return measured_records(
        arm,
        values,
        boot=lambda i: arm if boots == 1 else f"{arm}.r{i % boots + 1}",
        probe=probe,
        shape=shape,
        metrics=lambda v: {"decode_tps": v, "ttft_s": 1 / v},
    )


def test_evaluate_between_baseline_and_absolute() -> None:
    fp8, int8 = [100.0, 101.0, 99.0, 100.5, 100.2, 99.8], [130.0, 131.0, 129.0, 130.5, 130.2, 129.8]
    data = frame(_records("fp8", fp8, boots=3) + _records("int8", int8, boots=3))
    arms = ["fp8", "int8"]
    parsed = [
        gates.parse(t, arms=arms)
        for t in (
            "decode_tps[short]: int8 >= fp8 * 1.20",
            "decode_tps[short]: int8 >= fp8 * 1.40",
            "ttft_s[short]: <= +10%",
            "decode_tps[short@code]: fp8 >= 200",
            "decode_tps[prefill]: >= 1",
        )
    ]
    results = gates.evaluate(parsed, data, arms, seed=0)
    assert [r["outcome"] for r in results] == ["pass", "fail", "pass", "fail", "error"]
    assert results[0]["name"] == "decode_tps[short@code]: int8 >= fp8 * 1.20 (int8/fp8)"
    assert results[0]["value"] == pytest.approx(sum(int8) / sum(fp8), rel=1e-4)  # geometric mean of boot means
    assert results[0]["ci_method"] == "boots" and "within_boot_outcome" not in results[0]
    assert results[-1]["reason"] == (
        "cannot be evaluated: no prefill test ran in this run (not selected by -m or -k, or every one skipped)"
    )


def test_one_boot_per_arm_decides_a_gate_missed_or_met_far_beyond_boot_to_boot_variation() -> None:
    """With fewer than 3 boots per arm the within-boot CI is widened by the default band: a gate whose threshold
    sits inside the band around the measured +60% is undecided (either side), one a factor beyond it is decided,
    and ×5 / ×0.2 gates always are."""
    band = bands.band("decode_tps", "cpu")
    assert band is not None
    reach = math.exp(1.96 * math.sqrt(2) * band.boot_sd)  # the band's reach around a one-boot ratio, as a factor
    near_low, near_high = 1.6 / reach**0.5, 1.6 * reach**0.5
    far_low, far_high = 1.6 / reach**2, 1.6 * reach**2
    data = frame(_records("fp8", [100.0, 101.0, 99.0, 100.5]) + _records("int8", [160.0, 161.0, 159.0, 160.5]))
    arms = ["fp8", "int8"]
    texts = (
        f"decode_tps[short]: int8 >= fp8 * {near_high:.4f}",
        f"decode_tps[short]: int8 >= fp8 * {near_low:.4f}",
        "decode_tps[short]: int8 >= fp8 * 5",
        "decode_tps[short]: int8 >= fp8 * 0.2",
        "decode_tps[short]: >= 1",
        f"decode_tps[short]: int8 >= fp8 * {far_high:.4f}",
        f"decode_tps[short]: int8 >= fp8 * {far_low:.4f}",
    )
    results = gates.evaluate([gates.parse(t, arms=arms) for t in texts], data, arms, seed=0, platform="cpu")
    assert [r["outcome"] for r in results] == [
        "inconclusive",
        "inconclusive",
        "fail",
        "pass",
        "pass",
        "pass",
        "fail",
        "pass",
    ]
    for r in results[:4]:
        evidence = r["evidence"]
        assert evidence["kind"] == "default band" and evidence["family"] == "decode rate"
        assert evidence["boot_sd_pct"] == pytest.approx(band.boot_sd * 100)
        lo, hi = evidence["within_ci"]
        assert lo is not None and hi is not None and r["ci_low"] is not None and r["ci_high"] is not None
        assert r["ci_low"] < lo < hi < r["ci_high"]  # widened, around the same ratio
        assert "widened by the default CPU decode rate band" in r["reason"]
    # the open ones say how many more boots per arm would likely decide them; the decided ones do not
    assert isinstance(results[0]["boots_to_decide"], int) and "boots_to_decide" not in results[2]
    # an absolute gate's within-boot CI is widened the same way (by one arm's boot variation)
    assert results[4]["evidence"]["kind"] == "default band" and results[4]["ci_method"] == "within-boot"


def test_the_gpu_band_applies_when_the_run_saw_gpus() -> None:
    assert bands.platform_of({"a": {"gpu_before": {"gpu": True}}}) == "gpu"  # type: ignore[dict-item]
    assert bands.platform_of({"a": {"gpu_before": {"gpu": False}}, "b": {}}) == "cpu"  # type: ignore[dict-item]
    gpu, cpu = bands.band("ttft_s", "gpu"), bands.band("ttft_s", "cpu")
    assert gpu is not None and cpu is not None and gpu.platform == "gpu" and gpu.family == "latency"
    assert catalogue.family("my_probe_tps") == "decode rate" and catalogue.family("queue_s") == "latency"
    unknown = bands.band("score", "cpu")  # no family: the platform's widest band
    assert unknown is not None and "no family of its own" in unknown.source


def test_boots_to_decide_grows_as_the_estimate_nears_the_threshold() -> None:
    far = gates.boots_to_decide(0.90, 0.80, 1.01, 0.97, 1, ratio=True)
    near = gates.boots_to_decide(0.95, 0.85, 1.06, 0.97, 1, ratio=True)
    assert far is not None and near is not None and far < near
    assert gates.boots_to_decide(0.97, 0.9, 1.05, 0.97, 1, ratio=True) is None  # on the threshold: never
    assert gates.boots_to_decide(None, None, None, 0.97, 1, ratio=True) is None


def test_gate_on_a_probe_without_valid_samples_is_inconclusive() -> None:
    recs = _records("fp8", [100.0, 101.0])
    for r in recs:
        r["ok"], r["excluded_reason"] = False, "stall: no chunk"
    results = gates.evaluate([gates.parse("decode_tps[short]: >= 1")], frame(recs), ["fp8"], seed=0)
    assert [(r["outcome"], r["reason"]) for r in results] == [("inconclusive", "no valid samples")]


def test_point_and_pairing() -> None:
    assert point_of({"probe": "prefill", "depth": 10000}, SPECS) == "10k"
    assert point_of({"probe": "prefill", "depth": 12500}, SPECS) == "12500"
    assert point_of({"probe": "agentic", "turn": 3}, SPECS) == "turn3"
    base = pd.DataFrame({"pair": [(1, 0), (1, 1), (1, 2)], "valid": [True] * 3, "decode_tps": [1.0, 2.0, 3.0]})
    arm = pd.DataFrame({"pair": [(1, 0), (1, 1), (1, 2)], "valid": [True] * 3, "decode_tps": [2.0, 4.0, 6.0]})
    result = compare(base, arm, "decode_tps", seed=0)
    assert result["paired"] and result["ci_low"] == pytest.approx(2.0) and result["verdict"] == "better"


def _prefill(arm: str, boot: str, replicate: int, depth: int, values: list[float]) -> list[dict[str, Any]]:
    return [
        {
            "arm": arm,
            "boot": boot,
            "replicate": replicate,
            "probe": "prefill",
            "depth": depth,
            "phase": "measured",
            "index": i,
            "ok": True,
            "excluded_reason": None,
            "metrics": {"prefill_tps": v},
            "sample": {"prompt_tokens": depth},
        }
        for i, v in enumerate(values)
    ]


def _crossings(recs: list[dict[str, Any]]) -> tuple[list[Any], list[Any]]:

    specs = registry.resolve()
    data = frame(recs)
    data["unit"], data["block"] = data["boot"], 0
    deltas = comparison.delta_rows(data, ["a", "b"], specs, 0)
    spread.judge_deltas(deltas, "cpu")
    rows = comparison.crossover_rows(data, ["a", "b"], specs, 0, "cpu")
    verdicts.judge_crossovers(rows, deltas)
    return rows, deltas


def test_a_flat_noisy_curve_gives_no_crossover() -> None:
    """The arm's ratio wanders around 1 (the point estimate does change sign), no point's CI excludes parity
    once boot-to-boot variation is in it: no crossover is stated, in the row, the verdict or the plot."""

    recs: list[dict[str, Any]] = []
    for depth, wobble in zip((1000, 2000, 4000, 8000, 16000), (1.02, 0.99, 1.015, 0.985, 1.01), strict=True):
        recs += _prefill("a", "a", 1, depth, [100.0, 103.0, 97.0])
        recs += _prefill("b", "b", 1, depth, [100.0 * wobble, 103.0 * wobble, 97.0 * wobble])
    rows, deltas = _crossings(recs)
    (row,) = [r for r in rows if r["metric"] == "prefill_tps"]
    assert row["estimate"] is not None  # the point estimate crosses 1 …
    assert row["significant"] is False  # … the data do not carry it
    assert row["statement"].startswith("no significant crossover in the measured range (1,000–16,000 depth)")
    sentences = verdicts.verdict_sentences(deltas, rows, ["a", "b"], registry.resolve())
    assert not any("changes sign" in s for s in sentences)
    assert any("no significant crossover" in s for s in sentences)


def test_a_curve_that_really_crosses_gives_a_crossover_with_its_interval() -> None:
    """3 boots per arm; the arm is 1.6× the baseline at 1k–2k and 0.5× at 8k–16k: points on each side
    exclude parity, so the crossing is stated, between the nearest such points on either side."""

    recs: list[dict[str, Any]] = []
    shape = {1000: 1.6, 2000: 1.5, 4000: 1.1, 8000: 0.6, 16000: 0.5}
    for r, drift in zip((1, 2, 3), (1.0, 1.02, 0.98), strict=True):
        for depth, ratio in shape.items():
            recs += _prefill("a", f"a.r{r}", r, depth, [100.0 * drift, 101.0 * drift, 99.0 * drift])
            recs += _prefill("b", f"b.r{r}", r, depth, [100.0 * ratio * drift, 101.0 * ratio, 99.0 * ratio])
    rows, deltas = _crossings(recs)
    (row,) = [r for r in rows if r["metric"] == "prefill_tps"]
    assert row["ci_method"] == "boots" and row["significant"] is True
    assert row["evidence"].startswith("a point on each side excludes parity")
    assert row["estimate"] is not None and 4000 < row["estimate"] < 8000
    lo, hi = row["ci_low"], row["ci_high"]
    assert lo is not None and hi is not None and lo <= row["estimate"] <= hi and row["bracket"] == [lo, hi]
    assert lo in (2000, 4000) and hi == 8000  # the nearest points whose CIs exclude parity on either side
    assert row["statement"].startswith(f"crosses 1 between {lo:,.0f} and 8,000 depth")
    sentences = verdicts.verdict_sentences(deltas, rows, ["a", "b"], registry.resolve())
    assert any("relative to a changes sign between" in s for s in sentences)


def test_a_crossing_is_placed_between_the_points_that_exclude_parity_not_where_noise_crosses() -> None:
    """The estimates first cross 1 among points whose CIs include parity (1k → 2k), but the points that
    exclude it are above at 4k and below at 16k: the crossing is stated between 4k and 16k, where the data
    carry it — not at the noise's first sign change."""
    recs: list[dict[str, Any]] = []
    shape = {1000: 1.01, 2000: 0.99, 4000: 1.5, 8000: 1.02, 16000: 0.5}
    for r, drift in zip((1, 2, 3), (1.0, 1.02, 0.98), strict=True):
        for depth, ratio in shape.items():
            recs += _prefill("a", f"a.r{r}", r, depth, [100.0 * drift, 101.0 * drift, 99.0 * drift])
            recs += _prefill("b", f"b.r{r}", r, depth, [100.0 * ratio * drift, 101.0 * ratio, 99.0 * ratio])
    rows, _ = _crossings(recs)
    (row,) = [r for r in rows if r["metric"] == "prefill_tps"]
    assert row["significant"] is True and row["bracket"] == [4000, 16000]
    assert row["estimate"] is not None and 8000 < row["estimate"] < 16000


def test_a_curve_whose_significant_points_change_side_twice_has_no_single_crossover() -> None:
    """Above parity at 1k, below at 4k, above again at 16k, each excluding it: no one crossover is stated."""

    recs: list[dict[str, Any]] = []
    shape = {1000: 1.5, 2000: 1.0, 4000: 0.6, 8000: 1.0, 16000: 1.5}
    for r, drift in zip((1, 2, 3), (1.0, 1.02, 0.98), strict=True):
        for depth, ratio in shape.items():
            recs += _prefill("a", f"a.r{r}", r, depth, [100.0 * drift, 101.0 * drift, 99.0 * drift])
            recs += _prefill("b", f"b.r{r}", r, depth, [100.0 * ratio * drift, 101.0 * ratio, 99.0 * ratio])
    rows, deltas = _crossings(recs)
    (row,) = [r for r in rows if r["metric"] == "prefill_tps"]
    assert row["significant"] is False
    assert row["statement"].startswith("changes sign more than once in the measured range (1,000–16,000 depth)")
    sentences = verdicts.verdict_sentences(deltas, rows, ["a", "b"], registry.resolve())
    assert not any("changes sign by" in s or "changes sign between" in s for s in sentences)
