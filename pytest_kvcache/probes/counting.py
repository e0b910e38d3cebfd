"""Counting a chat request's prompt tokens as the server will, and checking it fits the server's context.

The server's own count where its profile has one (vLLM's ``/tokenize``; llama.cpp's ``/apply-template`` +
``/tokenize``); the model's tokenizer here for a generic server; calibration requests (their own salts)
only when neither answers, and the evidence says so. A request whose prompt tokens plus ``max_tokens``
exceed ``max_model_len`` is never sent: the probe leaves it out and says why.

Plain Python: no pytest (the probe tests call it with their ``kv_client`` and ``kv_server``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Literal

import httpx

from pytest_kvcache.config.settings import Settings
from pytest_kvcache.engines.kinds.base import DEFAULT_KIND, find_kind, get_kind
from pytest_kvcache.probes import tokens
from pytest_kvcache.probes.prefill import SizingError
from pytest_kvcache.probes.short import chat_payload
from pytest_kvcache.run.measure import ArmClient, Server

Body = Mapping[str, Any]
Counter = Callable[[Body], int]
Method = Literal["tokenize", "local", "calibrated"]


def token_counter(client: ArmClient, server: Server, settings: Settings) -> tuple[Counter, Method]:
    """A function that counts a chat body's prompt tokens (``{"messages": …, "tools": …}``), and how."""
    model = server.model
    kind = find_kind(server.profile.kind) or get_kind(DEFAULT_KIND)
    on_server = kind.token_counter(client, model)

    def count(body: Body) -> int:
        assert on_server is not None
        try:
            return on_server(body)
        except (httpx.HTTPError, KeyError, TypeError, ValueError) as exc:
            raise SizingError(f"{kind.token_endpoint} failed: {type(exc).__name__}: {exc}") from None

    probe: Body = {"messages": [{"role": "user", "content": "probe"}]}
    if on_server is None:
        try:
            local = tokens.local_counter(tokens.tokenizer_dir(settings))
            return (lambda body: local(list(body["messages"]))), "local"
        except tokens.TokenizerError as exc:
            server.evidence["tokenize"] = f"no local tokenizer ({exc}); prefill sized by calibration"
    else:
        try:
            count(probe)
            return count, "tokenize"
        except SizingError as exc:
            server.evidence["tokenize"] = f"unavailable ({type(exc).__name__}: {exc}); prefill sized by calibration"

    def calibrate(body: Body) -> int:
        sample = client.stream_chat(chat_payload(model, list(body["messages"]), "greedy", 1))
        if not sample.ok or sample.prompt_tokens is None:
            raise SizingError(f"calibration request failed: {sample.error_kind}: {sample.error}")
        return sample.prompt_tokens

    return calibrate, "calibrated"


def max_model_len(server: Server) -> int | None:
    """The context one request may fill on this server (vLLM's ``max_model_len``, llama-server's ``n_ctx``)."""
    value = server.evidence.get("max_model_len")
    return int(value) if isinstance(value, int | float) and value > 0 else None


def overflow(prompt_tokens: int, max_tokens: int, server: Server) -> str | None:
    """Why a request of ``prompt_tokens`` + ``max_tokens`` cannot be sent to ``server`` (None: it fits or
    the context is unknown)."""
    limit = max_model_len(server)
    if limit is None or prompt_tokens + max_tokens <= limit:
        return None
    return (
        f"{prompt_tokens:,} prompt tokens + {max_tokens} output tokens exceed {server.name}'s max_model_len {limit:,}"
    )
