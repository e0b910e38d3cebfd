"""A model's KV cache, layer by layer, from its ``config.json`` — and what an engine makes of a KV budget.

Attention layers differ in what they keep per token. A **full** attention layer keeps K and V of every token
(``kv_heads × (head_dim + v_head_dim)`` elements a token). A **sliding-window** layer attends to the last
``window`` tokens only, and a **chunked local** layer (Llama 4) to its own ``window``-token chunk: an engine may
free what falls out of reach. A **latent** (MLA, DeepSeek-V2/V3) layer keeps one ``kv_lora_rank +
qk_rope_head_dim`` vector a token, no K/V heads. A **state** layer (linear attention, Mamba) keeps a fixed-size
state per request instead of a per-token KV. **none**: a layer with no cache at all (an MLP-only block of
Nemotron-H's pattern).

:meth:`KvLayout.from_config` reads the layer types the way the model's own code does — ``layer_types``, else the
family's rule (Gemma's ``sliding_window_pattern``, gpt-oss's and Gemma 2's alternation, Qwen's
``max_window_layers``, Llama 4's ``no_rope_layers``, Qwen3-Next's ``full_attention_interval``, Jamba's attention
period, Nemotron-H's ``hybrid_override_pattern``, Mistral's one window on every layer). What it cannot place is
said in :attr:`KvLayout.unmodelled` (a figure computed from it would be wrong), never guessed.

:class:`KvPlan` is what an engine kind computes from a layout and a budget before anything boots (vLLM's groups:
``engines/kinds/vllm_kv.py``); the boot plan states it and the report sets it beside what the engine reported.
Plain Python: no I/O, no pytest.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

LayerKind = Literal["full", "sliding", "chunked", "latent", "state", "none"]
#: what ``layer_types`` entries (transformers' names, and the hybrids' own) mean here
LAYER_TYPES: Mapping[str, LayerKind] = {
    "full_attention": "full",
    "attention": "full",
    "global_attention": "full",
    "sliding_attention": "sliding",
    "sliding_window_attention": "sliding",
    "local_attention": "sliding",
    "chunked_attention": "chunked",
    "linear_attention": "state",
    "mamba": "state",
    "mamba2": "state",
    "conv": "state",
    "short_conv": "state",
}
#: model types whose layers keep a fixed-size state (Mamba, linear attention); placed per family below, or not
STATE_MODEL_TYPES = frozenset(
    {
        "mamba",
        "mamba2",
        "falcon_mamba",
        "jamba",
        "bamba",
        "zamba",
        "zamba2",
        "falcon_h1",
        "nemotron_h",
        "granitemoehybrid",
        "qwen3_next",
        "lfm2",
        "lfm2_moe",
        "plamo2",
        "minimax",
        "minimax_text_01",
        "kimi_linear",
    }
)
#: config keys of layouts this arithmetic does not model, and why
UNMODELLED_KEYS: Mapping[str, str] = {
    "num_kv_shared_layers": "its last layers reuse earlier layers' KV (Gemma 3n/4 KV sharing)",
    "global_head_dim": "its full layers have their own head size (Gemma 4)",
    "num_global_key_value_heads": "its full layers have their own KV heads (Gemma 4)",
    "attention_k_eq_v": "its full layers keep K as V (Gemma 4)",
    "index_topk": "sparse attention keeps an indexer cache beside the latent one (DeepSeek-V3.2)",
    "block_configs": "per-block attention (DeciLM / Nemotron-NAS)",
}
#: weights dtypes by their bytes; a KV element at ``auto`` is the weights'
DTYPE_BYTES = {"float32": 4.0, "float": 4.0, "bfloat16": 2.0, "float16": 2.0, "half": 2.0, "fp16": 2.0, "bf16": 2.0}


def _positive(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _count(config: Mapping[str, Any], key: str, default: int | None = None) -> int | None:
    """``config[key]`` when it is a positive whole number, else ``default``."""
    value = config.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else default


def _whole(config: Mapping[str, Any], key: str, default: int) -> int:
    """``config[key]`` when it is a whole number (0 included), else ``default``."""
    value = config.get(key)
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else default


@dataclass(frozen=True)
class Layer:
    """What one layer keeps. ``head_dim`` is K's head size (a latent layer: its latent width, one "head");
    ``v_head_dim`` V's (0: a latent layer has no V); ``window``: the sliding window, or the chunk, in tokens."""

    kind: LayerKind
    kv_heads: int = 0
    head_dim: int = 0
    v_head_dim: int = 0
    window: int | None = None

    @property
    def keeps_kv(self) -> bool:
        return self.kind in ("full", "sliding", "chunked", "latent")

    def bytes_per_token(self, element: float) -> float:
        """KV bytes this layer keeps a token at ``element`` bytes a K/V element (0: a state or cache-less layer)."""
        return self.kv_heads * (self.head_dim + self.v_head_dim) * element if self.keeps_kv else 0.0

    def label(self) -> str:
        """``sliding-window (512)``, ``full``, ``latent``: the layer's kind in the boot plan and the report."""
        names = {"sliding": "sliding-window", "chunked": "chunked-local", "state": "fixed-state", "none": "cache-less"}
        name = names.get(self.kind, self.kind)
        return f"{name} ({self.window:,})" if self.window is not None else name


