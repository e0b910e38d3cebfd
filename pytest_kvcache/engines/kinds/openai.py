"""Any other OpenAI-compatible server (``--kv-engine=openai``): started by ``--kv-engine-cmd`` with ``--model``
and your arguments, sent no vLLM-only request field, its prompt tokens counted with the local tokenizer."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from pytest_kvcache.config.settings import Settings
from pytest_kvcache.engines.kinds import folder, vllm
from pytest_kvcache.engines.kinds.base import (
    VLLM_ONLY_FIELDS,
    VLLM_ONLY_STREAM_OPTIONS,
    Command,
    EngineProfile,
    Kind,
    register_kind,
)
from pytest_kvcache.model.evidence import LogFacts

if TYPE_CHECKING:
    from pytest_kvcache.config.plan import Boot

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
    # many such servers are vLLM underneath: its KV dtype names are the arms typed
    dtype_aliases = vllm.ALIASES
    dtypes = vllm.KV_CACHE_DTYPES

    def command(self, settings: Settings, boot: Boot, log_path: Path) -> Command:
        """``--kv-engine-cmd``, the model (``--kv-model``, else the embedded model's folder), the user's arguments."""
        model = folder.embedded_vllm_model(settings)
        return settings.engine_cmd, ["--model", model, *settings.engine_args, *boot.arm.args], dict(boot.arm.env)

    def parse_log(self, text: str) -> LogFacts:
        """Many OpenAI-compatible servers are vLLM underneath: the facts a vLLM log states, where it states them
        (another server's log yields none)."""
        return vllm.parse_log(text)
