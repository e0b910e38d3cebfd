"""A generic OpenAI server (``--kv-engine=openai``) on the stand-in in its strict generic mode: it answers
HTTP 400 to any vLLM-only request field and has no /tokenize, /metrics or /version; its usage counts prompt
tokens with the embedded model's real tokenizer and chat template, as a server of that model would."""

from __future__ import annotations

import json

import pytest

from pytest_kvcache.datafiles import embedded_model_path
from pytest_kvcache.engines.kinds.base import VLLM_ONLY_FIELDS, VLLM_ONLY_STREAM_OPTIONS
from pytest_kvcache.engines.kinds.openai import OPENAI
from pytest_kvcache.run.folder import read_records

pytest.importorskip("transformers", reason="the local tokenizer needs transformers")


def test_generic_server_gets_no_vllm_field_and_prefill_is_sized_locally(
    pytester: pytest.Pytester, standin_args: list[str], tag: str
) -> None:
    result = pytester.runpytest_subprocess(
        "--kv-engine=openai",
        "--kv-arms=auto",
        *standin_args,
        f"--kv-engine-args={tag} --standin-generic --standin-tokenizer {embedded_model_path()}",
        "-m",
        "short or prefill",
        "--kv-depths=500,2k",
        "--kv-depth-runs=2",
    )
    result.assert_outcomes(passed=4)  # two short shapes, two depths: a vLLM-only field would be an HTTP 400
    run = pytester.path / ".kvcache" / "runs" / "latest"
    records = read_records(run / "requests.jsonl")
    assert records and all(r["sample"]["ok"] for r in records)
    prefill = [r for r in records if r["probe"] == "prefill"]
    assert len(prefill) == 2 * (1 + 2)
    for r in prefill:
        assert r["sizing"]["method"] == "local"  # the model's tokenizer here: no calibration request
        assert 0.99 * r["depth"] <= r["sample"]["prompt_tokens"] <= r["depth"]  # exact, by the server's count
        assert r["cold_proof"] == "usage" and not r.get("excluded_reason")
    evidence = json.loads((run / "arms" / "auto" / "evidence.json").read_text())
    assert evidence["engine_kind"] == "openai"
    assert evidence["evidence_missing"] == OPENAI.missing_evidence()
    assert "/metrics" not in (evidence.get("errors") or {})  # not asked: a generic server has none
    report = json.loads((run / "report.json").read_text())
    assert any(n.startswith("evidence missing for auto (openai server): /metrics") for n in report["notes"])
    assert "evidence missing for auto (openai server)" in (run / "report.md").read_text()


def test_strict_generic_standin_refuses_vllm_fields(pytester: pytest.Pytester, standin_args: list[str]) -> None:
    """The check above can fail: the same run profiled as vLLM sends its own fields and every request fails."""
    result = pytester.runpytest_subprocess(
        "--kv-arms=auto", *standin_args, "--kv-engine-args=--standin-generic", "--kv-no-agreement"
    )
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*unsupported request field(s): *continuous_usage_stats*"])
    assert {"ignore_eos", "min_tokens"} <= VLLM_ONLY_FIELDS and "continuous_usage_stats" in VLLM_ONLY_STREAM_OPTIONS