@dataclass(frozen=True)
class KvLayout:
    """A model's KV cache, layer by layer: its layers, the weights dtype its config names and its context.
    ``unmodelled``: why a figure from it would be wrong (empty: every layer is modelled)."""

    layers: tuple[Layer, ...]
    dtype: str
    max_position: int | None
    model_type: str = ""
    unmodelled: str = ""

    @property
    def model_bytes(self) -> float:
        return DTYPE_BYTES.get(self.dtype, 2.0)

    @property
    def attention(self) -> tuple[Layer, ...]:
        """The layers that keep KV per token."""
        return tuple(layer for layer in self.layers if layer.keeps_kv)

    @property
    def head_dim(self) -> int:
        """The head size the per-token-head dtypes' scales are counted over (the first KV layer's)."""
        return next((layer.head_dim for layer in self.attention), 0)

    @property
    def all_full(self) -> bool:
        """Every layer is full attention with one shape: the old arithmetic's case, exact on any engine."""
        return not self.unmodelled and len(set(self.layers)) == 1 and self.layers[0].kind in ("full", "latent")

    @property
    def kinds(self) -> tuple[str, ...]:
        """The layer labels in the order they first appear, each once."""
        return tuple(dict.fromkeys(layer.label() for layer in self.layers))

    def groups(self) -> list[tuple[Layer, int]]:
        """Each distinct layer with its count, in order of first appearance."""
        counts = Counter(self.layers)
        return [(layer, counts[layer]) for layer in dict.fromkeys(self.layers)]

    def bytes_per_token(self, element: float) -> float:
        """KV bytes a token takes in every layer that keeps KV, as if each kept every token (full attention's
        figure; a window or a chunk keeps fewer — the engine's plan says how many)."""
        return sum(layer.bytes_per_token(element) for layer in self.attention)

    def describe(self) -> str:
        """``30 layers × 3 KV heads × 64`` (one shape), or each group: ``13 layers: 11 sliding-window (512) + 2
        full, 1 KV head × 64``; a latent layout: ``2 layers × latent 576``."""
        groups = self.groups()
        shapes = {(layer.kv_heads, layer.head_dim, layer.v_head_dim) for layer, _ in groups if layer.keeps_kv}
        if len(groups) == 1 and groups[0][0].kind == "full":
            layer = groups[0][0]
            return f"{len(self.layers)} layers × {_heads(layer)}"
        if len(groups) == 1 and groups[0][0].kind == "latent":
            return f"{len(self.layers)} layers × latent {groups[0][0].head_dim}"
        parts = " + ".join(f"{count} {layer.label()}" for layer, count in groups)
        if len(shapes) == 1:
            layer = next(layer for layer, _ in groups if layer.keeps_kv)
            shape = f"latent {layer.head_dim}" if layer.kind == "latent" else _heads(layer)
            return f"{len(self.layers)} layers: {parts}, {shape}"
        return f"{len(self.layers)} layers: {parts}, per-layer heads"

    @classmethod
    def from_config(cls, data: Mapping[str, Any]) -> KvLayout | None:
        """The KV layout of a ``config.json``'s contents (its ``text_config`` for a multimodal model); None when it
        lacks a figure (layers, heads, head size). A layout it reads but cannot model carries ``unmodelled``."""
        inner = data.get("text_config")
        config: Mapping[str, Any] = inner if isinstance(inner, Mapping) else data
        layers, heads, hidden = (_count(config, k) for k in ("num_hidden_layers", "num_attention_heads", "hidden_size"))
        if layers is None or heads is None:
            return None
        head_dim = _count(config, "head_dim")
        if head_dim is None and hidden is not None and hidden % heads == 0:
            head_dim = hidden // heads
        raw_kv = config.get("num_key_value_heads")
        kv_list = [int(v) for v in raw_kv] if isinstance(raw_kv, list) and all(_positive(v) for v in raw_kv) else None
        kv_heads = _count(config, "num_key_value_heads", heads)
        assert kv_heads is not None
        dtype = str(config.get("torch_dtype") or config.get("dtype") or data.get("torch_dtype") or "bfloat16")
        model_type = str(config.get("model_type") or data.get("model_type") or "")

        unmodelled = next((why for key, why in UNMODELLED_KEYS.items() if config.get(key)), "")
        kinds, why = layer_kinds(config, layers, model_type)
        unmodelled = unmodelled or why
        if kv_list is not None and len(kv_list) != layers:
            unmodelled = unmodelled or f"num_key_value_heads lists {len(kv_list)} layers, not {layers}"
            kv_list = None

        latent = _count(config, "kv_lora_rank")
        rope = _whole(config, "qk_rope_head_dim", -1)
        v_dim = _count(config, "v_head_dim", head_dim)
        built: list[Layer] = []
        for index, (kind, window) in enumerate(kinds):
            if kind in ("state", "none"):
                built.append(Layer(kind))
            elif latent is not None and config.get("use_mla") is not False:
                if rope < 0:
                    return None
                if kind != "full":
                    unmodelled = unmodelled or f"latent attention on {kind} layers"
                built.append(Layer("latent", 1, latent + rope, 0, window))
            else:
                if head_dim is None or v_dim is None:
                    return None
                heads_here = kv_list[index] if kv_list is not None else kv_heads
                built.append(Layer(kind, heads_here, head_dim, v_dim, window))
        if not any(layer.keeps_kv for layer in built):
            unmodelled = unmodelled or "no layer keeps a per-token KV"
        state = sum(1 for layer in built if layer.kind == "state")
        if state:
            unmodelled = unmodelled or (
                f"{state} of {layers} layers keep a fixed-size state (linear attention / Mamba), not a per-token KV"
            )
        return cls(
            layers=tuple(built),
            dtype=dtype,
            max_position=_count(config, "max_position_embeddings"),
            model_type=model_type,
            unmodelled=unmodelled,
        )


