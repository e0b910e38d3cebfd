"""The report's greedy-text comparison and its "left out by design" section; llama-server's forced scoring."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_kvcache.engines import scoring
from pytest_kvcache.engines.kinds.llamacpp import forced_payload, parse_forced
from pytest_kvcache.report import greedy, left_out


def agreement(arm: str, rep: int, shape: str, ids: list[int], text: str, index: int = 0) -> dict[str, object]:
    return {
        "arm": arm,
        "boot": f"{arm}.r{rep}",
        "replicate": rep,
        "shape": shape,
        "index": index,
        "ok": True,
        "ids": ids,
        "logprobs": [0.0] * len(ids),
        "text": text,
    }


def test_greedy_texts_show_where_two_arms_part() -> None:
    rows = [
        agreement("f16", 1, "code", [1, 2, 3, 4], "def f(n):\n    elif n <= 1: return n"),
        agreement("q4_0", 1, "code", [1, 2, 9, 9], "def f(n):\n    elif n == 1: return 1"),
        agreement("f16", 1, "narrative", [5, 6], "Attention is"),
        agreement("q4_0", 1, "narrative", [5, 6], "Attention is"),
        agreement("q4_0", 1, "code", [7], "ignored: a second request of the boot", index=1),
    ]
    found = {e["shape"]: e for e in greedy.section(rows, ["f16", "q4_0"])}
    code = found["code"]
    assert (code["first_divergence"], code["tokens"], code["shared_chars"]) == (2, 4, 21)
    assert code["baseline_boot"] == "f16.r1" and code["boot"] == "q4_0.r1"
    assert found["narrative"]["first_divergence"] is None
    text = "\n".join(greedy.lines(list(found.values())))
    assert "greedy code, q4_0 vs f16: diverge at token 2 of 4 (character 21)" in text
    assert "  f16      →<= 1: return n…" in text and "  q4_0     →== 1: return 1…" in text
    assert "greedy narrative, q4_0 vs f16: identical (2 tokens): Attention is…" in text
    assert greedy.markdown(list(found.values()))[0] == "## Greedy texts (output agreement)"
    assert greedy.section(rows, ["f16"]) == []


def test_left_out_section_names_turns_and_the_fixture(tmp_path: Path) -> None:
    entries = [
        {"boot": "f16", "arm": "f16", "probe": "agentic", "session": 1, "turn": t, "reason": "too long"}
        for t in (10, 11, 12, 13, 14, 15)
    ]
    (tmp_path / "left_out.jsonl").write_text("".join(json.dumps(e) + "\n" for e in entries))
    records = [
        {"probe": "agentic", "fixture_sha256": "a" * 64, "fixture_scale": 0.125, "fixture_stock_sha256": "b" * 64}
    ]
    settings = {"context_tokens": 8192, "context_source": "x", "context_notes": ["prefill@90k: left out, …"]}
    found = left_out.section(tmp_path, settings, records)
    assert found["rows"] == [
        {
            "boot": "f16",
            "arm": "f16",
            "probe": "agentic",
            "session": 1,
            "points": "turns 10–15",
            "count": 6,
            "reason": "too long",
        }
    ]
    lines = left_out.lines(found)
    assert "left out (cannot fit the context): agentic s1 on f16: turns 10–15 — too long" in lines
    assert any(line.startswith("agentic fixture: session-v1 with tool results scaled ×0.125") for line in lines)
    md = "\n".join(left_out.markdown(found))
    assert "## Left out by design (cannot fit the context)" in md and "Context: 8,192 tokens (x)." in md
    assert left_out.markdown(left_out.section(tmp_path / "none", {}, [])) == []


def test_forced_scoring_payload_parse_and_windows() -> None:
    ids = list(range(100, 140))
    body = forced_payload(ids, 10, top_k=3)
    assert body["prompt"] == ids[:10] and body["logit_bias"] == [[110, 1e4]] and body["n_probs"] == 3
    assert body["cache_prompt"] is True and body["n_predict"] == 1
    answer = {"completion_probabilities": [{"id": 110, "logprob": -1.5, "top_logprobs": [{"id": 7, "logprob": -0.2}]}]}
    assert parse_forced(answer, 110, 3) == (-1.5, [(7, -0.2)])
    with pytest.raises(ValueError, match="logit_bias was ignored"):
        parse_forced(answer, 111, 3)
    with pytest.raises(ValueError, match="no completion_probabilities"):
        parse_forced({}, 110, 3)
    asked: list[int] = []

    def score(position: int) -> tuple[float, list[tuple[int, float]]]:
        asked.append(position)
        return -float(position) / 100, [(1, -0.1)]

    kept, short = scoring.windows(ids, [20, 30, 64], 16, 1, score)
    assert short == [64] and [w.depth for w in kept] == [20, 30]
    assert kept[0].start == 4 and kept[0].ids == tuple(ids[4:20]) and kept[0].logprob[0] == -0.04
    assert asked == sorted(set(asked)) and asked[0] == 4 and asked[-1] == 29  # each position once, in order
    assert kept[1].top_ids[0] == (1,)
