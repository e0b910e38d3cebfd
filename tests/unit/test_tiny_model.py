"""Fast checks of the embedded tiny-qwen3 model folder (no vLLM boot).

The folder is written by ``fixtures/make_tiny_model.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

MODEL_DIR = Path(__file__).resolve().parents[2] / "pytest_kvcache" / "data" / "tiny-qwen3"

SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
]

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file from the workspace.",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}},
                "required": ["path"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "run_shell",
            "description": "Run a shell command.",
            "parameters": {
                "type": "object",
                "properties": {"cmd": {"type": "string"}, "timeout": {"type": "integer"}},
                "required": ["cmd"],
            },
        },
    },
]

MESSAGES = [
    {"role": "system", "content": "You are a careful coding agent."},
    {"role": "user", "content": "Look at setup.cfg, then list the tests."},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "read_file", "arguments": {"path": "setup.cfg"}},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "[metadata]\nname = demo\n"},
    {
        "role": "assistant",
        "content": "Now the tests.",
        "tool_calls": [
            {
                "id": "call_2",
                "type": "function",
                "function": {"name": "run_shell", "arguments": '{"cmd": "ls tests", "timeout": 5}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_2", "content": "test_a.py\ntest_b.py"},
]

GENERATION_PROMPT = "<|im_start|>assistant\n"


def _load_json(name: str) -> dict:
    return json.loads((MODEL_DIR / name).read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def config() -> dict:
    return _load_json("config.json")


@pytest.fixture(scope="module")
def tokenizer_config() -> dict:
    return _load_json("tokenizer_config.json")


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer.from_file(str(MODEL_DIR / "tokenizer.json"))


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # Same as transformers' chat-template `tojson` (no HTML escaping).
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _render(template: str, **kwargs) -> str:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = _tojson
    return env.from_string(template).render(**kwargs)


def test_files_present():
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        assert (MODEL_DIR / name).is_file(), name
    assert not list(MODEL_DIR.glob("*.safetensors")) and not list(MODEL_DIR.glob("*.bin"))


def test_vocab_size_matches_tokenizer(config, tokenizer):
    assert config["vocab_size"] == tokenizer.get_vocab_size(with_added_tokens=True)


def test_special_tokens(config, tokenizer, tokenizer_config):
    decoder = tokenizer_config["added_tokens_decoder"]
    for tok in SPECIAL_TOKENS:
        tid = tokenizer.token_to_id(tok)
        assert tid is not None, tok
        assert 0 <= tid < config["vocab_size"], tok
        assert decoder[str(tid)]["content"] == tok
        # each special token encodes as one piece
        assert tokenizer.encode(tok).ids == [tid]


def test_eos_bos_ids(config, tokenizer, tokenizer_config):
    assert config["eos_token_id"] == tokenizer.token_to_id("<|im_end|>")
    assert config["bos_token_id"] == tokenizer.token_to_id("<|endoftext|>")
    assert tokenizer_config["eos_token"] == "<|im_end|>"
    assert tokenizer_config["pad_token"] == "<|endoftext|>"
    gen = _load_json("generation_config.json")
    eos = gen["eos_token_id"]
    assert config["eos_token_id"] in (eos if isinstance(eos, list) else [eos])


def test_model_shape(config, tokenizer_config):
    assert config["architectures"] == ["Qwen3ForCausalLM"]
    assert config["model_type"] == "qwen3"
    assert config["max_position_embeddings"] >= 131072
    assert tokenizer_config["model_max_length"] >= 131072
    assert config["hidden_size"] == config["num_attention_heads"] * config["head_dim"]
    assert config["num_attention_heads"] % config["num_key_value_heads"] == 0


def test_generation_config_has_no_sampling_defaults():
    gen = _load_json("generation_config.json")
    for key in ("temperature", "top_p", "top_k", "repetition_penalty", "do_sample", "min_p"):
        assert key not in gen, key


def _check_rendered(text: str):
    assert text.startswith("<|im_start|>system\nYou are a careful coding agent.")
    assert "<tools>" in text and "</tools>" in text
    assert '"name": "read_file"' in text and '"name": "run_shell"' in text
    assert '<tool_call>\n{"name": "read_file", "arguments": {"path": "setup.cfg"}}\n</tool_call>' in text
    assert '<tool_call>\n{"name": "run_shell", "arguments": {"cmd": "ls tests", "timeout": 5}}\n</tool_call>' in text
    assert "<tool_response>\n[metadata]\nname = demo\n\n</tool_response>" in text
    assert "<tool_response>\ntest_a.py\ntest_b.py\n</tool_response>" in text
    assert "Now the tests." in text
    assert "None" not in text
    assert text.endswith("<|im_end|>\n" + GENERATION_PROMPT)


def test_chat_template_jinja(tokenizer_config, tokenizer, config):
    text = _render(tokenizer_config["chat_template"], messages=MESSAGES, tools=TOOLS, add_generation_prompt=True)
    _check_rendered(text)
    ids = tokenizer.encode(text).ids
    assert ids and max(ids) < config["vocab_size"]
    assert ids[-3:] == tokenizer.encode(GENERATION_PROMPT).ids[-3:]


def test_chat_template_plain_and_empty_content(tokenizer_config):
    template = tokenizer_config["chat_template"]
    msgs = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": ""},
        {"role": "user", "content": [{"type": "text", "text": "part one"}, {"type": "text", "text": " two"}]},
        {"role": "assistant", "content": None},
    ]
    text = _render(template, messages=msgs, add_generation_prompt=False)
    assert "<tools>" not in text and "system" not in text
    assert "<|im_start|>user\npart one two<|im_end|>\n" in text
    assert text.endswith("<|im_start|>assistant\n<|im_end|>\n")
    assert "None" not in text
    text = _render(template, messages=[{"role": "user", "content": "hi"}], tools=None, add_generation_prompt=True)
    assert text == "<|im_start|>user\nhi<|im_end|>\n" + GENERATION_PROMPT


def test_chat_template_transformers():
    transformers = pytest.importorskip("transformers")
    tok = transformers.AutoTokenizer.from_pretrained(str(MODEL_DIR))
    text = tok.apply_chat_template(MESSAGES, tools=TOOLS, add_generation_prompt=True, tokenize=False)
    _check_rendered(text)
    assert tok.eos_token == "<|im_end|>"
    assert len(tok) == _load_json("config.json")["vocab_size"]
