"""A model folder's metadata — ``config.json``, ``tokenizer_config.json``, ``generation_config.json`` — read and
checked by one reader.

Every place that reads one of these files reads it through :func:`read`: a file that is not JSON, not a JSON
object, or has a field the plugin (or the engine it starts) reads with the wrong type — ``num_hidden_layers`` a
string, ``head_dim`` a list, ``max_position_embeddings`` null — is a :class:`ModelFileError` (a usage error,
exit 4) naming the file and the field, never an ``AttributeError`` deep in the run. Fields the plugin does not
read are not checked: a model's config may hold anything else.

Plain Python: no pytest.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pytest_kvcache.config.constants import SettingsError

CONFIG = "config.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
GENERATION_CONFIG = "generation_config.json"
#: The metadata files checked when a model folder is given (each only when it is there).
FILES = (CONFIG, TOKENIZER_CONFIG, GENERATION_CONFIG)


class ModelFileError(SettingsError):
    """A model metadata file that cannot be read, is not a JSON object, or has a field of the wrong type."""


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _positive(value: Any) -> bool:
    return _whole(value) and value > 0


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _positives(value: Any) -> bool:  # one count, or one a layer
    return _positive(value) or (isinstance(value, list) and bool(value) and all(_positive(v) for v in value))


def _token_ids(value: Any) -> bool:
    return _whole(value) or (isinstance(value, list) and all(_whole(v) for v in value))


def _token(value: Any) -> bool:  # a token's text, an AddedToken's dict, or none
    return value is None or isinstance(value, str | dict)


def _template(value: Any) -> bool:  # one template, or named ones ([{"name": …, "template": …}])
    return isinstance(value, str) or (isinstance(value, list) and all(isinstance(v, dict) for v in value))


Check = tuple[Callable[[Any], bool], str]
POSITIVE: Check = (_positive, "a positive whole number")
WHOLE: Check = (_whole, "a whole number")
NUMBER: Check = (_number, "a number")
TEXT: Check = (lambda v: isinstance(v, str), "a string")
FLAG: Check = (lambda v: isinstance(v, bool), "true or false")
OBJECT: Check = (lambda v: isinstance(v, dict), "an object")
TOKEN_IDS: Check = (_token_ids, "a token id, a list of them")
TOKEN: Check = (_token, "a token (a string or an object)")


def or_null(check: Check) -> Check:
    """``check``, or JSON's null."""
    test, what = check
    return (lambda value: value is None or test(value)), f"{what} or null"


#: The fields read from each file (by the plugin: the context, the KV arithmetic, the GGUF writer; or by the
#: engine it starts: the generation defaults), and what each must be. ``text_config`` (a multimodal model's
#: language model) is checked against the same fields as ``config.json``.
FIELDS: Mapping[str, Mapping[str, Check]] = {
    CONFIG: {
        "model_type": TEXT,
        "num_hidden_layers": POSITIVE,
        "num_attention_heads": POSITIVE,
        "num_key_value_heads": (_positives, "a positive whole number"),  # or one a layer
        "hidden_size": POSITIVE,
        "head_dim": POSITIVE,
        "intermediate_size": POSITIVE,
        "vocab_size": POSITIVE,
        "max_position_embeddings": POSITIVE,
        "max_sequence_length": POSITIVE,
        "seq_length": POSITIVE,
        "n_positions": POSITIVE,
        "max_seq_len": POSITIVE,
        "torch_dtype": TEXT,
        "dtype": TEXT,
        "rope_theta": NUMBER,
        "rms_norm_eps": NUMBER,
        "bos_token_id": or_null(TOKEN_IDS),
        "eos_token_id": or_null(TOKEN_IDS),
        "kv_lora_rank": or_null(WHOLE),
        "q_lora_rank": or_null(WHOLE),
        "qk_rope_head_dim": or_null(WHOLE),
        "qk_nope_head_dim": or_null(WHOLE),
        "v_head_dim": or_null(WHOLE),
        "moe_intermediate_size": or_null(WHOLE),
        "shared_expert_intermediate_size": or_null(WHOLE),
        "tie_word_embeddings": FLAG,
        "use_mla": or_null(FLAG),
        "text_config": OBJECT,
        # the KV layout, layer by layer (config.kv_layout): which layers keep a window, a chunk, or a state
        "layer_types": (lambda v: isinstance(v, list) and all(isinstance(t, str) for t in v), "a list of strings"),
        "sliding_window": or_null(WHOLE),
        "sliding_window_pattern": POSITIVE,
        "use_sliding_window": FLAG,
        "max_window_layers": WHOLE,
        "attention_chunk_size": or_null(POSITIVE),
        "no_rope_layers": (lambda v: isinstance(v, list) and all(_whole(f) for f in v), "a list of whole numbers"),
        "no_rope_layer_interval": POSITIVE,
        "full_attention_interval": POSITIVE,
        "attn_layer_period": POSITIVE,
        "attn_layer_offset": WHOLE,
        "hybrid_override_pattern": TEXT,
        "num_kv_shared_layers": or_null(WHOLE),
        "global_head_dim": or_null(POSITIVE),
        "num_global_key_value_heads": or_null(POSITIVE),
        "attention_k_eq_v": or_null(FLAG),
        "index_topk": or_null(WHOLE),
        "block_configs": (lambda v: isinstance(v, list), "a list"),
    },
    TOKENIZER_CONFIG: {
        "bos_token": or_null(TOKEN),
        "eos_token": or_null(TOKEN),
        "pad_token": or_null(TOKEN),
        "add_bos_token": FLAG,
        "chat_template": (_template, "a template string or a list of named templates"),
        "model_max_length": NUMBER,
    },
    GENERATION_CONFIG: {
        "bos_token_id": or_null(TOKEN_IDS),
        "eos_token_id": or_null(TOKEN_IDS),
        "pad_token_id": or_null(TOKEN_IDS),
        "do_sample": FLAG,
        "temperature": NUMBER,
        "top_p": NUMBER,
        "top_k": WHOLE,
        "min_p": NUMBER,
        "repetition_penalty": NUMBER,
        "max_length": POSITIVE,
        "max_new_tokens": POSITIVE,
    },
}


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    return {
        bool: "a boolean",
        int: "a number",
        float: "a number",
        str: "a string",
        list: "a list",
        dict: "an object",
    }.get(type(value), type(value).__name__)


