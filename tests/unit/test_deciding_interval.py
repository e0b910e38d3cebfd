"""The report prints the interval that decided (issue 41): a within-boot delta judged on its CI widened by a
boot-to-boot band shows that widened interval, and its within-boot CI labelled; a delta over boots shows its
own; report.json stores both (``decided_ci``, ``ci_basis``); sentences say which interval they mean."""

from __future__ import annotations

import json
from typing import Any, cast

from pytest_kvcache.model.report import DeltaRow, GateResult, Report
from pytest_kvcache.report import deciding
from pytest_kvcache.report.build import build
from pytest_kvcache.report.outputs import jsonfile, markdown
from pytest_kvcache.report.outputs.formats import fmt_delta
from pytest_kvcache.report.outputs.md_verdict import gate_table
from pytest_kvcache.report.outputs.terminal import gates_terminal
from pytest_kvcache.report.verdicts import _standing, judge_crossovers
from tests.unit.test_report_sections import two_arm_run


def within_boot(**extra: Any) -> DeltaRow:
    """An A/A-like within-boot delta: +28.5% [+24.0, +32.7] within boots, judged on [+2.0, +61.9]."""
    row = {
        "arm": "b",
        "baseline": "a",
        "probe": "short",
        "point": "code",
        "metric": "decode_tps",
        "ratio": 1.285,
        "delta_pct": 28.5,
        "ci_low": 1.240,
        "ci_high": 1.327,
        "ci_method": "within-boot",
        "boots_baseline": 1,
        "boots_arm": 1,
        "verdict": "better",
        "band_pct": 12.3,
        "judged_ci": [1.020, 1.619],
        "spread": {
            "kind": "default band",
            "sd_pct": 12.3,
            "df": None,
            "text": "the default GPU decode rate band (boot-to-boot SD 12.3%)",
        },
        "provisional": "1 boot per arm: within-boot CI widened by the default GPU decode rate band",
    }
    return cast(DeltaRow, {**row, **extra})


def over_boots(**extra: Any) -> DeltaRow:
    row = {
        "arm": "b",
        "baseline": "a",
        "probe": "short",
        "point": "code",
        "metric": "decode_tps",
        "ratio": 1.05,
        "delta_pct": 5.0,
        "ci_low": 1.02,
        "ci_high": 1.08,
        "ci_method": "boots",
        "boots_baseline": 3,
        "boots_arm": 3,
        "verdict": "better",
    }
    return cast(DeltaRow, {**row, **extra})


def test_a_widened_delta_prints_the_judged_interval_and_a_labelled_within_boot_one() -> None:
    text = fmt_delta(within_boot())
    assert text.startswith("+28.5% [+2.0, +61.9] better")
    assert text.endswith("; within-boot [+24.0, +32.7]")
    assert "[+24.0, +32.7] better" not in text  # the within-boot CI never stands next to the verdict


def test_an_inconclusive_widened_delta_shows_the_interval_that_contains_zero() -> None:
    row = within_boot(
        ratio=1.05,
        delta_pct=5.0,
        ci_low=1.02,
        ci_high=1.08,
        judged_ci=[0.90, 1.22],
        verdict="inconclusive",
        verdict_note="within the default GPU boot-to-boot band (SD 12.3%)",
    )
    assert fmt_delta(row) == (
        "+5.0% [-10.0, +22.0] (within the default GPU boot-to-boot band (SD 12.3%)); within-boot [+2.0, +8.0]"
    )


def test_a_boots_delta_prints_its_own_ci_unlabelled() -> None:
    assert fmt_delta(over_boots()) == "+5.0% [+2.0, +8.0] better"


def test_a_within_boot_delta_widened_by_the_noise_run_prints_its_widened_interval() -> None:
    noise = {"kind": "noise run", "sd_pct": 3.0, "df": 4.0, "text": "the A/A noise run aa (SD 3.0%, 4 df; --kv-noise)"}
    row = within_boot(
        ci_low=1.02,
        ci_high=1.08,
        delta_pct=5.0,
        ratio=1.05,
        judged_ci=[0.92, 1.18],
        spread=noise,
        verdict="inconclusive",
    )
    row.pop("provisional")  # type: ignore[misc]
    lo, hi, basis = deciding.deciding(row)
    assert (lo, hi) == (0.92, 1.18)
    assert basis == "within-boot widened by the A/A noise run aa (SD 3.0%, 4 df; --kv-noise)"
    assert fmt_delta(row) == "+5.0% [-8.0, +18.0] (inconclusive); within-boot [+2.0, +8.0]"
    assert deciding.which([row]) == "its within-boot CI widened by the A/A noise run's spread"


