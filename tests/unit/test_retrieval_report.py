"""The retrieval probe's report (``report.retrieval``): Wilson and Newcombe intervals, the paired comparison
per cell with McNemar and Holm, the baseline's ceiling, failed requests, gates, the renderers and the frame.
The engine is a seeded test double: records built from a chosen outcome per arm, cell and needle."""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Sequence
from typing import Any

import matplotlib
import numpy as np
import pytest

from pytest_kvcache import stats
from pytest_kvcache.model.records import RetrievalRecord
from pytest_kvcache.report import retrieval, retrieval_render, retrieval_stats
from pytest_kvcache.report.gates import parse
from pytest_kvcache.report.outputs.formats import Table

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.figure import Figure

ARMS = ["auto", "fp8"]
DEPTHS = (8000, 32000)
POSITIONS = (0.1, 0.5, 0.9)
NEEDLES = 60
Cell = tuple[int, float, str, int]
Outcome = Callable[[str, Cell, int], bool]


def records_for(
    outcome: Outcome,
    *,
    arms: Sequence[str] = ARMS,
    depths: Sequence[int] = DEPTHS,
    positions: Sequence[float] = POSITIONS,
    needles: int = NEEDLES,
    boots: int = 1,
    form: str = "recall",
    keys: int = 1,
) -> list[RetrievalRecord]:
    """One record per arm, boot, cell and needle, correct where ``outcome`` says (every boot alike)."""
    out: list[RetrievalRecord] = []
    for arm in arms:
        for boot in range(boots):
            for depth in depths:
                for position in positions:
                    for i in range(needles):
                        correct = outcome(arm, (depth, position, form, keys), i)
                        out.append(
                            {
                                "run_id": "run",
                                "arm": arm,
                                "boot": f"{arm}-b{boot + 1}",
                                "replicate": boot + 1,
                                "test": "test_retrieval",
                                "depth": depth,
                                "position": position,
                                "form": form,
                                "keys": keys,
                                "haystack": "essays",
                                "needle": i,
                                "kind": "number",
                                "key": f"key{i}",
                                "expected": "4217",
                                "returned": "4217" if correct else "9999",
                                "correct": correct,
                                "prompt_tokens": depth,
                                "needle_at": int(depth * position),
                                "wall_s": 0.2,
                                "ok": True,
                                "error": "",
                            }
                        )
    return out


def loss_at(cells: Sequence[Cell], missed: int, seed: int = 0) -> Outcome:
    """The baseline finds every needle; fp8 misses ``missed`` seeded needles in each of ``cells``."""
    rng = random.Random(seed)
    lost = {cell: set(rng.sample(range(NEEDLES), missed)) for cell in cells}
    return lambda arm, cell, i: arm == ARMS[0] or i not in lost.get(cell, set())


def diff_at(sec: dict[str, Any], depth: int, position: float, arm: str = "fp8") -> dict[str, Any]:
    rows: list[dict[str, Any]] = sec["diffs"]
    (row,) = [d for d in rows if d["arm"] == arm and d["depth"] == depth and d["position"] == position]
    return row


def gate(text: str, point: str, records: list[RetrievalRecord], settings: dict[str, Any] | None = None) -> list[Any]:
    found = parse(text, arms=ARMS)
    label = f"{found.metric}[{found.probe}@{point}]: {text.split(':', 1)[1].strip()}"
    return retrieval.gate_results(found, label, point, records, ARMS, settings or {})


# ---- intervals ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("found", "n", "lo", "hi"),
    [(0, 10, 0.0, 0.2775), (10, 10, 0.7225, 1.0), (7, 20, 0.1812, 0.5671), (48, 60, 0.6822, 0.8817)],
)
def test_the_wilson_interval_matches_known_values(found: int, n: int, lo: float, hi: float) -> None:
    got = retrieval_stats.wilson_interval(found, n)
    assert got == pytest.approx((lo, hi), abs=1e-4)


