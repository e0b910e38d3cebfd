"""Token counts nobody checked (issue 45, class 8), through the real CLI: the stand-in engine plays a `Fault` on
every generation request over real HTTP streaming, and each measured request's requested, streamed and
reported counts must agree — or the request fails as ``token_count`` with all three in its headline, its
record and the report's failures (docs/errors.md)."""

from __future__ import annotations

import json

import pytest
from _pytest.pytester import LineMatcher

from pytest_kvcache.run.folder import read_records
from tests.plugin.conftest import latest, processes_with


def _faulty(standin_args: list[str], tag: str, fault: dict[str, object], max_tokens: int) -> list[str]:
    """``standin_args`` with every generation request hitting ``fault`` and ``--kv-max-tokens=max_tokens``."""
    kept = [a for a in standin_args if not a.startswith(("--kv-engine-args", "--kv-max-tokens"))]
    spec = json.dumps(fault, separators=(",", ":"))
    return [*kept, f"--kv-engine-args={tag} --standin-fault='{spec}'", f"--kv-max-tokens={max_tokens}"]


def _run(pytester: pytest.Pytester, args: list[str], headline: str) -> list[dict]:
    result = pytester.runpytest_subprocess(*args, "--kv-arms=auto")
    output = result.stdout.lines + result.stderr.lines
    assert result.ret == pytest.ExitCode.TESTS_FAILED, "\n".join(output)
    LineMatcher(output).fnmatch_lines([headline])
    assert "Traceback" not in "\n".join(output)
    folder = latest(pytester)
    report = (folder / "report.md").read_text()
    assert "token_count" in report, report  # the report's failures name the kind and its first message
    return [r for r in read_records(folder / "requests.jsonl") if r["phase"] == "measured"]


def test_a_server_that_stops_at_half_the_forced_tokens_fails_the_probe(
    pytester: pytest.Pytester, standin_args: list[str], tag: str
) -> None:
    """The short probes force exactly 16 tokens (greedy: ignore_eos, min_tokens); a server that stops at 8
    and says so would have had its decode speed computed over half the tokens the shape promised."""
    args = _faulty(standin_args, tag, {"kind": "stop_early", "after_chunks": 8}, 16)
    records = _run(
        pytester,
        args,
        "*short code on auto: measured request 0 failed: token_count: requested 16 (forced), streamed 8, "
        "reported 8: the server stopped at 8 of the 16 tokens the request forces; *",
    )
    assert len(records) == 4 and all(not r["ok"] and r["error_kind"] == "token_count" for r in records)
    for r in records:
        sample = r["sample"]
        assert (sample["requested_tokens"], sample["promised_tokens"], sample["streamed_tokens"]) == (16, 16, 8)
        assert sample["completion_tokens"] == 8 and "token_count" in r["flags"]
        assert r["metrics"]["decode_tps"] is None
    assert not processes_with(tag)


def test_a_usage_claiming_48_tokens_for_a_stream_of_16_fails_the_probe(
    pytester: pytest.Pytester, standin_args: list[str], tag: str
) -> None:
    """The stream delivers (and counts) 16 tokens, the final usage claims all 48 that were forced: decode speed
    would divide 48 tokens by the time 16 took."""
    args = _faulty(standin_args, tag, {"kind": "stop_early", "after_chunks": 16, "usage_tokens": 48}, 48)
    records = _run(
        pytester,
        args,
        "*short code on auto: measured request 0 failed: token_count: requested 48 (forced), streamed 16, "
        "reported 48: the final usage reports 32 token(s) the stream never delivered; *",
    )
    assert len(records) == 4 and all(r["error_kind"] == "token_count" for r in records)
    assert {(r["sample"]["streamed_tokens"], r["sample"]["completion_tokens"]) for r in records} == {(16, 48)}
    assert not processes_with(tag)
