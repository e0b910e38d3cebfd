"""A toy engine kind, registered from outside the package: the whole of what a new kind costs.

It serves the stand-in engine (``pytest_kvcache.testing.standin``, vLLM-shaped) under its own name, title,
KV dtype names (``toy8``, ``toy16``), command line, log parser and Prometheus counter names (two of vLLM's,
so a record's engine deltas show which names were read). ``test_engine_kind_toy.py`` copies this file in as
a run's ``conftest.py`` and runs ``--kv-engine=toy`` through it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, cast

from pytest_kvcache.config.settings import Settings
from pytest_kvcache.engines.kinds.base import Command, Kind, register_kind
from pytest_kvcache.engines.kinds.vllm import VLLM, parse_log
from pytest_kvcache.model.evidence import LogFacts

if TYPE_CHECKING:
    from pytest_kvcache.config.plan import Boot

TOY_DTYPES: Mapping[str, str] = {"toy16": "auto", "toy8": "fp8_e4m3"}
TOY_COUNTERS: Mapping[str, str] = {
    "prompt_tokens": "vllm:prompt_tokens_total",
    "generation_tokens": "vllm:generation_tokens_total",
}


@register_kind("toy")
class ToyKind(Kind):
    profile = replace(VLLM, kind="toy", title="Toy engine (the stand-in, a kind registered by a test)")
    dtype_aliases = TOY_DTYPES  # its arm names (an arm's kv_cache_dtype is the value), and no raw dtype
    dtypes = ()
    counters = TOY_COUNTERS
    request_success = "vllm:request_success_total"
    cache_config_info = "vllm:cache_config_info"

    def command(self, settings: Settings, boot: Boot, log_path: Path) -> Command:
        args = ["--model", "toy-model", "--kv-cache-dtype", boot.arm.kv_cache_dtype or "auto"]
        return settings.engine_cmd, [*args, *settings.engine_args, *boot.arm.args], dict(boot.arm.env)

    def parse_log(self, text: str) -> LogFacts:
        found = dict(parse_log(text))
        found["toy_log_lines"] = len(text.splitlines())
        return cast(LogFacts, found)
