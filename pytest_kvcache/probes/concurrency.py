"""Concurrency probe: N simultaneous streams per trial, each its own salted prompt.

Each stream runs on its own thread with its own measuring client (connected before the start barrier,
so connection set-up is outside every timing), and the threads are released together. The analysis
derives per trial the aggregate TPS (all streams' tokens over the span from the first send to the last
``[DONE]``), the median per-stream decode TPS and the p95 TTFT (``analysis.concurrency_trials``).

Plain Python: no pytest.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from pytest_kvcache.client import Client, Sample
from pytest_kvcache.probes.prefill import salt_for
from pytest_kvcache.probes.short import SHAPES, chat_payload

PROMPT = SHAPES[1].prompt  # the code shape: short prompt, long decode


def level_label(streams: int) -> str:
    return f"c{streams}"


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


def run_trial(make_client: Callable[[], Client], payloads: list[dict[str, Any]], timeout_s: float) -> list[Sample]:
    """Stream every payload at once, one thread and client per stream; samples in payload order."""
    clients = [make_client() for _ in payloads]
    try:
        for client in clients:  # connect (and keep alive) before the barrier
            client.get_json("/v1/models")
        barrier = threading.Barrier(len(payloads))

        def one(i: int) -> Sample:
            try:
                barrier.wait(timeout=timeout_s)
            except threading.BrokenBarrierError:
                return Sample().fail("connection_error", "the streams could not start together")
            return clients[i].stream_chat(payloads[i])

        with ThreadPoolExecutor(max_workers=len(payloads), thread_name_prefix="kv-stream") as pool:
            return list(pool.map(one, range(len(payloads))))
    finally:
        for client in clients:
            client.close()
