"""The embedded tiny model as a GGUF file for llama.cpp: the same Qwen3 shape and tokenizer, seeded random
weights (normal, std 0.05; RMSNorm weights 1), written with the ``gguf`` package.

Nothing is downloaded: the config, the byte-level BPE tokenizer and the chat template come from
``pytest_kvcache/data/tiny-qwen3``. The same seed writes the same file; it is cached by a hash of its
inputs (``~/.cache/pytest-kvcache/gguf/``), so only the first llama.cpp run of a machine spends the
second it takes to write.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from pytest_kvcache.config.model_files import CONFIG, TOKENIZER_CONFIG, ModelFileError, read

#: Bump when the writer changes what it writes for the same inputs.
WRITER_VERSION = "1"
DEFAULT_STD = 0.05
#: gguf token types (``gguf.TokenType``): normal and control.
TOKEN_NORMAL, TOKEN_CONTROL = 1, 3


class GgufError(RuntimeError):
    """The GGUF could not be written (no ``gguf`` package, or an unexpected source model)."""


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path("~/.cache").expanduser())
    return Path(base) / "pytest-kvcache" / "gguf"


def _inputs_hash(model_dir: Path, seed: int, std: float) -> str:
    digest = hashlib.sha256(f"{WRITER_VERSION}:{seed}:{std}".encode())
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        digest.update((model_dir / name).read_bytes())
    return digest.hexdigest()[:16]


def tiny_gguf(model_dir: Path, *, seed: int = 0, std: float = DEFAULT_STD, root: Path | None = None) -> Path:
    """The cached GGUF of ``model_dir`` (a Qwen3-shaped folder without weights), written when missing."""
    out = (root or cache_dir()) / f"{model_dir.name}-seed{seed}-{_inputs_hash(model_dir, seed, std)}.gguf"
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(f"{out.name}.{os.getpid()}.partial")
    try:
        write_gguf(model_dir, partial, seed=seed, std=std)
        partial.replace(out)  # atomic: another run never reads a half-written file
    finally:
        partial.unlink(missing_ok=True)
    return out


def write_gguf(model_dir: Path, out: Path, *, seed: int = 0, std: float = DEFAULT_STD) -> None:
    try:
        import gguf
        import numpy as np
    except ImportError as exc:
        raise GgufError(
            f"writing the embedded model as GGUF needs the 'gguf' package ({exc}); "
            "pip install 'pytest-kvcache[llamacpp]'"
        ) from None

    try:  # the one checked reader of a model's metadata (config/model_files.py)
        config: dict[str, Any] = read(model_dir, CONFIG) or {}
        tok_config: dict[str, Any] = read(model_dir, TOKENIZER_CONFIG) or {}
    except ModelFileError as exc:
        raise GgufError(str(exc)) from None
    tok: dict[str, Any] = json.loads((model_dir / "tokenizer.json").read_text())
    if config.get("model_type") != "qwen3" or tok.get("model", {}).get("type") != "BPE":
        raise GgufError(f"{model_dir}: only a Qwen3-shaped model with a BPE tokenizer can be written as GGUF here")

    arch = "qwen3"
    hidden, layers = int(config["hidden_size"]), int(config["num_hidden_layers"])
    heads, kv_heads = int(config["num_attention_heads"]), int(config["num_key_value_heads"])
    head_dim, ffn = int(config["head_dim"]), int(config["intermediate_size"])
    vocab_size = int(config["vocab_size"])

    writer = gguf.GGUFWriter(str(out), arch)
    writer.add_name(f"{model_dir.name} (seeded random weights, seed {seed}, std {std})")
    writer.add_context_length(int(config.get("max_position_embeddings", 32768)))
    writer.add_embedding_length(hidden)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_freq_base(float(config.get("rope_theta", 1_000_000)))
    writer.add_layer_norm_rms_eps(float(config.get("rms_norm_eps", 1e-6)))
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)

    # tokenizer: byte-level BPE (llama.cpp's "gpt2" model with the GPT-2 pre-tokenizer regex)
    vocab: dict[str, int] = dict(tok["model"]["vocab"])
    added = {int(a["id"]): a["content"] for a in tok.get("added_tokens", [])}
    for token_id, content in added.items():
        vocab[content] = token_id
    by_id = {i: t for t, i in vocab.items()}
    tokens = [by_id.get(i, f"[PAD{i}]") for i in range(vocab_size)]
    types = [TOKEN_CONTROL if i in added or i not in by_id else TOKEN_NORMAL for i in range(vocab_size)]
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"].get("merges", [])]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    eos = tok_config.get("eos_token")
    if isinstance(eos, str) and eos in vocab:
        writer.add_eos_token_id(vocab[eos])
    bos_id = config.get("bos_token_id")
    if isinstance(bos_id, int):
        writer.add_bos_token_id(bos_id)
    pad = tok_config.get("pad_token")
    if isinstance(pad, str) and pad in vocab:
        writer.add_pad_token_id(vocab[pad])
    writer.add_add_bos_token(bool(tok_config.get("add_bos_token", False)))
    if isinstance(tok_config.get("chat_template"), str):
        writer.add_chat_template(tok_config["chat_template"])

    rng = np.random.default_rng(seed)

    def normal(*shape: int) -> Any:
        return (rng.standard_normal(shape, dtype=np.float32) * std).astype(np.float16)

    def ones(n: int) -> Any:
        return np.ones(n, dtype=np.float32)

    writer.add_tensor("token_embd.weight", normal(vocab_size, hidden))
    for i in range(layers):
        blk = f"blk.{i}"
        writer.add_tensor(f"{blk}.attn_norm.weight", ones(hidden))
        writer.add_tensor(f"{blk}.attn_q.weight", normal(heads * head_dim, hidden))
        writer.add_tensor(f"{blk}.attn_k.weight", normal(kv_heads * head_dim, hidden))
        writer.add_tensor(f"{blk}.attn_v.weight", normal(kv_heads * head_dim, hidden))
        writer.add_tensor(f"{blk}.attn_output.weight", normal(hidden, heads * head_dim))
        writer.add_tensor(f"{blk}.attn_q_norm.weight", ones(head_dim))
        writer.add_tensor(f"{blk}.attn_k_norm.weight", ones(head_dim))
        writer.add_tensor(f"{blk}.ffn_norm.weight", ones(hidden))
        writer.add_tensor(f"{blk}.ffn_gate.weight", normal(ffn, hidden))
        writer.add_tensor(f"{blk}.ffn_up.weight", normal(ffn, hidden))
        writer.add_tensor(f"{blk}.ffn_down.weight", normal(hidden, ffn))
    writer.add_tensor("output_norm.weight", ones(hidden))
    if not config.get("tie_word_embeddings", True):
        writer.add_tensor("output.weight", normal(vocab_size, hidden))

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
