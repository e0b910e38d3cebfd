"""Multiplicity control (issue 41): Holm within each (arm, probe, metric) family of deltas, the p-value read
from the interval a verdict is decided on, crossovers after Holm, the first screen's count line, and the
one-session agentic wording."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any, cast

import pytest

from pytest_kvcache import stats
from pytest_kvcache.model.report import CrossoverRow, DeltaRow
from pytest_kvcache.probes import registry
from pytest_kvcache.report import cost, multiplicity, spread
from pytest_kvcache.report.verdicts import judge_crossovers, verdict_sentences

ROOT = Path(__file__).resolve().parents[2]
SPECS = registry.resolve()


def test_holm_matches_the_textbook_example() -> None:
    """Holm (1979) as Wikipedia works it: p = 0.01, 0.04, 0.03, 0.005 at α = 0.05 — sorted 0.005, 0.01, 0.03,
    0.04 times 4, 3, 2, 1 is 0.02, 0.03, 0.06, 0.04, monotone 0.02, 0.03, 0.06, 0.06: H1 and H4 are rejected,
    H2 and H3 are not (statsmodels' multipletests(method="holm") gives the same numbers)."""
    adjusted = stats.holm([0.01, 0.04, 0.03, 0.005])
    assert adjusted == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert [p < 0.05 for p in adjusted] == [True, False, False, True]
    assert stats.holm([]) == []
    assert stats.holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])  # capped at 1
    assert stats.holm([0.04]) == pytest.approx([0.04])  # a family of one is not adjusted


@pytest.mark.parametrize(
    ("ratio", "lo", "hi"),
    [
        (1.2, 1.01, 1.5),  # excludes 1 above
        (1.2, 0.99, 1.5),  # includes 1
        (0.66, 0.46, 0.94),  # excludes 1 below, skewed
        (0.66, 0.46, 1.02),  # includes 1
        (2.04, 1.59, 2.63),
        (0.9, 0.5, 1.3),
    ],
)
def test_the_p_value_agrees_with_the_interval_the_verdict_is_taken_on(ratio: float, lo: float, hi: float) -> None:
    p = stats.interval_p_value(ratio, lo, hi)
    assert (p < 0.05) == (lo > 1 or hi < 1)


def test_a_symmetric_log_interval_gives_the_normal_test_p() -> None:
    """A 95% interval exp(log r ± 1.96·se): p is the two-sided normal p of z = log r / se."""
    from scipy import stats as scipy_stats

    se, ratio = 0.1, 1.25
    z = scipy_stats.norm.ppf(0.975)
    p = stats.interval_p_value(ratio, ratio * math.exp(-z * se), ratio * math.exp(z * se))
    assert p == pytest.approx(2 * scipy_stats.norm.sf(math.log(ratio) / se), rel=1e-9)
    assert stats.interval_p_value(1.0, 0.9, 1.1) == 1.0
    assert stats.interval_p_value(1.01, 1.01, 1.01) == 0.0  # a degenerate interval away from parity


def test_over_boots_the_p_value_is_the_welch_t_test_the_interval_inverts() -> None:
    """3 boots a side: the CI is a Welch t-interval on the log boot means; its p is scipy's Welch t-test on the
    same logs — not a normal approximation, which would be too small at a few degrees of freedom."""
    from scipy import stats as scipy_stats

    base = [[100.0, 101.0], [96.0, 95.0], [104.0, 103.0]]
    arm = [[88.0, 89.0], [92.0, 91.0], [85.0, 86.0]]
    ratio, lo, hi = stats.ratio_ci_boots(base, arm)
    df = stats.ratio_df_boots(base, arm)
    assert ratio is not None and lo is not None and hi is not None and df is not None
    logs = [[math.log(sum(b) / len(b)) for b in side] for side in (arm, base)]
    welch = scipy_stats.ttest_ind(*logs, equal_var=False).pvalue
    p = stats.interval_p_value(ratio, lo, hi, df=df)
    assert p == pytest.approx(welch, rel=1e-6)
    assert p > stats.interval_p_value(ratio, lo, hi)  # the normal approximation would understate it


def _delta(point: str, ratio: float, lo: float, hi: float, *, metric: str = "decode_tps", **extra: Any) -> DeltaRow:
    verdict = stats.verdict(metric, lo, hi)
    row = {
        "arm": "b",
        "baseline": "a",
        "probe": "agentic",
        "point": point,
        "metric": metric,
        "ratio": ratio,
        "delta_pct": (ratio - 1) * 100,
        "ci_low": lo,
        "ci_high": hi,
        "ci_method": "boots",
        "verdict": verdict,
        "n_baseline": 3,
        "n_arm": 3,
        **extra,
    }
    return cast(DeltaRow, row)


def _family(worse_at: dict[int, tuple[float, float, float]], points: int = 14) -> list[DeltaRow]:
    return [
        _delta(f"turn{k}", *worse_at.get(k, (1.0, 0.8, 1.25)))  # the rest: a wide CI around parity
        for k in range(2, 2 + points)
    ]