def test_the_wilson_interval_matches_scipys() -> None:
    from scipy.stats import binomtest

    for found, n in [(0, 1), (3, 7), (59, 60), (120, 180)]:
        ci = binomtest(found, n).proportion_ci(method="wilson")
        assert retrieval_stats.wilson_interval(found, n) == pytest.approx((ci.low, ci.high), abs=1e-12)


@pytest.mark.parametrize(
    "probs",
    [(0.78, 0.10, 0.04, 0.08), (0.85, 0.05, 0.05, 0.05), (0.80, 0.20, 0.0, 0.0)],
    ids=["correlated loss", "balanced", "arm loses only"],
)
def test_newcombes_paired_interval_covers_the_true_difference_in_at_least_93_percent(
    probs: tuple[float, float, float, float],
) -> None:
    """2,000 seeded tables of 60 correlated pairs (both, baseline only, arm only, neither)."""
    rng = np.random.default_rng(7)
    true = probs[2] - probs[1]
    covered = 0
    for both, base_only, arm_only, neither in rng.multinomial(60, probs, size=2000):
        lo, hi = retrieval_stats.paired_difference_interval(int(both), int(base_only), int(arm_only), int(neither))
        covered += lo <= true <= hi
    assert covered / 2000 >= 0.93


def test_the_paired_interval_is_narrowed_by_a_positive_correlation() -> None:
    """The same marginals (80% and 90%) paired concordantly give a narrower interval than independently."""
    lo_c, hi_c = retrieval_stats.paired_difference_interval(48, 6, 0, 6)
    lo_i, hi_i = retrieval_stats.paired_difference_interval(43, 11, 5, 1)
    assert hi_c - lo_c < hi_i - lo_i
    assert retrieval_stats.mcnemar_p(0, 0) == 1.0
    assert retrieval_stats.mcnemar_p(12, 0) == pytest.approx(2 * 0.5**12)


@pytest.mark.parametrize(
    "probs", [(0.85, 0.05, 0.05, 0.05), (0.7, 0.15, 0.02, 0.13), (0.45, 0.05, 0.3, 0.2), (0.97, 0.03, 0.0, 0.0)]
)
def test_the_exact_difference_interval_covers_the_true_difference_in_at_least_95_percent(
    probs: tuple[float, float, float, float],
) -> None:
    """2,000 seeded tables of 90 pairs each: at 95% the exact interval covers the true difference at least as
    often as it says (it is conservative), also where every discordant needle goes one way."""
    rng = np.random.default_rng(5)
    true = probs[2] - probs[1]
    covered = 0
    for _both, base_only, arm_only, _neither in rng.multinomial(90, probs, size=2000):
        lo, hi = retrieval_stats.exact_difference_interval(int(base_only), int(arm_only), 90, 0.05)
        covered += lo <= true <= hi
    assert covered / 2000 >= 0.95


def test_the_printed_interval_excludes_zero_exactly_when_holm_decides() -> None:
    """300 seeded families of 2–12 cells with losses of 0–25 points: a cell is better or worse exactly when the
    interval printed beside it (the exact one at its Holm step's level) excludes 0."""
    rng = np.random.default_rng(17)
    checked = decided = 0
    for _ in range(300):
        cells = int(rng.integers(2, 13))
        p_values, tables = [], []
        for _cell in range(cells):
            loss = float(rng.choice([0.0, 0.05, 0.1, 0.25]))
            b, c = int(rng.binomial(90, loss + 0.02)), int(rng.binomial(90, 0.02))
            tables.append((b, c))
            p_values.append(retrieval_stats.mcnemar_p(b, c))
        adjusted = stats.holm(p_values)
        for (b, c), p_holm, alpha in zip(tables, adjusted, stats.holm_levels(p_values), strict=True):
            lo, hi = retrieval_stats.exact_difference_interval(b, c, 90, alpha)
            decides = p_holm < 0.05 and b != c
            assert decides == (lo > 0 or hi < 0), (b, c, p_holm, alpha, lo, hi)
            checked += 1
            decided += decides
    assert checked > 1000 and 0.2 < decided / checked < 0.8


