"""Concurrency probe: N simultaneous streams per trial, each its own salted prompt.

The streams of a trial are read by the many-stream client (`pytest_kvcache.fanout.Fanout`: worker processes,
one event loop each, connections opened before the trial, every request sent at the trial's start). The
report derives per trial the aggregate TPS (all streams' tokens over the span from the first send to the
last ``[DONE]``), the median per-stream decode TPS and the p95 TTFT (``report.frame.trial_rows``). A trial
whose client was saturated (`pytest_kvcache.fanout.ClientLoad`) is kept in the records and excluded from the
figures: its timings are the client's.

Plain Python: no pytest.
"""

from __future__ import annotations

import math
from typing import Any

from pytest_kvcache.fanout import Fanout, default_processes
from pytest_kvcache.fanout_plan import ClientLoad, Saturation
from pytest_kvcache.probes.prefill import salt_for
from pytest_kvcache.probes.short import SHAPES, chat_payload
from pytest_kvcache.sample import Sample

PROMPT = SHAPES[1].prompt  # the code shape: short prompt, long decode


def stream_payload(
    model: str, seed: int, streams: int, phase: str, trial: int, stream: int, max_tokens: int
) -> dict[str, Any]:
    """A greedy request whose prompt is salted per stream and trial (no prefix is shared between streams)."""
    salt = salt_for(seed, "concurrency", streams, phase, trial, stream)
    messages = [{"role": "user", "content": f"[session {salt}] {PROMPT}"}]
    return chat_payload(model, messages, "greedy", max_tokens)


def aggregate_tps(samples: list[Sample]) -> float | None:
    """A trial's aggregate decode speed: every stream's tokens over the span from the first send to the
    last stream's end (the report's ``aggregate_tps``); None when a stream failed."""
    if not samples or not all(s.ok for s in samples):
        return None
    start = min(s.send_unix_s for s in samples)
    end = max(s.send_unix_s + (s.end_s or 0.0) for s in samples)
    tokens = sum(s.completion_tokens or 0 for s in samples)
    return tokens / (end - start) if end > start else None


def fanout(server: Any, st: Any, streams: int, **bounds: float) -> Fanout:
    """The many-stream client for up to ``streams`` at once on ``server`` (a ``run.measure.Server``): the
    settings' client limits, the engine's way with headers, and the saturation bounds (``--kv-client-max-cpu``,
    ``--kv-client-max-lag-ms``; None: not judged) with ``bounds`` (``Saturation``'s other fields) added."""
    cpu, lag = st.client_max_cpu_pct, st.client_max_lag_ms
    return Fanout(
        server.url,
        processes=st.client_procs or default_processes(streams),
        saturation=Saturation(
            max_cpu_share=math.inf if cpu is None else cpu / 100.0,
            max_loop_lag_s=math.inf if lag is None else lag / 1000.0,
            **bounds,
        ),
        headers_at_once=server.profile.headers_at_once,
        **st.client_kwargs(),
    )


def excluded_reason(load: ClientLoad) -> str | None:
    """Why a trial's figures are not the engine's: the client was saturated."""
    return "client_saturated: " + "; ".join(load.reasons) if load.saturated else None
