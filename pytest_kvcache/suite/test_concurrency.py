"""Concurrency probe: N simultaneous streams per arm (--kv-concurrency), aggregate and per-stream speed."""

from __future__ import annotations

import pytest

from pytest_kvcache.config.settings import Settings
from pytest_kvcache.fanout import FanoutError
from pytest_kvcache.plugin import Recorder
from pytest_kvcache.probes.concurrency import (
    aggregate_tps,
    excluded_reason,
    fanout,
    stream_payload,
)
from pytest_kvcache.probes.registry import level_label
from pytest_kvcache.probes.runner import Adaptive, server_lost
from pytest_kvcache.run.measure import ArmClient, Server


@pytest.mark.concurrency
def test_concurrency(
    kv_server: Server, kv_client: ArmClient, kv_record: Recorder, kv_settings: Settings, kv_concurrency: int
) -> None:
    streams = kv_concurrency
    st = kv_settings
    client = fanout(kv_server, st, streams)
    problems: list[str] = []
    measured: list[float | None] = []  # each measured trial's aggregate tok/s (the adaptive rule's values)

    def trial_(phase: str, trial: int) -> bool:
        payloads = [
            kv_server.profile.adapt(
                stream_payload(kv_server.model, st.seed, streams, phase, trial, j, st.concurrency_max_tokens)
            )
            for j in range(streams)
        ]
        try:
            result = client.trial(payloads)
        except FanoutError as exc:  # the client's own worker failed: no stream was measured
            pytest.fail(
                f"concurrency {streams} on {kv_server.name}: the many-stream client failed: {exc}", pytrace=False
            )
        samples, load = result.samples, result.load
        excluded = excluded_reason(load)
        if phase == "measured":  # a saturated trial's figures are the client's: recorded, flagged, not counted
            measured.append(None if excluded else aggregate_tps(samples))
        for j, sample in enumerate(samples):
            kv_record(
                sample,
                probe="concurrency",
                shape=level_label(streams),
                phase=phase,
                index=trial,
                stream=j,
                concurrency=streams,
                client=load.to_dict(),
                flags=["client_saturated"] if excluded else [],
                excluded_reason=excluded if sample.ok else None,
            )
            if phase == "measured" and not sample.ok:
                problems.append(f"trial {trial} stream {j}: {sample.error_kind}: {sample.error}")
        if not kv_server.engine.alive():
            problems.append("the engine died")
            return False
        return not any(server_lost(s) for s in samples)  # a hung server: every further trial would wait as long

    plan = [("warmup", i) for i in range(min(st.warmups, 1))] + [("measured", i) for i in range(st.runs)]
    with client:
        alive = all(trial_(phase, trial) for phase, trial in plan)
        adaptive = Adaptive.of(st, "aggregate_tps", st.runs)
        if adaptive is not None:  # --kv-target-ci: more trials until the aggregate tok/s CI is narrow enough
            width = adaptive.half_width_pct_of(measured)
            while alive and (width is None or width > adaptive.target_pct) and len(measured) < adaptive.max_runs:
                alive = trial_("measured", len(measured))
                width = adaptive.half_width_pct_of(measured)
            kv_record.sampling(
                adaptive.stopped(len(measured), width, unit="trial(s)"), probe="concurrency", point=level_label(streams)
            )
    if problems:
        pytest.fail(f"concurrency {streams} on {kv_server.name}: " + "; ".join(problems[:5]), pytrace=False)