def _heads(layer: Layer) -> str:
    heads = f"{layer.kv_heads} KV head{'s' if layer.kv_heads != 1 else ''}"
    dims = f"{layer.head_dim}" if layer.v_head_dim == layer.head_dim else f"{layer.head_dim}+{layer.v_head_dim}"
    return f"{heads} × {dims}"


def _window(config: Mapping[str, Any]) -> int | None:
    """The config's sliding window, as transformers keeps it: none where ``use_sliding_window`` is false (Qwen's
    configs carry a window they do not use) or the window is 0."""
    window = _count(config, "sliding_window")
    return None if config.get("use_sliding_window") is False else window


def layer_kinds(
    config: Mapping[str, Any], layers: int, model_type: str
) -> tuple[list[tuple[LayerKind, int | None]], str]:
    """Each layer's kind and window, and why the layout is not modelled ("" when it is): ``layer_types`` where the
    config lists them, else the family's rule, as transformers derives them and vLLM's model code reads them."""
    window = _window(config)
    chunk = _count(config, "attention_chunk_size")

    def of(kind: LayerKind) -> tuple[LayerKind, int | None]:
        if kind == "sliding":
            return ("sliding", window) if window is not None else ("full", None)
        if kind == "chunked":
            return ("chunked", chunk) if chunk is not None else ("full", None)
        return (kind, None)

    def alternate(period: int) -> list[tuple[LayerKind, int | None]]:  # full every ``period``-th layer
        return [of("sliding" if (i + 1) % period else "full") for i in range(layers)]

    raw_types = config.get("layer_types")
    if model_type == "gpt_oss":  # vLLM's gpt-oss: a window on every even layer, whatever layer_types says
        return [of("sliding" if i % 2 == 0 else "full") for i in range(layers)], ""
    if isinstance(raw_types, list) and raw_types:
        if len(raw_types) != layers:
            return [of("full")] * layers, f"layer_types lists {len(raw_types)} layers, not {layers}"
        unknown = sorted({str(t) for t in raw_types if t not in LAYER_TYPES})
        if unknown:
            return [of("full")] * layers, f"layer type(s) {', '.join(unknown)}"
        return [of(LAYER_TYPES[str(t)]) for t in raw_types], ""
    if model_type in ("gemma3_text", "gemma3"):
        return alternate(_count(config, "sliding_window_pattern", 6) or 6), ""
    if model_type == "cohere2":
        return alternate(_count(config, "sliding_window_pattern", 4) or 4), ""
    if model_type == "gemma2":
        return alternate(2), ""
    if model_type in ("llama4_text", "llama4"):
        interval = _count(config, "no_rope_layer_interval", 4) or 4
        no_rope = config.get("no_rope_layers")
        flags = no_rope if isinstance(no_rope, list) and len(no_rope) == layers else None
        # no_rope_layers[i] == 1: the layer uses RoPE, and chunked local attention; 0: a global (NoPE) layer
        uses_rope = [bool(f) for f in flags] if flags is not None else [(i + 1) % interval != 0 for i in range(layers)]
        return [of("chunked" if rope else "full") for rope in uses_rope], ""
    if model_type.startswith(("qwen2", "qwen3")) and model_type != "qwen3_next":
        bound = _whole(config, "max_window_layers", layers)
        return [of("sliding" if window is not None and i >= bound else "full") for i in range(layers)], ""
    if model_type == "qwen3_next":
        interval = _count(config, "full_attention_interval", 4) or 4
        return [of("full" if (i + 1) % interval == 0 else "state") for i in range(layers)], ""
    if model_type == "jamba":
        period, offset = _count(config, "attn_layer_period", 8) or 8, _whole(config, "attn_layer_offset", 4)
        return [of("full" if i % period == offset else "state") for i in range(layers)], ""
    if model_type == "nemotron_h":
        pattern = config.get("hybrid_override_pattern")
        if not isinstance(pattern, str) or len(pattern) != layers:
            return [of("full")] * layers, "nemotron_h without a hybrid_override_pattern of one character a layer"
        marks: Mapping[str, LayerKind] = {"*": "full", "M": "state", "-": "none", "E": "none"}
        if any(c not in marks for c in pattern):
            return [of("full")] * layers, f"hybrid_override_pattern {pattern!r}"
        return [of(marks[c]) for c in pattern], ""
    if model_type in STATE_MODEL_TYPES:
        return [of("full")] * layers, f"a {model_type} model's state layers (not placed here)"
    # Mistral, Mixtral, Phi-3 …: one window for every layer (vLLM's cache_config.sliding_window)
    return [of("sliding")] * layers, ""


@dataclass(frozen=True)
class KvPlan:
    """What an engine will make of one arm's KV budget, computed before it boots: the figures it will report
    (``KV cache size: N tokens``, its maximum concurrency at ``max_model_len``), the bytes one request of
    ``max_model_len`` takes, and how it got there. ``tokens`` None: this layout or setting is not modelled
    (``not_modelled`` says why) — the engine's reported figure is then the only one."""

    budget_bytes: int
    max_model_len: int
    layout: str
    tokens: int | None = None
    concurrency: float | None = None
    #: what one request of max_model_len takes (None: not modelled); below it, the budget is refused
    request_bytes: int | None = None
    #: one block's bytes: the engine also holds one block aside (vLLM 0.32's null block), so the smallest budget
    #: it accepts is ``request_bytes + block_bytes``
    block_bytes: int | None = None
    #: the engine's grouping in words (``6 groups of 3 layers, 16-token blocks of 48 KiB``)
    groups: str = ""
    #: the engine settings the figures rest on, and where each came from
    assumptions: str = ""
    not_modelled: str = ""
