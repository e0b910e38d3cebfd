"""Speculative decoding in the report: per-request acceptance from the counter deltas, per arm, probe and
point, with CIs, deltas between arms and a gate."""

from __future__ import annotations

from typing import Any

import pytest

from pytest_kvcache.client import Sample
from pytest_kvcache.probes import registry
from pytest_kvcache.report import build, gates
from pytest_kvcache.report import frame as report_frame
from pytest_kvcache.report.outputs.markdown import spec_decode_lines
from pytest_kvcache.run.folder import make_record

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
    section = build.spec_decode_section(recs, ["fp8", "int8"], SPECS, {"fp8": "ngram, 3 tokens", "int8": None}, 0)  # type: ignore[arg-type]
    rows = {(r["arm"], r["point"]): r for r in section["rows"]}
    assert set(rows) == {(a, f"turn{t}") for a in ("fp8", "int8") for t in (1, 2, 3)}
    row = rows[("fp8", "turn2")]
    assert (row["requests"], row["drafts"], row["drafted"], row["accepted"]) == (2, 80, 240, 123)
    assert row["acceptance_length"] == pytest.approx(1 + 123 / 80)
    assert row["acceptance_pct"] == pytest.approx(100 * 123 / 240)
    assert row["per_position"] == pytest.approx([60 / 80, 40 / 80, 23 / 80])
    assert row["ci_low"] is not None and row["ci_low"] <= row["acceptance_length_mean"] <= row["ci_high"]
    assert section["config"] == {"fp8": "ngram, 3 tokens", "int8": None}
    assert section["line"].startswith("fp8 agentic: mean acceptance length 2.54 (369/720 draft tokens accepted")
    assert section["line"].endswith("— speculation: fp8 ngram, 3 tokens; int8 not stated")
    md = "\n".join(spec_decode_lines({"spec_decode": section}))  # type: ignore[typeddict-item]
    assert "## Speculative decoding" in md and "- fp8: ngram, 3 tokens" in md
    assert "| fp8 | agentic | turn2 | 2 | 80 | 123 / 240 (51.2%) | 2.54 |" in md


def test_acceptance_gets_deltas_and_gates_higher_is_better() -> None:
    data = report_frame.frame(records(), SPECS)  # type: ignore[arg-type]
    deltas = [d for d in build.delta_rows(data, ["fp8", "int8"], SPECS, 0) if d["metric"] == "acceptance_length"]
    assert [d["point"] for d in deltas] == ["turn1", "turn2", "turn3"]
    assert all(d["direction"] == "higher" and d["verdict"] == "worse" for d in deltas)
    gate = gates.parse("acceptance_length[agentic]: int8 >= fp8 * 0.95", arms=["fp8", "int8"], specs=SPECS)
    results = gates.evaluate([gate], data, ["fp8", "int8"], seed=0)
    # one boot each: acceptance did not move between boots in any committed run (band 0), so the
    # within-boot CI decides
    assert [r["outcome"] for r in results] == ["fail"] * 3
    assert {r["evidence"]["family"] for r in results} == {"acceptance"}
