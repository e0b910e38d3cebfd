from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from pytest_kvcache.probes import agentic, prefill
from pytest_kvcache.probes.registry import depth_label


def toy_count(messages: list[dict]) -> int:
    """~1 token per 4 characters of each word, plus a fixed chat-template overhead."""
    return 11 + sum(max(1, (len(w) + 3) // 4) for m in messages for w in re.findall(r"\S+", m["content"]))


@pytest.mark.parametrize("target", [500, 2000, 10_000, 90_000])
def test_size_prompt_lands_within_one_percent_below_target(target: int) -> None:
    sized = prefill.size_prompt(target, prefill.salt_for(0, "prefill", target, "measured", 0), toy_count)
    assert target * 0.99 <= sized.tokens <= target
    assert toy_count(sized.messages(prefill.salt_for(0, "prefill", target, "measured", 0))) == sized.tokens
    assert sized.tokenize_calls < 30


def test_salts_pair_across_arms_and_differ_within_one() -> None:
    assert prefill.salt_for(7, "prefill", 2000, "measured", 1) == prefill.salt_for(7, "prefill", 2000, "measured", 1)
    salts = {
        prefill.salt_for(7, "prefill", d, p, i) for d in (2000, 8000) for p in ("warmup", "measured") for i in range(3)
    }
    assert len(salts) == 12 and all(re.fullmatch(r"[a-z]{8}", s) for s in salts)
    assert prefill.salt_for(8, "prefill", 2000, "measured", 1) != prefill.salt_for(7, "prefill", 2000, "measured", 1)


def test_salt_is_woven_through_the_whole_haystack() -> None:
    text = prefill.haystack("abcdefgh", 50, 3)
    lines = text.splitlines()
    assert lines[0].startswith("Session abcdefgh.")
    assert all("abcdefgh" in line for line in lines if line.strip())


def test_depth_labels() -> None:
    assert [depth_label(d) for d in (2000, 90_000, 12_500)] == ["2k", "90k", "12500"]


def test_cold_check() -> None:
    assert prefill.cold_check(None, {"prefix_cache_hits": 0}, 16) == ([], None, "metrics")
    assert prefill.cold_check(0, {"prefix_cache_hits": 16}, 16) == ([], None, "metrics")  # one block allowed
    flags, excluded, proof = prefill.cold_check(0, {"prefix_cache_hits": 32}, 16)
    assert flags == ["not_cold"] and "32 prefix-cache hit tokens > one block (16)" in excluded and proof == "metrics"
    assert prefill.cold_check(200, None, 128)[0] == ["not_cold"]
    flags, excluded, proof = prefill.cold_check(None, None, 16)  # nothing proves it cold: left out
    assert (flags, proof) == (["cold_unproven"], "none") and excluded and "--kv-allow-unproven-cold" in excluded
    assert prefill.cold_check(None, None, 16, allow_unproven=True) == (["cold_unproven"], None, "none")


def test_depth_check() -> None:
    assert prefill.depth_check(1990, 2000) == ([], None)
    flags, reason = prefill.depth_check(2100, 2000)
    assert flags == ["depth_off"] and "+5.00%" in reason


def test_a_depth_without_reported_prompt_tokens_is_unverified_and_a_counted_prompt_is_compared() -> None:
    assert prefill.unverified_depth(2000, 2000) is None
    reason = prefill.unverified_depth(None, 2000)
    assert reason is not None and reason.startswith("requested a 2000-token prompt, reported none")
    assert prefill.prompt_count_flags(1995, 1995) == [] and prefill.prompt_count_flags(None, 1995) == []
    assert prefill.prompt_count_flags(1995, 1998) == ["prompt_count_mismatch"]


# ----------------------------------------------------------------------------------------- agentic


def test_the_shipped_fixture_loads_and_matches_its_hash() -> None:
    session = agentic.load()
    assert len(session.turns) >= 15 and len(session.tools) >= 10
    sizes = [len(t.result) for t in session.turns]
    assert min(sizes) >= 200 and max(sizes) <= 32_000 and 150_000 <= sum(sizes) <= 200_000
    assert {t.user.split(" ")[0] for t in session.turns} <= {"Run:", "Read"}


def test_a_changed_fixture_is_refused(tmp_path: Path) -> None:
    src = agentic.default_fixture()
    copy = tmp_path / src.name
    shutil.copy(src, copy)
    shutil.copy(src.with_name(src.name + ".sha256"), tmp_path)
    copy.write_bytes(copy.read_bytes().replace(b"coding assistant", b"coding assistent", 1))
    with pytest.raises(agentic.FixtureError, match=r"differs from the recorded .* a changed fixture must be a new"):
        agentic.load(copy)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, r"missing.json: cannot read the agentic fixture"),
        ("{not json", r"not valid JSON"),
        ('{"system_prompt": "s", "tools": []}', r"field 'turns' is missing or not a list"),
        ('{"system_prompt": "s", "tools": [], "turns": [{"user": "u"}]}', r"turns\[1\] has no field 'tool'"),
        ('{"system_prompt": "s", "tools": [], "turns": []}', r"field 'turns' is empty"),
    ],
)
def test_malformed_fixtures_name_file_and_field(tmp_path: Path, content: str | None, message: str) -> None:
    path = tmp_path / ("missing.json" if content is None else "bad.json")
    if content is not None:
        path.write_text(content)
    with pytest.raises(agentic.FixtureError, match=message):
        agentic.load(path)