def test_a_point_that_passes_raw_but_not_holm_becomes_inconclusive() -> None:
    """One of 14 points excludes parity (raw p ≈ 0.02) — as fp8's agentic turn 13 in h200-trained — but not
    after Holm over the 14: inconclusive, with a note; a point far beyond parity stays worse."""
    deltas = _family({13: (0.66, 0.46, 0.94), 9: (0.5, 0.45, 0.55)})
    before = {d["point"]: d["verdict"] for d in deltas}
    assert before["turn13"] == "worse" and before["turn9"] == "worse"
    multiplicity.apply_holm(deltas)
    by = {d["point"]: d for d in deltas}
    assert by["turn13"]["p_value"] < 0.05 <= by["turn13"]["p_holm"]
    assert by["turn13"]["verdict"] == "inconclusive"
    assert by["turn13"]["verdict_note"].startswith("not beyond Holm over 14 comparisons")
    assert by["turn9"]["verdict"] == "worse" and by["turn9"]["p_holm"] < 0.05
    assert all(d["family_size"] == 14 for d in deltas)
    multiplicity.apply_holm(deltas)  # idempotent
    assert by["turn13"]["verdict"] == "inconclusive" and by["turn9"]["verdict"] == "worse"


def test_families_are_separate_and_a_family_of_one_is_not_adjusted() -> None:
    """A family is one arm and probe: another probe's delta is not adjusted for the agentic turns; another metric
    of the same probe is (its requests are the same)."""
    deltas = [_delta("code", 0.66, 0.46, 0.94, metric="ttft_s", probe="short"), *_family({})]
    multiplicity.apply_holm(deltas)
    assert deltas[0]["family_size"] == 1 and deltas[0]["verdict"] == "better"  # ttft_s down: better
    assert deltas[0]["p_holm"] == deltas[0]["p_value"]
    same_probe = [_delta("turn2", 0.66, 0.46, 0.94, metric="ttft_s"), *_family({})]
    multiplicity.apply_holm(same_probe)
    assert same_probe[0]["family_size"] == 15 and same_probe[0]["p_holm"] > same_probe[0]["p_value"]


def test_within_boot_p_comes_from_the_widened_interval() -> None:
    """A within-boot delta judged on ``judged_ci`` (bands.judge_deltas): its p is that interval's, not the
    narrow CI's — a narrow CI that excludes parity inside a widened one that does not gives p ≥ 0.05."""
    d = _delta("turn2", 1.1, 1.05, 1.15, ci_method="within-boot", judged_ci=[0.95, 1.27])
    d["verdict"] = "inconclusive"
    multiplicity.apply_holm([d])
    assert d["p_value"] == pytest.approx(stats.interval_p_value(1.1, 0.95, 1.27))
    assert d["p_value"] >= 0.05
    # judged with Student's t (a spread estimated from few boots): the p-value is that t-test's
    spread = {"kind": "run's boots", "sd_pct": 10.0, "df": 2.0, "text": "this run's boot-to-boot spread"}
    noisy = _delta("turn2", 1.1, 1.05, 1.15, ci_method="within-boot", judged_ci=[0.95, 1.27], spread=spread)
    multiplicity.apply_holm([noisy])
    assert noisy["p_value"] == pytest.approx(stats.interval_p_value(1.1, 0.95, 1.27, df=2.0))


def _crossover(names: list[str], xs: list[float], **extra: Any) -> CrossoverRow:
    row = {
        "arm": "b",
        "baseline": "a",
        "probe": "agentic",
        "metric": "decode_tps",
        "axis": "prompt tokens",
        "xs": xs,
        "point_names": names,
        "estimate": 2800.0,
        "ci_low": 1800.0,
        "ci_high": 5500.0,
        "share": 1.0,
        "points": len(xs),
        "ci_method": "boots",
        **extra,
    }
    return cast(CrossoverRow, row)


def test_a_crossover_needs_points_on_each_side_after_holm() -> None:
    """Above parity at turn 9 (far), below at turn 13 (raw p ≈ 0.02): before Holm a crossover would be
    stated; after it, not — even though every resampled curve crosses the same way."""
    deltas = _family({9: (2.04, 1.59, 2.63), 13: (0.66, 0.46, 0.94)})
    names = [d["point"] for d in deltas]
    xs = [float(200 * k) for k in range(2, 16)]
    raw = [_crossover(names, xs)]
    judge_crossovers(raw, deltas)
    assert raw[0]["significant"] is True  # the raw verdicts carry it …
    multiplicity.apply_holm(deltas)
    held = [_crossover(names, xs)]
    judge_crossovers(held, deltas)
    assert held[0]["significant"] is False  # … Holm does not
    assert "no point on each side excludes parity" in held[0]["statement"]
    sentences = verdict_sentences(deltas, held, ["a", "b"], SPECS)
    assert not any("changes sign" in s for s in sentences)
    assert any("ahead of a at 1 of 14 points, behind at none" in s for s in sentences)


