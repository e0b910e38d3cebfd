"""Speculative decoding in the report: per-request acceptance from the counter deltas, per arm, probe and
point, with CIs, deltas between arms and a gate."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from pytest_kvcache.probes import registry
from pytest_kvcache.report import comparison, gates
from pytest_kvcache.report import frame as report_frame
from pytest_kvcache.report.deciding import deciding
from pytest_kvcache.report.outputs.md_probes import spec_decode_lines
from pytest_kvcache.report.sections import spec_decode
from pytest_kvcache.run.folder import make_record
from pytest_kvcache.sample import Sample

SPECS = registry.resolve()


def turn_record(arm: str, turn: int, drafts: int, accepted: int, per_position: list[int]) -> dict[str, Any]:
    sample = Sample(ok=True, first_token_s=0.1, last_token_s=1.1, end_s=1.2, completion_tokens=100)
    sample.prompt_tokens, sample.token_clock, sample.first_chunk_tokens = 1000 * turn, "usage", 1
    engine = {"spec_drafts": drafts, "spec_draft_tokens": 3 * drafts, "spec_accepted_tokens": accepted}
    engine["spec_accepted_per_position"] = per_position
    rec = make_record(
        sample,
        run_id="r",
        arm=arm,
        boot=arm,
        replicate=1,
        probe="agentic",
        shape="replay",
        turn=turn,
        session=1,
        phase="measured",
        index=0,
        engine=engine,
    )
    return dict(rec)


def records() -> list[dict[str, Any]]:
    out = []
    for turn in (1, 2, 3):
        for session in (1, 2):
            fp8 = turn_record("fp8", turn, 40, 60 + session, [30, 20, 10 + session])
            int8 = turn_record("int8", turn, 50, 40 + session, [25, 10, 5 + session])
            fp8["session"] = int8["session"] = session
            fp8["pair"] = int8["pair"] = None
            out += [fp8, int8]
    return out


def test_a_record_carries_acceptance_as_metrics() -> None:
    rec = turn_record("fp8", 1, 40, 60, [30, 20, 10])
    assert rec["metrics"]["acceptance_length"] == pytest.approx(2.5)
    assert rec["metrics"]["acceptance_rate"] == pytest.approx(0.5)


def test_the_section_has_acceptance_per_arm_probe_and_point_with_a_ci() -> None:
    recs = records()
    section = spec_decode.spec_decode_section(recs, ["fp8", "int8"], SPECS, {"fp8": "ngram, 3 tokens", "int8": None}, 0)  # type: ignore[arg-type]
    rows = {(r["arm"], r["point"]): r for r in section["rows"]}
    assert set(rows) == {(a, f"turn{t}") for a in ("fp8", "int8") for t in (1, 2, 3)}
    row = rows[("fp8", "turn2")]
    assert (row["requests"], row["drafts"], row["drafted"], row["accepted"]) == (2, 80, 240, 123)
    assert row["acceptance_length"] == pytest.approx(1 + 123 / 80)
    assert row["acceptance_pct"] == pytest.approx(100 * 123 / 240)
    assert row["per_position"] == pytest.approx([60 / 80, 40 / 80, 23 / 80])
    # two sessions: two prompts at each turn, too few for a CI (acceptance replicates over prompts, not requests)
    assert (row["prompts"], row["ci_low"], row["ci_high"], row["ci_df"]) == (2, None, None, None)
    assert row["ci_basis"] == "over prompts" and row["no_ci"].startswith("fewer than 3 prompts (2)")
    assert row["acceptance_length_mean"] == pytest.approx((1 + 61 / 40 + 1 + 62 / 40) / 2)
    assert section["config"] == {"fp8": "ngram, 3 tokens", "int8": None}
    assert section["line"].startswith("fp8 agentic: mean acceptance length 2.54 (369/720 draft tokens accepted")
    assert section["line"].endswith("— speculation: fp8 ngram, 3 tokens; int8 not stated")
    md = "\n".join(spec_decode_lines({"spec_decode": section}))  # type: ignore[typeddict-item]
    assert "## Speculative decoding" in md and "- fp8: ngram, 3 tokens" in md
    assert "| fp8 | agentic | turn2 | 2 | 80 | 123 / 240 (51.2%) | 2.54 |" in md


def test_acceptance_deltas_and_gates_are_undecided_over_fewer_than_3_prompts() -> None:
    """Two sessions: two prompts at each turn. Acceptance is deterministic across boots and repeats, so a within-boot
    CI over requests would be zero-width: no CI, no verdict, and gates stay inconclusive, saying why (issue 41)."""
    data = report_frame.frame(records(), SPECS)  # type: ignore[arg-type]
    deltas = [d for d in comparison.delta_rows(data, ["fp8", "int8"], SPECS, 0) if d["metric"] == "acceptance_length"]
    assert [d["point"] for d in deltas] == ["turn1", "turn2", "turn3"]
    assert all(d["ci_method"] == "prompts" and d["prompts"] == 2 and d["ci_low"] is None for d in deltas)
    assert all(d["direction"] == "higher" and d["verdict"] == "inconclusive" for d in deltas)
    gate = gates.parse("acceptance_length[agentic]: int8 >= fp8 * 0.95", arms=["fp8", "int8"], specs=SPECS)
    results = gates.evaluate([gate], data, ["fp8", "int8"], seed=0)
    assert [r["outcome"] for r in results] == ["inconclusive"] * 3
    assert {r["evidence"]["kind"] for r in results} == {"prompts"} and "boots_to_decide" not in results[0]
    assert results[0]["reason"].startswith("fewer than 3 prompts (2): acceptance_length is deterministic")
    absolute = gates.parse("acceptance_length[agentic]: int8 >= 1.5", arms=["fp8", "int8"], specs=SPECS)
    (first, *_) = gates.evaluate([absolute], data, ["fp8", "int8"], seed=0)
    assert first["outcome"] == "inconclusive" and first["evidence"]["kind"] == "prompts"


def test_acceptance_deltas_and_gates_are_decided_over_3_prompts() -> None:
    """Three sessions: the paired log ratios over the prompts give a t-interval on 2 df; int8 accepts fewer drafts
    in every session (1.8x vs 2.5x), so it is worse, and a gate at 0.95 fails — on one boot, since another boot
    would repeat the same figures."""
    out = []
    for session in (1, 2, 3):
        for arm, accepted in (("fp8", 60 + session), ("int8", 40 + 2 * session)):
            rec = turn_record(arm, 2, 50 if arm == "int8" else 40, accepted, [30, 20, 10])
            rec["session"], rec["pair"] = session, None
            out.append(rec)
    data = report_frame.frame(out, SPECS)  # type: ignore[arg-type]
    (delta,) = [d for d in comparison.delta_rows(data, ["fp8", "int8"], SPECS, 0) if d["metric"] == "acceptance_length"]
    logs = [np.log((1 + (40 + 2 * s) / 50) / (1 + (60 + s) / 40)) for s in (1, 2, 3)]
    half = 4.302652729911275 * np.std(logs, ddof=1) / np.sqrt(3)
    assert (delta["ci_method"], delta["prompts"], delta["ci_df"]) == ("prompts", 3, 2)
    assert delta["ci_low"] == pytest.approx(np.exp(np.mean(logs) - half), rel=1e-9)
    assert delta["ci_high"] == pytest.approx(np.exp(np.mean(logs) + half), rel=1e-9)
    assert delta["verdict"] == "worse" and deciding(delta)[2] == "prompts"
    gate = gates.parse("acceptance_length[agentic]: int8 >= fp8 * 0.95", arms=["fp8", "int8"], specs=SPECS)
    (result,) = gates.evaluate([gate], data, ["fp8", "int8"], seed=0)
    assert result["outcome"] == "fail" and result["evidence"]["kind"] == "prompts"
    assert result["reason"] == "CI over 3 prompts (t-interval)"


def test_the_acceptance_ci_is_over_prompts_and_boots_of_a_prompt_do_not_narrow_it() -> None:
    from scipy import stats as scipy_stats

    recs = []
    for boot in ("fp8.r1", "fp8.r2", "fp8.r3"):  # the same three prompts (sessions) on three boots: identical
        for session, accepted in ((1, 50), (2, 70), (3, 65)):
            rec = turn_record("fp8", 2, 40, accepted, [30, 20, 10])
            rec["session"], rec["boot"] = session, boot
            recs.append(rec)
    (row,) = spec_decode.spec_decode_section(recs, ["fp8"], SPECS, {}, 0)["rows"]  # type: ignore[arg-type]
    per_prompt = [1 + a / 40 for a in (50, 70, 65)]
    want = scipy_stats.t.interval(0.95, 2, loc=np.mean(per_prompt), scale=scipy_stats.sem(per_prompt))
    assert (row["requests"], row["prompts"], row["ci_df"], row["no_ci"]) == (9, 3, 2, None)
    assert row["acceptance_length_mean"] == pytest.approx(np.mean(per_prompt))
    assert (row["ci_low"], row["ci_high"]) == pytest.approx(want, rel=1e-12)
    # a short shape is one prompt, however many requests and boots: no CI
    short = turn_record("fp8", 1, 40, 60, [30, 20, 10])
    short.update(probe="short", shape="code", turn=None, session=None)
    (row,) = spec_decode.spec_decode_section([short, dict(short, boot="fp8.r2")], ["fp8"], SPECS, {}, 0)["rows"]  # type: ignore[arg-type]
    assert (row["prompts"], row["ci_low"]) == (1, None) and "fewer than 3 prompts (1)" in row["no_ci"]
