"""Fresh-prefill probes: TTFT and prefill speed at exact depths, each request proven cold."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from pytest_kvcache.client import Sample
from pytest_kvcache.config.settings import Settings
from pytest_kvcache.plugin import Recorder
from pytest_kvcache.probes import prefill, tokens
from pytest_kvcache.probes.agentic import prompt_sha256
from pytest_kvcache.probes.runner import Adaptive, run_repeated
from pytest_kvcache.probes.short import chat_payload
from pytest_kvcache.run.measure import ArmClient, Server

Messages = list[dict[str, Any]]


def _token_counter(
    kv_client: ArmClient, kv_server: Server, kv_settings: Settings
) -> tuple[Callable[[Messages], int], str]:
    """The server's own count where its profile has one (vLLM's ``/tokenize``; llama.cpp's
    ``/apply-template`` + ``/tokenize``); the model's tokenizer here for a generic server; calibration
    requests (their own salts) only when neither answers, and the evidence says so."""
    model = kv_server.model
    kind = kv_server.profile.tokens

    def tokenize(messages: Messages) -> int:
        try:
            return int(kv_client.post_json("/tokenize", {"model": model, "messages": messages})["count"])
        except (httpx.HTTPError, KeyError, ValueError) as exc:
            raise prefill.SizingError(f"/tokenize failed: {type(exc).__name__}: {exc}") from None

    def llamacpp(messages: Messages) -> int:
        try:
            prompt = kv_client.post_json("/apply-template", {"messages": messages})["prompt"]
            body = {"content": prompt, "add_special": True, "parse_special": True}
            return len(kv_client.post_json("/tokenize", body)["tokens"])
        except (httpx.HTTPError, KeyError, TypeError, ValueError) as exc:
            raise prefill.SizingError(f"/apply-template + /tokenize failed: {type(exc).__name__}: {exc}") from None

    if kind == "local":
        try:
            return tokens.local_counter(tokens.tokenizer_dir(kv_settings)), "local"
        except tokens.TokenizerError as exc:
            kv_server.evidence["tokenize"] = f"no local tokenizer ({exc}); prefill sized by calibration"
    else:
        counter = llamacpp if kind == "llamacpp" else tokenize
        try:
            counter(prefill.messages_for("probe"))
            return counter, "tokenize"
        except prefill.SizingError as exc:
            kv_server.evidence["tokenize"] = f"unavailable ({type(exc).__name__}: {exc}); prefill sized by calibration"

    def calibrate(messages: Messages) -> int:
        sample = kv_client.stream_chat(chat_payload(model, messages, "greedy", 1))
        if not sample.ok or sample.prompt_tokens is None:
            raise prefill.SizingError(f"calibration request failed: {sample.error_kind}: {sample.error}")
        return sample.prompt_tokens

    return calibrate, "calibrated"


@pytest.mark.prefill
@pytest.mark.depth
def test_prefill(
    kv_server: Server,
    kv_client: ArmClient,
    kv_record: Recorder,
    kv_settings: Settings,
    kv_benchmark: Any,
    kv_depth: int,
) -> None:
    max_len = kv_server.evidence.get("max_model_len")
    if max_len and kv_depth + prefill.MAX_TOKENS > max_len:
        pytest.skip(
            f"depth {kv_depth} + {prefill.MAX_TOKENS} output tokens exceeds {kv_server.name}'s max_model_len {max_len}"
        )
    block_size = int((kv_server.evidence.get("cache_config") or {}).get("block_size") or 16)
    count, method = _token_counter(kv_client, kv_server, kv_settings)
    seed = kv_settings.seed

    def send(phase: str, index: int) -> tuple[Sample, dict[str, object]]:
        salt = prefill.salt_for(seed, "prefill", kv_depth, phase, index)
        sizing_salt = (
            salt if method != "calibrated" else prefill.salt_for(seed, "prefill-calibration", kv_depth, phase, index)
        )
        sized = prefill.size_prompt(kv_depth, sizing_salt, count)
        payload = chat_payload(
            kv_server.model, sized.messages(salt), "greedy", prefill.MAX_TOKENS, **kv_server.profile.cold_fields
        )
        sample, engine = kv_client.measure(payload, prompt_tokens=sized.tokens)
        flags, excluded, proof = prefill.cold_check(
            sample.cached_tokens, engine, block_size, allow_unproven=kv_settings.allow_unproven_cold
        )
        depth_flags, depth_excluded = prefill.depth_check(sample.prompt_tokens, kv_depth)
        return sample, {
            "depth": kv_depth,
            "engine": engine,
            "flags": flags + depth_flags,
            "excluded_reason": excluded or depth_excluded,
            "cold_proof": proof,
            "prompt_sha256": prompt_sha256(payload),
            "sizing": {"method": method, "tokens": sized.tokens, "calls": sized.tokenize_calls, "salt": salt},
        }

    label = f"prefill {prefill.depth_label(kv_depth)} on {kv_server.name}"
    failure: str | None = None
    try:
        outcome = run_repeated(
            send,
            functools.partial(kv_record, probe="prefill", shape=prefill.depth_label(kv_depth)),
            label=label,
            warmups=kv_settings.depth_warmups,
            runs=kv_settings.depth_runs,
            bench=kv_benchmark,
            adaptive=Adaptive.of(kv_settings, "prefill_tps", kv_settings.depth_runs),
        )
    except prefill.SizingError as exc:
        failure = f"{label}: cannot size a {kv_depth}-token prompt ({method}): {exc}"
    if failure is not None:
        pytest.fail(failure, pytrace=False)  # outside the except block: no chained traceback
    if outcome.sampling:
        kv_record.sampling(outcome.sampling, probe="prefill", point=prefill.depth_label(kv_depth))
    if outcome.problems():
        pytest.fail(outcome.message(), pytrace=False)