def test_one_session_names_the_turns_not_a_crossover_in_tokens() -> None:
    """One agentic session: a turn is its content and its depth at once — "turn 9 differs", never "changes
    sign between … prompt tokens"."""
    deltas = _family({9: (2.04, 1.59, 2.63), 13: (0.5, 0.45, 0.55)})
    multiplicity.apply_holm(deltas)
    names = [d["point"] for d in deltas]
    xs = [float(200 * k) for k in range(2, 16)]
    many = [_crossover(names, xs, sessions=4)]
    judge_crossovers(many, deltas)
    assert many[0]["significant"] is True  # several sessions: the crossover in tokens stands
    one = [_crossover(names, xs, sessions=1)]
    judge_crossovers(one, deltas)
    assert one[0]["significant"] is False
    assert one[0]["statement"].startswith("turn 9 differs above parity; turn 13 differs below parity")
    sentences = verdict_sentences(deltas, one, ["a", "b"], SPECS)
    (line,) = [s for s in sentences if "agentic decode_tps" in s]
    assert "turn 9 differs" in line and "changes sign" not in line and "crosses 1" not in line


def test_the_first_screen_counts_comparisons_and_families() -> None:
    deltas = [
        *_family({}, points=4),
        *[_delta(f"{k}k", 1.0, 0.9, 1.1, metric="ttft_s", probe="prefill") for k in (2, 3)],
        _delta("turn4", 1.0, None, None),  # type: ignore[arg-type]  # no CI: no comparison
    ]
    multiplicity.apply_holm(deltas)
    lines = cost.first_screen({"deltas": deltas})
    assert "6 comparisons in 2 families; Holm within each family (family-wise α = 0.05" in "\n".join(lines)
    assert not any("comparison" in line for line in cost.first_screen({"deltas": []}))


def test_the_committed_h200_trained_run_rerenders_without_the_fp8_agentic_crossover(tmp_path: Path) -> None:
    """docs/results/h200-trained: fp8's agentic decode_tps crossover rested on turn 13 (p 0.022) and 14
    (p 0.008); after Holm over its 15 points neither is worse, so no sign change is stated."""
    from pytest_kvcache.model.options import ReportOptions
    from pytest_kvcache.report.pipeline import produce

    copy = tmp_path / "run"
    shutil.copytree(ROOT / "docs" / "results" / "h200-trained" / "run", copy)
    for name in ("report.json", "report.md", "report.html", "summary.csv", *(p.name for p in copy.glob("*.png"))):
        (copy / name).unlink(missing_ok=True)
    assert produce(copy, ReportOptions()).error is None
    report = json.loads((copy / "report.json").read_text())
    fp8 = [s for s in report["verdicts"] if s.startswith("fp8's agentic decode_tps")]
    assert fp8 and not any("changes sign" in s or "crosses 1" in s for s in fp8)
    md = (copy / "report.md").read_text()
    assert not any("fp8's agentic decode_tps" in line and "changes sign" in line for line in md.splitlines())
    (row,) = [
        c for c in report["crossovers"] if (c["arm"], c["probe"], c["metric"]) == ("fp8", "agentic", "decode_tps")
    ]
    assert row["significant"] is False
    turn13 = next(
        d
        for d in report["deltas"]
        if (d["arm"], d["probe"], d["metric"], d["point"]) == ("fp8", "agentic", "decode_tps", "turn13")
    )
    assert turn13["p_value"] < 0.05 <= turn13["p_holm"] and turn13["verdict"] == "inconclusive"
    assert "comparisons in" in md.split("\n## ", 1)[0]


def test_the_a_a_noise_band_rejudges_and_holm_runs_again() -> None:
    """With --kv-noise, apply_noise sets the within-boot verdicts anew (CI ± the A/A band): Holm runs again
    after it, on that interval, so a point beyond the band but not beyond Holm stays inconclusive."""
    from pytest_kvcache.report.judge import apply_noise

    deltas = [
        _delta(f"turn{k}", *((0.66, 0.50, 0.88) if k == 13 else (1.0, 0.8, 1.25)), ci_method="within-boot")
        for k in range(2, 16)
    ]
    report = cast(
        Any, {"deltas": deltas, "crossovers": [], "arms": [{"name": "a"}, {"name": "b"}], "agreement": {"rows": []}}
    )
    bands = {("agentic", d["point"], "decode_tps"): spread.from_aa(0.02, 8, "aa") for d in deltas}
    apply_noise(report, bands, "aa", SPECS)
    (turn13,) = [d for d in deltas if d["point"] == "turn13"]
    lo, hi = turn13["judged_ci"]
    assert stats.verdict("decode_tps", lo, hi) == "worse"  # beyond the A/A's spread …
    assert turn13["p_value"] == pytest.approx(stats.interval_p_value(0.66, lo, hi, df=8.0))
    assert turn13["verdict"] == "inconclusive"  # … not beyond Holm over 14 comparisons
    assert turn13["verdict_note"].startswith("not beyond Holm over 14 comparisons")