def test_replay_conversation_grows_and_is_deterministic() -> None:
    session = agentic.load()
    a = agentic.Conversation.start(session, 1, seed=0)
    b = agentic.Conversation.start(session, 1, seed=0)
    other = agentic.Conversation.start(session, 2, seed=0)
    for turn in (1, 2):
        for conv in (a, b, other):
            conv.ask(turn)
        pa, pb = a.payload("m", "replay", 600), b.payload("m", "replay", 600)
        assert agentic.prompt_sha256(pa) == agentic.prompt_sha256(pb)
        assert agentic.prompt_sha256(pa) != agentic.prompt_sha256(other.payload("m", "replay", 600))
        for conv in (a, b, other):
            conv.answer(turn)
    roles = [m["role"] for m in a.messages]
    assert roles == ["system", "user", "assistant", "tool", "user", "assistant", "tool"]
    assert a.messages[0]["content"].startswith(f"Session {a.salt}. ")
    assert a.messages[3]["content"] == session.turns[0].result
    assert a.messages[2]["tool_calls"][0]["function"]["name"] == session.turns[0].tool
    body = a.payload("m", "replay", 600)
    assert body["temperature"] == 0.0 and body["ignore_eos"] and body["tool_choice"] == "none"
    assert a.payload("m", "live", 600)["tool_choice"] == "required"


def test_live_answer_uses_the_models_calls_or_counts_a_miss() -> None:
    session = agentic.load()
    conv = agentic.Conversation.start(session, 1, seed=0)
    conv.ask(1)
    assert conv.answer(1, [{"name": "LS", "arguments": '{"path": "."}'}], "") is False
    assert conv.messages[-2]["tool_calls"][0]["function"]["arguments"] == '{"path": "."}'
    conv.ask(2)
    assert conv.answer(2, [], "no call") is True
    assert conv.messages[-2]["content"] == "no call"
    assert json.loads(conv.messages[-2]["tool_calls"][0]["function"]["arguments"]) == session.turns[1].arguments


@pytest.mark.parametrize(
    ("ttft", "verdict"),
    [
        ({1: 2.0, 2: 1.0, 3: 1.1, 4: 1.4}, "stable"),
        ({1: 2.0, 2: 1.0, 3: 2.0, 4: 3.0}, "sub-linear"),  # context grows 10×, TTFT 3×
        ({1: 2.0, 2: 1.0, 3: 5.0, 4: 9.0}, "near-linear"),
        ({1: 2.0, 2: 1.0, 3: 5.0, 4: 12.5}, "near-linear"),  # 1.25 × the context growth: the edge
        ({1: 2.0, 2: 1.0, 3: 20.0, 4: 80.0}, "super-linear"),  # TTFT 80× while context grows 10×
        ({1: 2.0, 2: 1.0, 3: 5.0, 4: 6.0}, "growing"),
    ],
)
def test_growth_verdict_uses_the_seeds_words(ttft: dict[int, float], verdict: str) -> None:
    tokens = {1: 900.0, 2: 1000.0, 3: 5000.0, 4: 10_000.0}
    result = agentic.growth_verdict(ttft, tokens)
    assert result["verdict"] == verdict
    assert result["context_growth"] == pytest.approx(10.0)


def test_growth_flags_and_too_few_turns() -> None:
    result = agentic.growth_verdict({1: 3.0, 2: 1.0, 3: 1.5, 4: 2.5, 5: 5.0}, {t: 1000.0 * t for t in range(1, 6)})
    assert result["flags"] == {
        3: "TTFT 1.5× warm baseline (> 1.4×)",
        4: "TTFT 2.5× warm baseline (> 2×)",
        5: "TTFT 5.0× warm baseline (> 4×)",
    }
    assert agentic.growth_verdict({1: 1.0, 2: 1.0}, {1: 1.0, 2: 2.0})["verdict"] == "too few turns"


def test_fixture_generator_reproduces_the_committed_fixture() -> None:
    """Regenerating must not silently change the fixture (it reads files at a pinned commit)."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    if not (root / ".git").exists():
        pytest.skip("not a git checkout")
    probe = subprocess.run(["git", "cat-file", "-e", "5e1d4f3^{commit}"], cwd=root, capture_output=True)
    if probe.returncode != 0:
        pytest.skip("the fixture's source commit is not in this clone")
    result = subprocess.run(
        [sys.executable, "fixtures/make_agentic_session.py", "--check"], cwd=root, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr
