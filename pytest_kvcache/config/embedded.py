"""The models served when ``--kv-model`` is left out, and the probe sizes each one gets on the CPU.

Plain data, read by the settings (defaults, the context known before any boot) and by the engines
(what to serve, with which arguments). ``--kv-model=embedded:NAME`` picks one; the default is the
trained SmolLM2-135M-Instruct, so that what an arm does to the model's outputs (fidelity, output
agreement, an agentic session at the model's own context) means something. The random-weight tiny
model stays for what needs no trained weights (speed, capacity, the plugin's mechanics): it boots in
half the time and decodes ~7× faster on vLLM's CPU build.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pytest_kvcache.config.constants import (
    CPU_CAPACITY_DEPTHS,
    CPU_CAPACITY_MAX_SESSIONS,
    CPU_CAPACITY_MAX_TOKENS,
    CPU_CAPACITY_THINK_S,
    CPU_CAPACITY_WINDOW_S,
    CPU_SLO,
)

#: What ``--kv-model`` starts with to name an embedded model (``embedded`` alone: the default one).
PREFIX = "embedded"


@dataclass(frozen=True)
class EmbeddedModel:
    """One embedded model and the probe sizes that fit it on 2 CPU cores (each overridable by its option)."""

    name: str
    title: str
    trained: bool
    #: the context it was trained for (its config's max_position_embeddings, its GGUF's context_length)
    context: int
    depths: tuple[int, ...]
    fidelity_depths: tuple[int, ...]
    fidelity_window: int
    sessions: int
    turns: int | None
    agentic_max_tokens: int
    #: every short shape's max_tokens (None: each shape's own, 1000 and 800)
    short_max_tokens: int | None
    warmups: int
    runs: int
    #: the slowest prefill the first-token limit allows for (tokens/s)
    min_prefill_tps: float
    #: what vLLM's CPU build needs to serve it
    vllm_args: tuple[str, ...]
    #: llama-server's context (one slot holds it all)
    llamacpp_ctx: int
    #: the capacity probe's sizes on 2 CPU cores: SLO, session depths, think time (s), trial window (s),
    #: tokens a turn, most sessions tried (each overridable: --kv-slo, --kv-capacity-*)
    capacity_slo: str = CPU_SLO
    capacity_depths: tuple[int, ...] = CPU_CAPACITY_DEPTHS
    capacity_think_s: float = CPU_CAPACITY_THINK_S
    capacity_window_s: float = CPU_CAPACITY_WINDOW_S
    capacity_max_tokens: int = CPU_CAPACITY_MAX_TOKENS
    capacity_max_sessions: int = CPU_CAPACITY_MAX_SESSIONS
    #: the served folder's ``config.json`` figures the KV arithmetic reads (the budget rule, the boot plan), for a
    #: model whose folder is made at run time (the trained one, converted from its GGUF); empty: read the packaged
    #: folder. A test holds them to the GGUF's own metadata.
    kv_config: Mapping[str, Any] = field(default_factory=dict)


SMOLLM2 = EmbeddedModel(
    name="smollm2-135m",
    title="SmolLM2-135M-Instruct (trained; Apache-2.0)",
    trained=True,
    context=8192,
    # vLLM's CPU build prefills it at ~145 tok/s in float32 on 2 cores, llama.cpp at 46-186 tok/s (q4_0-f16
    # KV): a 4K prompt takes 20-90 s, so two depths, one agentic session and short decodes of 128 tokens
    # keep `-m depth` and `-m fidelity` within a few minutes an arm.
    depths=(1_000, 4_000),
    fidelity_depths=(1_000, 4_000),
    fidelity_window=256,
    sessions=1,
    turns=None,
    agentic_max_tokens=64,
    short_max_tokens=128,
    warmups=1,
    runs=5,
    # 39 tok/s is vLLM's bf16 prefill on an AVX2 machine (no bf16 matmul), 46 llama.cpp's with q4_0 KV at 4K; a
    # shared machine halves it
    min_prefill_tps=10.0,
    # float32: the weights dequantized from Q4_1 are exact in it, and AVX2 has no bf16 matmul (3.7× slower
    # prefill in bf16). The dtype itself comes from Settings.embedded_dtype (bfloat16 where an arm's KV is
    # float16/bfloat16, which vLLM's CPU build serves wrongly on float32 weights).
    vllm_args=("--enforce-eager",),
    llamacpp_ctx=8192,
    # One session alone, warm (prefix cache hits of 96-97%), had a TTFT p95 of 372 ms at 2K and 679 ms at 4K
    # on this machine's busy 2 cores (`pytest -m capacity --kv-arms=auto`, 2026-12-02), and vLLM's CPU build
    # decodes it at ~18 tok/s (~55 ms a token, FACTS.md): the tiny model's 200 ms SLO failed at one session,
    # every depth read 0. With these sizes the same command found 8 [4, 9] sessions at 1K and 7 [6, 7] at 2K,
    # both knees bound by compute (hit rate flat at 89% and 95%), 3-4 turns a session a trial, in 6 min 20 s.
    capacity_slo="ttft_p95<=1.5s,itl_p95<=150ms",
    capacity_depths=(1_000, 2_000),
    capacity_think_s=2.0,
    capacity_window_s=10.0,
    capacity_max_sessions=16,
    # the GGUF's llama.block_count, attention.head_count(_kv), embedding_length, context_length, vocabulary,
    # feed_forward_length (its output weight is the token embedding: tied)
    kv_config={
        "num_hidden_layers": 30,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "hidden_size": 576,
        "head_dim": 64,
        "intermediate_size": 1536,
        "tie_word_embeddings": True,
        "max_position_embeddings": 8192,
        "vocab_size": 49152,
        "torch_dtype": "bfloat16",
    },
)
TINY = EmbeddedModel(
    name="tiny-qwen3",
    title="tiny-qwen3 (random weights)",
    trained=False,
    context=131_072,
    depths=(4_000, 16_000),
    fidelity_depths=(1_000, 4_000),
    fidelity_window=512,
    sessions=1,
    turns=9,
    agentic_max_tokens=600,
    short_max_tokens=None,
    warmups=3,
    runs=5,
    min_prefill_tps=500.0,
    vllm_args=("--load-format", "dummy", "--enforce-eager"),
    llamacpp_ctx=20480,
)

EMBEDDED: Mapping[str, EmbeddedModel] = {m.name: m for m in (SMOLLM2, TINY)}
DEFAULT = SMOLLM2.name


def parse(value: str) -> str | None:
    """``embedded`` → the default's name, ``embedded:NAME`` → NAME (checked), anything else → None (a
    real model: a folder, a GGUF file or a hub id). ValueError names the valid ones."""
    if value != PREFIX and not value.startswith(PREFIX + ":"):
        return None
    name = value.partition(":")[2] or DEFAULT
    if name not in EMBEDDED:
        valid = ", ".join(f"{PREFIX}:{n}" for n in EMBEDDED)
        raise ValueError(f"unknown embedded model {value!r}; embedded models: {valid}")
    return name