def validate(data: Any, path: Path, name: str | None = None) -> dict[str, Any]:
    """``data`` (a parsed ``name`` file, default ``path``'s name) as a dict, or :class:`ModelFileError` naming
    ``path`` and the first field of the wrong type."""
    fields = FIELDS.get(name or path.name, {})
    if not isinstance(data, dict):
        raise ModelFileError(f"{path}: expected a JSON object, got {_kind(data)}")

    def check(scope: Mapping[str, Any], prefix: str) -> None:
        for key, (ok, what) in fields.items():
            if key in scope and not ok(scope[key]):
                raise ModelFileError(f"{path}: {prefix}{key} must be {what}, got {json.dumps(scope[key])[:60]}")

    check(data, "")
    if isinstance(data.get("text_config"), dict):
        check(data["text_config"], "text_config.")
    return data


def read(folder: Path, name: str = CONFIG) -> dict[str, Any] | None:
    """``folder/name`` parsed and checked (:func:`validate`); None when there is no such file."""
    path = folder / name
    if not path.is_file():
        return None
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ModelFileError(f"{path}: cannot read it: {exc}") from None
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ModelFileError(f"{path}: not valid JSON: {exc}") from None
    return validate(data, path, name)


def check_folder(folder: Path, names: tuple[str, ...] = FILES) -> None:
    """Every metadata file of ``folder`` that is there, checked; :class:`ModelFileError` names the first bad one."""
    for name in names:
        read(folder, name)


#: Keys naming a mixture of experts' routed expert count (by model family) and its shared experts.
EXPERT_KEYS = ("num_experts", "n_routed_experts", "num_local_experts")
SHARED_EXPERT_KEYS = ("n_shared_experts", "num_shared_experts")


def parameters(data: Mapping[str, Any]) -> int | None:
    """An estimate of a model's parameter count from its ``config.json`` contents (``text_config`` for a
    multimodal model): embeddings (twice unless tied) plus, per layer, the attention projections — grouped-query,
    or multi-head latent (``kv_lora_rank``) — and a gated MLP, or every routed and shared expert of a mixture. Norms
    and biases are left out (well under 1%). None when a figure it needs is missing: the model's size is not
    known here. Within a few percent of the published count for dense models (Qwen3-8B's config: 8.19B; SmolLM2-135M:
    134.5M); it only places a model in a size class (``report.bands``)."""
    inner = data.get("text_config")
    config = inner if isinstance(inner, Mapping) else data

    def whole(key: str, default: int | None = None) -> int | None:
        value = config.get(key)
        return value if _positive(value) else default

    keys = ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size")
    hidden, layers, heads, vocab = (whole(k) for k in keys)
    if hidden is None or layers is None or heads is None or vocab is None:
        return None
    head_dim = whole("head_dim", hidden // heads)
    kv_heads = whole("num_key_value_heads", heads)
    assert head_dim is not None and kv_heads is not None
    latent = whole("kv_lora_rank")
    if latent is not None:  # MLA: Q (through its own low rank when given), the latent KV and its up-projection, O
        rope, nope = whole("qk_rope_head_dim", 0), whole("qk_nope_head_dim", head_dim)
        v_dim = whole("v_head_dim", head_dim)
        assert rope is not None and nope is not None and v_dim is not None
        q_rank = whole("q_lora_rank")
        q = hidden * heads * (nope + rope) if q_rank is None else q_rank * (hidden + heads * (nope + rope))
        attention = q + hidden * (latent + rope) + latent * heads * (nope + v_dim) + heads * v_dim * hidden
    else:
        attention = 2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim
    experts = next((v for k in EXPERT_KEYS if (v := whole(k)) is not None), None)
    dense = whole("intermediate_size")
    if experts is not None:
        width = whole("moe_intermediate_size", dense)
        if width is None:
            return None
        shared = next((v for k in SHARED_EXPERT_KEYS if (v := whole(k)) is not None), 0)
        shared_width = whole("shared_expert_intermediate_size", 0)  # one shared expert of its own width
        assert shared is not None and shared_width is not None
        mlp = 3 * hidden * (width * (experts + shared) + shared_width) + hidden * experts  # experts and the router
    elif dense is not None:
        mlp = 3 * hidden * dense
    else:
        return None
    tied = config.get("tie_word_embeddings", data.get("tie_word_embeddings", False)) is True
    return layers * (attention + mlp) + vocab * hidden * (1 if tied else 2)
