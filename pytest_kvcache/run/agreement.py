"""Output agreement over HTTP: the greedy requests (token ids + logprobs) a boot's short shapes queued, sent
after every measured request of the boot and logged to ``agreement.jsonl``."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, Protocol

import httpx

from pytest_kvcache.client import Client
from pytest_kvcache.config.settings import Settings
from pytest_kvcache.engines import engine_profile
from pytest_kvcache.engines.base import Engine, salient_error, tail
from pytest_kvcache.model.evidence import Evidence
from pytest_kvcache.model.records import AgreementRecord
from pytest_kvcache.run.measure import alive_after


class Run(Protocol):
    """What output agreement reads of the run (``run.run.Run`` meets it): the requests each boot queued, its
    engines and evidence, whether it was interrupted, and its logs."""

    settings: Settings
    agreement_due: dict[str, list[tuple[str, str, Mapping[str, Any]]]]
    engines: dict[str, Engine]
    evidence: dict[str, Evidence]
    interrupted: bool

    def log(self, name: str, record: Mapping[str, object]) -> None: ...


def run_agreement(run: Run, boot_id: str) -> None:
    """Send the boot's queued output-agreement requests (greedy, token ids + logprobs), after every
    measured request of the boot, and log them to ``agreement.jsonl``. Never raises: agreement is
    evidence. An engine that dies on them (vLLM compiles a sampler helper for logprobs, which needs a
    C++ compiler on CPU) is recorded, and the measurements already taken stand."""
    from pytest_kvcache.probes.agreement import REQUESTS, parse_response

    due = run.agreement_due.pop(boot_id, [])
    engine = run.engines.get(boot_id)
    evidence = run.evidence.get(boot_id) or {}
    if not due or engine is None or run.interrupted or not engine.alive():
        return
    profile = engine_profile(run.settings)
    if not profile.token_ids:
        evidence.setdefault("warnings", []).append(
            f"output agreement skipped: a {profile.title} gives no generated token ids"
        )
        return
    arm = evidence.get("arm") or {}
    client = Client(
        engine.url, request_timeout_s=run.settings.request_timeout_s, stall_timeout_s=run.settings.stall_timeout_s
    )
    timeout = client.read_timeout_s  # bounded by the request and the stall limits, like a measured request
    try:
        for test, shape, payload in due:
            for index in range(REQUESTS):
                entry: AgreementRecord = {
                    "arm": arm.get("name"),
                    "boot": boot_id,
                    "replicate": evidence.get("replicate", 1),
                    "shape": shape,
                    "index": index,
                    "test": test,
                }
                sent = time.time()
                try:
                    body = client.post_json("/v1/chat/completions", profile.adapt(payload), timeout)
                    tokens = parse_response(body)
                    entry["ok"], entry["ids"], entry["logprobs"] = True, list(tokens.ids), list(tokens.logprobs)
                    text = ((body.get("choices") or [{}])[0].get("message") or {}).get("content")
                    if isinstance(text, str):
                        entry["text"] = text
                except (httpx.HTTPError, ValueError) as exc:
                    entry["ok"], entry["error"] = False, f"{type(exc).__name__}: {exc}"
                entry["send_unix_s"], entry["wall_s"] = sent, time.time() - sent
                dead = not entry.get("ok") and not alive_after(engine)
                if dead:
                    cause = salient_error(tail(engine.log_path, 400)) or "see engine.log"
                    entry["error"] = f"the engine died on the agreement requests: {cause}"
                    evidence.setdefault("warnings", []).append(entry["error"])
                run.log("agreement.jsonl", entry)
                if dead:
                    return
    finally:
        client.close()
