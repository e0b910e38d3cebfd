"""Any other OpenAI-compatible server (``--kv-engine=openai``): started by ``--kv-engine-cmd`` with ``--model``
and your arguments, sent no vLLM-only request field, its prompt tokens counted with the local tokenizer."""

from __future__ import annotations

from pytest_kvcache.engines.kinds.base import (
    VLLM_ONLY_FIELDS,
    VLLM_ONLY_STREAM_OPTIONS,
    EngineProfile,
    Kind,
    register_kind,
)

OPENAI = EngineProfile(
    kind="openai",
    title="generic OpenAI-compatible server",
    dropped_fields=VLLM_ONLY_FIELDS,
    dropped_stream_options=VLLM_ONLY_STREAM_OPTIONS,
    tokens="local",
    evidence_paths=("/v1/models",),
    states_kv_cache=False,
)


@register_kind("openai")
class OpenaiKind(Kind):
    """A server the plugin knows only by the OpenAI API: what it cannot show is listed in the evidence."""

    profile = OPENAI
    short_title = "OpenAI-compatible server"
