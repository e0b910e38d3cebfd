"""An SGLang-like engine kind, written from outside the package as a newcomer would: the whole of what a kind costs,
docker included — one module and one import line (``import tests.unit.sglang_kind``). ``test_kinds.py`` runs it
through the settings, the process launcher's command line, the docker launcher, the log parser and the counters.

SGLang's names are its own: ``python -m sglang.launch_server --model-path M --kv-cache-dtype fp8_e5m2``, its
Prometheus counters ``sglang:…`` (with ``--enable-metrics``), and its startup line ``KV Cache is allocated.
#tokens: N``. It has no byte budget (``--mem-fraction-static`` is a share), so ``--kv-cache-bytes`` is refused.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

from pytest_kvcache.config.settings import Settings
from pytest_kvcache.engines.kinds.base import (
    VLLM_ONLY_FIELDS,
    VLLM_ONLY_STREAM_OPTIONS,
    Command,
    Container,
    EngineProfile,
    Kind,
    register_kind,
)
from pytest_kvcache.model.evidence import LogFacts

if TYPE_CHECKING:
    from pytest_kvcache.config.plan import Boot

SGLANG = EngineProfile(
    kind="sglang",
    title="SGLang (a kind registered by a test)",
    dropped_fields=VLLM_ONLY_FIELDS,
    dropped_stream_options=VLLM_ONLY_STREAM_OPTIONS,
    tokens="local",
    evidence_paths=("/v1/models", "/metrics"),
    states_kv_cache=False,
)
#: ``--kv-cache-dtype``'s choices, and the short names typed for them
SGLANG_DTYPES = ("auto", "fp8_e5m2", "fp8_e4m3", "bfloat16", "fp4_e2m1")
SGLANG_ALIASES = {"fp8": "fp8_e4m3", "bf16": "bfloat16", "fp4": "fp4_e2m1"}
SGLANG_COUNTERS = {
    "prompt_tokens": "sglang:prompt_tokens_total",
    "generation_tokens": "sglang:generation_tokens_total",
    "engine_ttft_s": "sglang:time_to_first_token_seconds_sum",
}
_KV_TOKENS = re.compile(r"KV Cache is allocated\. #tokens: (\d+)")
_DTYPE = re.compile(r"kv_cache_dtype='([^']+)'")


@register_kind("sglang")
class SglangKind(Kind):
    profile = SGLANG
    dtype_aliases = SGLANG_ALIASES
    dtypes = SGLANG_DTYPES
    launchers = ("process", "docker", "external")
    needs_cmd = False
    counters = SGLANG_COUNTERS
    context_flags = ("--context-length",)

    def _args(self, settings: Settings, boot: Boot, model: str) -> list[str]:
        dtype = ["--kv-cache-dtype", boot.arm.kv_cache_dtype] if boot.arm.kv_cache_dtype else []
        return ["--model-path", model, *dtype, "--enable-metrics", *settings.engine_args, *boot.arm.args]

    def command(self, settings: Settings, boot: Boot, log_path: Path) -> Command:
        program = settings.engine_cmd or ("python", "-m", "sglang.launch_server")
        return program, self._args(settings, boot, settings.model or "."), dict(boot.arm.env)

    def container(self, settings: Settings, boot: Boot) -> Container:
        """The model folder at ``/model``; the image's entrypoint is the server (``lmsysorg/sglang``'s is a shell:
        an arm's image names its own)."""
        mount = (settings.model, "/model") if settings.model and Path(settings.model).is_dir() else None
        model = "/model" if mount else settings.model or "."
        return Container(self._args(settings, boot, model), dict(boot.arm.env), model_mount=mount)

    def parse_log(self, text: str) -> LogFacts:
        found = LogFacts()
        if tokens := _KV_TOKENS.findall(text):
            found["kv_cache_size_tokens"] = int(tokens[-1])
        if (dtype := _DTYPE.search(text)) is not None:
            found["kv_cache_dtype"] = dtype.group(1)
        return found