def test_holm_levels_are_each_steps_alpha_until_the_first_step_that_fails() -> None:
    assert stats.holm_levels([0.001, 0.04, 0.012]) == pytest.approx([0.05 / 3, 0.05 / 1, 0.05 / 2])
    # 0.03 fails its step (0.05/2): it and every later one get that step's level
    assert stats.holm_levels([0.001, 0.03, 0.04]) == pytest.approx([0.05 / 3, 0.05 / 2, 0.05 / 2])
    assert stats.holm([0.001, 0.03, 0.04]) == pytest.approx([0.003, 0.06, 0.06])
    assert stats.holm_levels([]) == []


# ---- the section ----------------------------------------------------------------------------------------------


def test_a_loss_of_20_points_in_one_cell_is_worse_and_named() -> None:
    records = records_for(loss_at([(32000, 0.9, "recall", 1)], missed=12))
    sec = retrieval.section(records, ARMS, {})
    assert sec is not None
    row = diff_at(sec, 32000, 0.9)
    assert row["verdict"] == "worse"
    assert row["diff"] == pytest.approx(-0.2)
    lo, hi = row["ci"]
    assert lo <= -0.2 <= hi < 0
    assert (row["b"], row["c"], row["n"], row["family_size"]) == (12, 0, 60, 6)
    assert row["p_holm"] < 0.05
    assert [d["verdict"] for d in sec["diffs"] if d is not row] == ["inconclusive"] * 5
    assert sec["comparisons"] == 6
    (sentence,) = sec["sentences"]
    # the interval that decided: exact, at Holm's first step over 6 cells (99.17%), conservative
    assert row["ci_level"] == pytest.approx(1 - 0.05 / 6, abs=1e-4)
    assert sentence == (
        "fp8 loses 20 points [2, 37] at 32k, 90% of the context; 5 more undecided, their intervals allow a loss of "
        "up to 8 points, at 8k, 10% of the context (Holm over 6 cells)"
    )
    fp8 = [c for c in sec["cells"] if c["arm"] == "fp8" and c["depth"] == 32000 and c["position"] == 0.9]
    assert fp8[0]["acc"] == 0.8 and fp8[0]["found"] == 48 and fp8[0]["n"] == 60
    assert sec["config"]["needles"] == 60 and sec["config"]["haystack"] == "essays"


def test_the_section_is_byte_stable_and_independent_of_record_order() -> None:
    records = records_for(loss_at([(32000, 0.9, "recall", 1)], missed=12))
    first = json.dumps(retrieval.section(records, ARMS, {}), sort_keys=True)
    shuffled = list(records)
    random.Random(3).shuffle(shuffled)
    assert json.dumps(retrieval.section(shuffled, ARMS, {}), sort_keys=True) == first
    assert retrieval.section([], ARMS, {}) is None


def aa_outcome(base: dict[tuple[int, float], Any], flips: dict[tuple[int, float], Any]) -> Outcome:
    """The baseline finds what ``base`` says; fp8 the same, except where ``flips`` turns the outcome over."""

    def outcome(arm: str, cell: Cell, i: int) -> bool:
        found = bool(base[(cell[0], cell[1])][i])
        return found != bool(flips[(cell[0], cell[1])][i]) if arm == "fp8" else found

    return outcome


def test_an_aa_finds_no_cell_beyond_its_interval_in_95_percent_of_runs() -> None:
    """200 seeded A/A runs: the baseline finds each needle with 90%, the arm answers the same except rare
    independent flips (2%, either way)."""
    rng = np.random.default_rng(11)
    quiet = 0
    for _ in range(200):
        base = {(d, p): rng.random(NEEDLES) < 0.9 for d in DEPTHS for p in POSITIONS}
        flips = {key: rng.random(NEEDLES) < 0.02 for key in base}
        sec = retrieval.section(records_for(aa_outcome(base, flips)), ARMS, {})
        assert sec is not None
        quiet += all(d["verdict"] in ("inconclusive", "cannot judge") for d in sec["diffs"])
    assert quiet / 200 >= 0.95