def test_report_json_stores_the_deciding_interval_and_its_basis() -> None:
    report = cast(Report, {"deltas": [within_boot(), over_boots(), over_boots(ci_low=None, ci_high=None)]})
    rows = json.loads(jsonfile.render(report))["deltas"]
    assert rows[0]["decided_ci"] == [1.020, 1.619]
    assert rows[0]["ci_basis"] == "within-boot widened by the default GPU decode rate band (boot-to-boot SD 12.3%)"
    assert [rows[0]["ci_low"], rows[0]["ci_high"]] == [1.240, 1.327]  # kept as they were
    assert rows[1]["decided_ci"] == [1.02, 1.08] and rows[1]["ci_basis"] == "boots"
    assert rows[2]["decided_ci"] is None
    assert "decided_ci" not in report["deltas"][0]  # the writer does not touch the report


def test_sentences_name_the_interval_they_mean() -> None:
    quiet = within_boot(verdict="inconclusive")
    assert _standing([quiet, quiet], "auto") == (
        "no point differs from auto beyond its within-boot CI widened by the default boot-to-boot band"
    )
    quiet_boots = [over_boots(verdict="inconclusive")]
    assert _standing(quiet_boots, "auto") == "no point differs from auto beyond its CI over boots"
    assert _standing([over_boots(verdict="worse"), over_boots(verdict="inconclusive")], "auto") == (
        "behind auto at 1 of 2 points, ahead at none (each point judged on its CI over boots)"
    )
    mixed = deciding.which([over_boots(), within_boot()])
    assert mixed.startswith("its deciding CI (") and "over boots" in mixed and "default boot-to-boot band" in mixed


def test_a_crossover_says_on_which_interval_its_points_exclude_parity() -> None:
    rows = [
        within_boot(point="1k", ratio=1.3, verdict="better"),
        within_boot(point="2k", ratio=1.0, verdict="inconclusive"),
        within_boot(point="4k", ratio=0.7, verdict="worse"),
    ]
    crossing: dict[str, Any] = {
        "arm": "b",
        "probe": "short",
        "metric": "decode_tps",
        "axis": "depth",
        "xs": [1000.0, 2000.0, 4000.0],
        "point_names": ["1k", "2k", "4k"],
        "estimate": 2000.0,
        "share": 0.5,
    }
    judge_crossovers([cast(Any, crossing)], rows)
    assert crossing["evidence"].startswith(
        "a point on each side excludes parity on its within-boot CI widened by the default boot-to-boot band:"
    )


def test_gates_print_their_deciding_ci_beside_its_basis() -> None:
    gate = cast(
        GateResult,
        {
            "name": "decode_tps@code (b/a)",
            "gate": "decode_tps ratio >= 0.95",
            "outcome": "pass",
            "value": 1.285,
            "ci_low": 1.02,
            "ci_high": 1.619,
            "threshold": 0.95,
            "op": ">=",
            "reason": "",
            "value_text": "1.285",
            "ci_text": "[1.020, 1.619]",
            "threshold_text": ">= 0.95",
            "evidence": {"kind": "default band", "text": "within-boot CI (1 boot per arm) widened by the band"},
        },
    )
    line = gates_terminal(cast(Report, {"gates": [gate]}))[0].text
    assert "deciding CI [1.020, 1.619]" in line and "widened by the band" in line
    table = gate_table([gate])
    assert "Deciding 95% CI" in table[0] and "[1.020, 1.619]" in table[2]


def test_a_built_one_boot_report_prints_the_widened_interval() -> None:
    report = build(two_arm_run())
    delta = report["deltas"][0]
    assert delta["ci_method"] == "within-boot" and delta.get("judged_ci")
    lo, hi = delta["judged_ci"]
    text = markdown.markdown(report)
    assert f"[{(lo - 1) * 100:+.1f}, {(hi - 1) * 100:+.1f}]" in text
    own_lo, own_hi = delta["ci_low"], delta["ci_high"]
    assert own_lo is not None and own_hi is not None
    assert f"within-boot [{(own_lo - 1) * 100:+.1f}, {(own_hi - 1) * 100:+.1f}]" in text
    stored = json.loads(jsonfile.render(report))["deltas"][0]
    assert stored["decided_ci"] == [lo, hi] and stored["ci_basis"].startswith("within-boot widened by")
