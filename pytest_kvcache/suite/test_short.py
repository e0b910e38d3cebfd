"""Short-context probes: decode speed and TTFT on a short prompt, per arm and shape; then the unmeasured
greedy token-id requests that compare the arms' outputs (output agreement)."""

from __future__ import annotations

import functools
from typing import Any

import pytest

from pytest_kvcache.config.settings import Settings
from pytest_kvcache.plugin import Agree, Recorder
from pytest_kvcache.probes import counting
from pytest_kvcache.probes.agreement import agreement_payload
from pytest_kvcache.probes.runner import Adaptive, run_repeated
from pytest_kvcache.probes.short import AGREEMENT_MAX_TOKENS, SHAPES, ShortShape, chat_payload
from pytest_kvcache.run.measure import ArmClient, Server
from pytest_kvcache.sample import Sample


@pytest.mark.short
@pytest.mark.parametrize("shape", SHAPES, ids=[s.name for s in SHAPES])
def test_short(
    kv_server: Server,
    kv_client: ArmClient,
    kv_record: Recorder,
    kv_settings: Settings,
    kv_benchmark: Any,
    kv_agreement: Agree,
    shape: ShortShape,
) -> None:
    payload = chat_payload(
        kv_server.model,
        [{"role": "user", "content": shape.prompt}],
        kv_settings.sampling,
        kv_settings.max_tokens or shape.max_tokens,
    )
    if counting.max_model_len(kv_server) is not None:  # a prompt that cannot fit is never sent
        count, method = counting.token_counter(kv_client, kv_server, kv_settings)
        too_long = (
            counting.overflow(count(payload), int(payload["max_tokens"]), kv_server) if method != "calibrated" else None
        )
        if too_long:
            kv_record.left_out(probe="short", point=shape.name, reason=too_long)
            pytest.skip(f"short {shape.name} left out: {too_long}")

    def send(phase: str, index: int) -> tuple[Sample, dict[str, object]]:
        sample, engine = kv_client.measure(payload)
        return sample, {"engine": engine}

    outcome = run_repeated(
        send,
        functools.partial(kv_record, probe="short", shape=shape.name),
        label=f"short {shape.name} on {kv_server.name}",
        warmups=kv_settings.warmups,
        runs=kv_settings.runs,
        bench=kv_benchmark,
        adaptive=Adaptive.of(kv_settings, "decode_tps", kv_settings.runs),
    )
    if outcome.sampling:
        kv_record.sampling(outcome.sampling, probe="short", point=shape.name)
    if outcome.problems():
        pytest.fail(outcome.message(), pytrace=False)
    tokens = min(kv_settings.max_tokens or shape.max_tokens, AGREEMENT_MAX_TOKENS)
    kv_agreement(shape.name, agreement_payload(kv_server.model, shape.prompt, tokens))