def test_nothing_differs_reads_as_finding_what_the_baseline_finds() -> None:
    sec = retrieval.section(records_for(loss_at([(8000, 0.5, "recall", 1)], missed=2)), ARMS, {})
    assert sec is not None
    assert sec["sentences"] == [
        "fp8: no cell differs from auto (Holm over 6 cells); their intervals allow a loss of up to 15 points, at 8k, "
        "50% of the context"
    ]
    (row,) = [d for d in sec["diffs"] if d["b"]]
    assert row["verdict"] == "inconclusive" and row["ci"][0] < row["diff"] < 0 <= row["ci"][1]


def test_a_baseline_below_the_ceiling_cannot_judge_its_cells_or_gates() -> None:
    def outcome(arm: str, cell: Cell, i: int) -> bool:
        return i % 2 == 0 if cell[0] == 32000 else True  # both arms find half the needles at 32k

    records = records_for(outcome)
    sec = retrieval.section(records, ARMS, {})
    assert sec is not None
    deep = [d for d in sec["diffs"] if d["depth"] == 32000]
    assert {d["verdict"] for d in deep} == {"cannot judge"} and all(d["ceiling"] for d in deep)
    assert all(d["p"] is None and d["family_size"] is None for d in deep)
    assert all(c["ceiling"] for c in sec["cells"] if c["depth"] == 32000)
    assert sec["comparisons"] == 3
    assert (
        "the baseline finds 30 of 60 needles at 32k, 10% of the context: below the 80% ceiling, no verdict"
        in (sec["notes"])
    )
    assert sec["sentences"][0].startswith("fp8: no cell differs from auto (Holm over 3 cells; 3 cells the baseline")
    for text in ("retrieval_acc[retrieval@32k]: fp8 >= auto - 0.05", "retrieval_acc[retrieval@32k]: >= 0.4"):
        results = gate(text, "32k", records)
        assert results and {r["outcome"] for r in results} == {"error"}
        assert all("cannot judge" in r["reason"] and "below the 80% ceiling" in r["reason"] for r in results)
    lowered = retrieval.section(records, ARMS, {"retrieval_ceiling": 0.4})
    assert lowered is not None and lowered["comparisons"] == 6


def test_failed_requests_are_left_out_of_accuracy_and_counted() -> None:
    records = records_for(lambda arm, cell, i: True, boots=2)
    cell = (8000, 0.1)
    for r in records:
        # needle 0 fails on both boots (missing), needles 1 and 2 on the second only
        mine = r["arm"] == "fp8" and (r["depth"], r["position"]) == cell and r["needle"] < 3
        if mine and (r["needle"] == 0 or r["replicate"] == 2):
            r.update({"ok": False, "correct": False, "returned": "", "error": "HTTP 500"})
    sec = retrieval.section(records, ARMS, {})
    assert sec is not None
    (row,) = [c for c in sec["cells"] if c["arm"] == "fp8" and (c["depth"], c["position"]) == cell]
    assert (row["n"], row["found"], row["acc"], row["failed"]) == (59, 59, 1.0, 4)
    assert diff_at(sec, *cell)["n"] == 59
    assert any(n.startswith("fp8: 4 request(s) failed") and "HTTP 500" in n for n in sec["notes"])
    assert any("1 needle(s) answered on one side only" in n for n in sec["notes"])
    frame = retrieval.frame_rows(records)
    assert int((~frame["valid"]).sum()) == 4 and frame["retrieval_acc"].isna().sum() == 4


