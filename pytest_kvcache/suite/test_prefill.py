"""Fresh-prefill probes: TTFT and prefill speed at exact depths, each request proven cold."""

from __future__ import annotations

import functools
from typing import Any

import pytest

from pytest_kvcache.config.settings import Settings
from pytest_kvcache.plugin import Recorder
from pytest_kvcache.probes import counting, prefill
from pytest_kvcache.probes.agentic import prompt_sha256
from pytest_kvcache.probes.registry import depth_label
from pytest_kvcache.probes.runner import Adaptive, run_repeated
from pytest_kvcache.probes.short import chat_payload
from pytest_kvcache.run.measure import ArmClient, Server
from pytest_kvcache.sample import Sample


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
    too_deep = counting.overflow(kv_depth, prefill.MAX_TOKENS, kv_server)
    if too_deep:  # a default depth (an explicit one failed the boot): left out by design, and said so
        kv_record.left_out(probe="prefill", point=depth_label(kv_depth), reason=too_deep)
        pytest.skip(f"prefill {depth_label(kv_depth)} left out: {too_deep}")
    block_size = int((kv_server.evidence.get("cache_config") or {}).get("block_size") or 16)
    count_body, method = counting.token_counter(kv_client, kv_server, kv_settings)

    def count(messages: list[dict[str, Any]]) -> int:
        return count_body({"messages": messages})

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
        if sample.ok and (unverified := prefill.unverified_depth(sample.prompt_tokens, kv_depth)):
            sample.fail("token_count", unverified)
        counted = sized.tokens if method != "calibrated" else None  # calibrated: sized with another salt
        return sample, {
            "depth": kv_depth,
            "engine": engine,
            "flags": flags + depth_flags + prefill.prompt_count_flags(counted, sample.prompt_tokens),
            "excluded_reason": excluded or depth_excluded,
            "cold_proof": proof,
            "prompt_sha256": prompt_sha256(payload),
            "sizing": {"method": method, "tokens": sized.tokens, "calls": sized.tokenize_calls, "salt": salt},
        }

    label = f"prefill {depth_label(kv_depth)} on {kv_server.name}"
    failure: str | None = None
    try:
        outcome = run_repeated(
            send,
            functools.partial(kv_record, probe="prefill", shape=depth_label(kv_depth)),
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
        kv_record.sampling(outcome.sampling, probe="prefill", point=depth_label(kv_depth))
    if outcome.problems():
        pytest.fail(outcome.message(), pytrace=False)
