"""The built-in kinds of server an arm can be (``--kv-engine``) and llama.cpp's KV cache types: plain data,
read by the settings and by ``engines/kinds/``. Each kind is a registered module there (``engines.kinds``),
and ``--kv-engine`` takes any registered kind's name."""

from __future__ import annotations

from collections.abc import Mapping

#: A registered kind's name (``engines.kinds.kind_names()`` lists them).
EngineKind = str
#: The kinds the package ships (``engines/kinds/``); others register their own.
ENGINE_KINDS: tuple[EngineKind, ...] = ("vllm", "llamacpp", "openai")

#: llama-server's ``--cache-type-k/-v`` values (``common/arg.cpp``: kv_cache_types).
LLAMACPP_CACHE_TYPES: tuple[str, ...] = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")
#: Short names users type for llama.cpp arms.
LLAMACPP_ALIASES: Mapping[str, str] = {
    "auto": "f16",  # llama-server's default cache type
    "fp16": "f16",
    "float16": "f16",
    "fp32": "f32",
    "float32": "f32",
    "bfloat16": "bf16",
    "q8": "q8_0",
    "int8": "q8_0",
    "q4": "q4_0",
    "int4": "q4_0",
}