def test_boots_that_disagree_count_a_needle_found_at_half_or_more() -> None:
    records = records_for(lambda arm, cell, i: True, boots=3)
    for r in records:
        if r["arm"] == "fp8" and r["depth"] == 8000 and r["position"] == 0.1 and r["needle"] in (0, 1):
            r["correct"] = r["replicate"] == 1 if r["needle"] == 0 else r["replicate"] != 1
    sec = retrieval.section(records, ARMS, {})
    assert sec is not None
    (row,) = [c for c in sec["cells"] if c["arm"] == "fp8" and c["depth"] == 8000 and c["position"] == 0.1]
    assert row["found"] == 59  # needle 0: 1 of 3 boots; needle 1: 2 of 3
    assert any("fp8: 2 needle(s) whose boots disagreed" in n for n in sec["notes"])


def test_several_forms_and_keys_are_named_in_the_sentence() -> None:
    records = records_for(loss_at([(32000, 0.9, "question", 4)], missed=12), form="question", keys=4)
    records += records_for(lambda arm, cell, i: True)
    sec = retrieval.section(records, ARMS, {})
    assert sec is not None
    assert sec["config"]["forms"] == ["question", "recall"] and sec["config"]["keys"] == [1, 4]
    assert "at 32k, 90% of the context (question, 4 keys)" in sec["sentences"][0]
    figure = retrieval_render.heatmap_figure({"retrieval": sec}, plt)
    assert figure is not None  # one row of maps per variant, each arm a map, each row its colour bar
    titles = [ax.get_title() for ax in figure.axes if ax.get_title()]
    assert titles == [
        "auto (question, 4 keys)",
        "fp8 (question, 4 keys)",
        "auto (recall, single needle)",
        "fp8 (recall, single needle)",
    ]
    assert len(figure.axes) == 2 * (len(ARMS) + 1)
    plt.close(figure)


# ---- gates ----------------------------------------------------------------------------------------------------


def test_gates_on_a_20_point_loss_at_a_depth() -> None:
    """fp8 misses 12 of 60 needles in every 32k cell (−20 points over 180 paired needles)."""
    records = records_for(loss_at([(32000, p, "recall", 1) for p in POSITIONS], missed=12))
    (fails,) = gate("retrieval_acc[retrieval@32k]: fp8 >= auto - 0.05", "32k", records)
    assert fails["outcome"] == "fail" and fails["value"] == pytest.approx(-0.2)
    assert fails["ci_low"] <= -0.2 <= fails["ci_high"] < -0.05
    assert fails["ci_method"] == "needles" and fails["evidence"]["kind"] == "needles"
    (passes,) = gate("retrieval_acc[retrieval@32k]: fp8 >= auto - 0.30", "32k", records)
    assert passes["outcome"] == "pass"
    (ratio,) = gate("retrieval_acc[retrieval@32k]: fp8 >= auto * 0.95", "32k", records)
    assert ratio["outcome"] == "fail" and ratio["value"] == pytest.approx(0.8)
    assert ratio["ci_low"] < 0.8 < ratio["ci_high"] < 0.95
    (baseline,) = gate("retrieval_acc[retrieval@32k]: >= -5%", "32k", records)
    assert baseline["outcome"] == "fail" and baseline["name"].endswith("(fp8/auto)")
    assert [r["outcome"] for r in gate("retrieval_acc[retrieval@8k]: >= 0.9", "8k", records)] == ["pass", "pass"]
    (deep,) = gate("retrieval_acc[retrieval@32k]: fp8 >= 0.9", "32k", records)
    assert deep["outcome"] == "fail"
    (nothing,) = gate("retrieval_acc[retrieval@4k]: fp8 >= auto - 0.05", "4k", records)
    assert nothing["outcome"] == "error" and "no retrieval records at 4k" in nothing["reason"]


