"""Concurrency probe: N simultaneous streams per arm (--kv-concurrency), aggregate and per-stream speed."""

from __future__ import annotations

import pytest

from pytest_kvcache.client import Client
from pytest_kvcache.config.settings import Settings
from pytest_kvcache.plugin import Recorder
from pytest_kvcache.probes.concurrency import level_label, run_trial, stream_payload
from pytest_kvcache.run.measure import ArmClient, Server


@pytest.mark.concurrency
def test_concurrency(
    kv_server: Server, kv_client: ArmClient, kv_record: Recorder, kv_settings: Settings, kv_concurrency: int
) -> None:
    streams = kv_concurrency
    st = kv_settings

    def make_client() -> Client:
        return Client(kv_server.url, **st.client_kwargs())

    problems = []
    plan = [("warmup", i) for i in range(min(st.warmups, 1))] + [("measured", i) for i in range(st.runs)]
    for phase, trial in plan:
        payloads = [
            kv_server.profile.adapt(
                stream_payload(kv_server.model, st.seed, streams, phase, trial, j, st.concurrency_max_tokens)
            )
            for j in range(streams)
        ]
        samples = run_trial(make_client, payloads, st.request_timeout_s)
        for j, sample in enumerate(samples):
            kv_record(
                sample,
                probe="concurrency",
                shape=level_label(streams),
                phase=phase,
                index=trial,
                stream=j,
                concurrency=streams,
            )
            if phase == "measured" and not sample.ok:
                problems.append(f"trial {trial} stream {j}: {sample.error_kind}: {sample.error}")
        if not kv_server.engine.alive():
            problems.append("the engine died")
            break
    if problems:
        pytest.fail(f"concurrency {streams} on {kv_server.name}: " + "; ".join(problems[:5]), pytrace=False)
