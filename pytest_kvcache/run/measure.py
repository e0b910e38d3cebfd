"""What a probe test measures with: the running server of its boot, and a client bound to it.

Plain Python: the plugin hands these to tests as the ``kv_server`` and ``kv_client`` fixtures.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

import httpx

from pytest_kvcache.client import Client
from pytest_kvcache.config.arms import Arm
from pytest_kvcache.config.plan import Boot
from pytest_kvcache.engines.base import Engine, tail
from pytest_kvcache.engines.kinds.base import EngineProfile, Kind, find_kind
from pytest_kvcache.engines.kinds.vllm import VLLM
from pytest_kvcache.metrics import prometheus
from pytest_kvcache.model.base import Json
from pytest_kvcache.model.evidence import Evidence
from pytest_kvcache.sample import Sample

#: Failures that may mean the engine died; ``DEATH_GRACE_S`` is how long its exit may lag the socket.
TRANSPORT_FAILURES = frozenset(
    {"dropped", "connection_error", "stall", "server_error", "first_token_timeout", "no_response"}
)
DEATH_GRACE_S = 2.0
#: How long the "after" /metrics scrape waits for the request to be counted as finished.
SUCCESS_WAIT_S = 2.0

Payload = Mapping[str, Any]


@dataclass(frozen=True)
class Server:
    """What ``kv_server`` gives a test: where the arm's engine answers, and what it is."""

    url: str
    arm: Arm
    boot: Boot
    model: str
    evidence: Evidence
    engine: Engine
    #: what this kind of server takes (``--kv-engine``): every request passes through ``profile.adapt``
    profile: EngineProfile = VLLM

    @property
    def name(self) -> str:
        return self.boot.boot_id


def alive_after(engine: Engine, grace_s: float = DEATH_GRACE_S) -> bool:
    """Whether an engine is still alive a moment after a failed request (its exit can lag the socket)."""
    deadline = time.monotonic() + grace_s
    while engine.alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    return engine.alive()


def death_notice(server: Server) -> tuple[str, str]:
    """The headline and log tail of an engine that died under a test."""
    code = getattr(server.engine, "exit_code", lambda: None)()
    return f"{server.boot.boot_id}: engine died (exit code {code})", tail(server.engine.log_path)


class EngineDied(RuntimeError):
    """The engine died during an unstreamed request; the message holds its log tail."""


class ArmClient:
    """A :class:`Client` bound to one arm's engine: a failure while the engine is dead says so."""

    def __init__(self, client: Client, server: Server) -> None:
        self.client = client
        self.server = server
        # the engine counters read around each request (prefix-cache hits …): its kind's own names
        self.kind: Kind | None = find_kind(server.profile.kind)
        self._no_metrics = self.kind is None or not self.kind.counters

    @property
    def base_url(self) -> str:
        return self.client.base_url

    def stream_chat(self, payload: Payload, *, keep_text: bool = False, prompt_tokens: int | None = None) -> Sample:
        sample = self.client.stream_chat(
            self.server.profile.adapt(payload), keep_text=keep_text, prompt_tokens=prompt_tokens
        )
        if not sample.ok and sample.error_kind in TRANSPORT_FAILURES:
            alive_after(self.server.engine)  # a dying engine closes its sockets a moment before it is gone
        if not sample.ok and not self.server.engine.alive():
            headline, log_tail = death_notice(self.server)
            sample.fail("engine_died", f"{headline} (request ended with: {sample.error})\n{log_tail}")
        return sample

    def scrape(self) -> prometheus.Scrape | None:
        """One ``/metrics`` scrape, or None when the server has none (then never asked again)."""
        if self._no_metrics:
            return None
        try:
            return prometheus.parse(self.client.get_text("/metrics"))
        except (httpx.HTTPError, ValueError):
            self._no_metrics = True
            return None

    def measure(
        self, payload: Payload, *, keep_text: bool = False, prompt_tokens: int | None = None
    ) -> tuple[Sample, dict[str, Json] | None]:
        """Stream one request with ``/metrics`` read before and after it (outside the timed window).

        The "after" scrape waits (up to ``SUCCESS_WAIT_S``) until ``vllm:request_success_total`` has
        moved, since the engine's counters lag the response. Returns the sample and the counter deltas.
        """
        before = self.scrape()
        sample = self.stream_chat(payload, keep_text=keep_text, prompt_tokens=prompt_tokens)
        return sample, self._delta_since(before, sample.ok)

    def _delta_since(self, before: prometheus.Scrape | None, ok: bool) -> dict[str, Json] | None:
        """The engine's counter deltas since ``before``, once the finished request shows in them."""
        if before is None or not self.server.engine.alive():
            return None
        assert self.kind is not None  # a kind without counters is never scraped
        success = self.kind.request_success or ""
        goal = (before.total(success) or 0.0) + 1
        deadline = time.monotonic() + SUCCESS_WAIT_S
        after = self.scrape()
        while after is not None and ok and time.monotonic() < deadline:
            if (after.total(success) or 0.0) >= goal:
                break
            time.sleep(0.02)
            after = self.scrape()
        if after is None:
            return None
        delta = cast(
            dict[str, Json],
            dict(prometheus.engine_delta(before, after, self.kind.counters, self.kind.spec_per_position)),
        )
        if ok and (after.total(success) or 0.0) < goal:
            delta["lagging"] = True
        return delta

    def post_measured(self, path: str, body: Payload, timeout_s: float) -> tuple[Any, float, dict[str, Json] | None]:
        """An unstreamed request with ``/metrics`` read around it (the fidelity probe's scoring call):
        (the response's JSON, its wall time, the counter deltas). HTTP and transport errors propagate,
        saying so when the engine died."""
        before = self.scrape()
        start = time.perf_counter()
        try:
            body_out = self.client.post_json(
                path, self.server.profile.adapt(body), min(timeout_s, self.client.read_timeout_s)
            )
        except (httpx.HTTPError, ValueError):
            if not alive_after(self.server.engine):
                headline, log_tail = death_notice(self.server)
                raise EngineDied(f"{headline}\n{log_tail}") from None
            raise
        wall_s = time.perf_counter() - start
        return body_out, wall_s, self._delta_since(before, True)

    def get_json(self, path: str, timeout_s: float = 10.0) -> Any:
        return self.client.get_json(path, min(timeout_s, self.client.read_timeout_s))

    def post_unstreamed(self, path: str, body: Payload, prompt_tokens: int) -> Any:
        """A generation that is not streamed, over a prompt of ``prompt_tokens``: nothing arrives before its prefill
        ends, so it may take that prompt's first-token limit (``--kv-first-token-floor`` + tokens /
        ``--kv-min-prefill-tps``), not only the stall timeout. Unmeasured: its caller times it."""
        return self.client.post_json(path, body, self.client.limits.first_token_limit_s(prompt_tokens))

    def post_json(self, path: str, body: Payload, timeout_s: float | None = None) -> Any:
        """An unmeasured call (``/tokenize`` …), bounded by the request and stall limits."""
        return self.client.post_json(path, body, min(timeout_s or 60.0, self.client.read_timeout_s))

    def close(self) -> None:
        self.client.close()


def request_error(exc: BaseException) -> str:
    """A failed untimed request in one line: its HTTP status and the start of its body, else the exception."""
    if isinstance(exc, httpx.HTTPStatusError):
        return f"HTTP {exc.response.status_code}: {exc.response.text[:300]}"
    return f"{type(exc).__name__}: {exc}"