def test_the_gate_dilutes_a_one_cell_loss_over_its_depth() -> None:
    """A 20-point loss in one of three cells is −6.7 points over the depth's 180 needles: open at −5."""
    records = records_for(loss_at([(32000, 0.9, "recall", 1)], missed=12))
    (result,) = gate("retrieval_acc[retrieval@32k]: fp8 >= auto - 0.05", "32k", records)
    assert result["outcome"] == "inconclusive"
    assert result["value"] == pytest.approx(-12 / 180)


# ---- renderers and the frame ----------------------------------------------------------------------------------


def test_the_renderers_carry_the_sentence_and_the_tables() -> None:
    def outcome(arm: str, cell: Cell, i: int) -> bool:
        if cell[:2] == (8000, 0.1):
            return i % 2 == 0  # below the ceiling: hatched, marked †
        return not (arm == "fp8" and cell[:2] == (32000, 0.9) and i < 12)

    sec = retrieval.section(records_for(outcome), ARMS, {})
    report = {"retrieval": sec}
    sentence = sec["sentences"][0] if sec else ""
    lines = retrieval_render.markdown_lines(report)
    text = "\n".join(lines)
    assert "## Retrieval at depth" in text and sentence in text and "†" in text and "worse" in text
    assert retrieval_render.terminal_lines(report) == [f"retrieval: {sentence}"]
    tables = retrieval_render.html_tables(report)
    assert len(tables) == 2 and all(isinstance(t, Table) and t.rows for t in tables)
    assert sentence in tables[0].intro
    assert any(cell.cls == "worse" for row in tables[1].rows for cell in row)
    figure = retrieval_render.heatmap_figure(report, plt)
    assert isinstance(figure, Figure)
    plt.close(figure)
    assert retrieval_render.markdown_lines({}) == [] and retrieval_render.terminal_lines({}) == []
    assert retrieval_render.html_tables({}) == [] and retrieval_render.heatmap_figure({}, plt) is None


def test_frame_rows_give_the_probe_its_points() -> None:
    frame = retrieval.frame_rows(records_for(loss_at([(32000, 0.9, "recall", 1)], missed=12)))
    assert {"probe", "point", "arm", "boot", "replicate", "retrieval_acc", "valid"} <= set(frame.columns)
    assert set(frame["probe"]) == {"retrieval"} and set(frame["point"]) == {"8k", "32k"}
    deep = frame[(frame["arm"] == "fp8") & (frame["point"] == "32k")]
    assert deep["retrieval_acc"].mean() == pytest.approx(1 - 12 / 180)
    assert retrieval.frame_rows([]).empty


def test_the_exact_pieces_match_scipys_binomial_test() -> None:
    from scipy.stats import binomtest

    for found, n in [(0, 12), (3, 7), (12, 12), (45, 90)]:
        ci = binomtest(found, n).proportion_ci(confidence_level=0.99, method="exact")
        assert retrieval_stats.clopper_pearson(found, n, 0.01) == pytest.approx((ci.low, ci.high), abs=1e-9)
    for b, c in [(9, 0), (5, 3), (0, 1), (20, 31)]:
        assert retrieval_stats.mcnemar_p(b, c) == pytest.approx(binomtest(min(b, c), b + c, 0.5).pvalue, abs=1e-12)


def test_a_cell_one_arm_never_answered_is_not_measured_not_a_ceiling() -> None:
    """A run stopped before an arm reached a cell: the cell says "not measured", the sentence counts it, and it is
    neither judged nor called one the baseline cannot judge."""
    records = [
        r
        for r in records_for(lambda arm, cell, i: True)
        if not (r["arm"] == "fp8" and r["depth"] == 32000 and r["position"] == 0.9)
    ]
    sec = retrieval.section(records, ARMS, {})
    assert sec is not None
    row = diff_at(sec, 32000, 0.9)
    assert row["verdict"] == "not measured" and row["n"] == 0 and not row["ceiling"]
    assert "fp8 at 32k, 90% of the context: not measured (no needle answered)" in sec["notes"]
    assert sec["sentences"][0].startswith("fp8: no cell differs from auto (Holm over 5 cells; 1 cell not measured)")
