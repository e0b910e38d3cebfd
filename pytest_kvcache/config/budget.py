"""The KV budget: the bytes of KV cache each vLLM arm gets (``--kv-cache-bytes``, vLLM's
``--kv-cache-memory-bytes``), and the rule that a budget holds at least one request of ``max_model_len``
tokens — computed from the model's ``config.json`` (its layout, layer by layer: ``config.kv_layout``), the arm's
KV dtype and the engine's own arithmetic (``Kind.kv_plan``: vLLM's groups, blocks and windows).

With one budget for every arm, a capacity difference between arms comes from their KV dtype, not from how
much memory each engine grabbed. An arm may carry its own ``--kv-cache-memory-bytes`` in its args (a named
arm), which then is its budget. Plain Python: no pytest; settings call :func:`check` before anything boots.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pytest_kvcache.config import model_files
from pytest_kvcache.config.kv_layout import DTYPE_BYTES, KvLayout, KvPlan

SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(KiB|MiB|GiB|TiB|[kKmMgGtT])?\s*[bB]?\s*$")
_UNITS = {
    "k": 10**3,
    "m": 10**6,
    "g": 10**9,
    "t": 10**12,
    "K": 2**10,
    "M": 2**20,
    "G": 2**30,
    "T": 2**40,
    "KiB": 2**10,
    "MiB": 2**20,
    "GiB": 2**30,
    "TiB": 2**40,
}


def parse_bytes(raw: str) -> int:
    """``32MiB``, ``32M`` (binary, as vLLM reads ``32M``), ``32m`` (decimal), ``1.5GiB``, ``33554432`` → bytes.
    ValueError naming the input."""
    m = SIZE.match(str(raw))
    if not m:
        raise ValueError(f"expected a size like 512MiB, 2GiB, 2G or a number of bytes; got {raw!r}")
    value = float(m.group(1)) * _UNITS.get(m.group(2) or "", 1)
    if value < 1:
        raise ValueError(f"a size must be at least one byte; got {raw!r}")
    return int(value)


def parse_count(raw: str) -> int | None:
    """vLLM's ``--max-model-len`` value: ``8192``, ``8k`` (decimal), ``8K`` (binary); None for ``auto``/-1."""
    text = str(raw).strip()
    if text in ("auto", "-1"):
        return None
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgG]?)", text)
    if not m:
        raise ValueError(f"cannot read {raw!r} as a token count")
    return int(float(m.group(1)) * _UNITS.get(m.group(2) or "", 1))


def fmt_bytes(n: float) -> str:
    """``33554432`` → ``32 MiB``."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.4g} {unit}"
    return f"{n:.0f} B"


def flag_value(args: Sequence[str], *flags: str) -> str | None:
    """The value of the last ``FLAG VALUE`` / ``FLAG=VALUE`` in ``args`` for any of ``flags`` (aliases of one
    option), as the engine's parser sees it (None: absent). The one reader of a flag's value in engine args."""
    found = None
    for i, word in enumerate(args):
        for flag in flags:
            if word == flag and i + 1 < len(args):
                found = args[i + 1]
            elif word.startswith(flag + "="):
                found = word.split("=", 1)[1]
    return found


def arm_budget(
    engine_args: Sequence[str], arm_args: Sequence[str], cache_bytes: int | None, flag: str | None
) -> int | None:
    """An arm's KV budget in bytes: its own budget ``flag`` (the engine kind's: vLLM's ``--kv-cache-memory-bytes``;
    arm args, then ``--kv-engine-args``: the later wins in vLLM's parser), else ``--kv-cache-bytes``; None: the
    engine sizes its KV cache itself."""
    raw = flag_value([*engine_args, *arm_args], flag) if flag is not None else None
    if raw is not None:
        try:
            return parse_bytes(raw)
        except ValueError:
            return None  # vLLM reads it (or refuses it) itself
    return cache_bytes


def model_shape(folder: Path) -> KvLayout | None:
    """The KV layout of a model folder's ``config.json`` (read by the one checked reader, ``config.model_files``);
    None when there is no such file or it lacks a figure the arithmetic needs."""
    data = model_files.read(folder)
    return KvLayout.from_config(data) if data is not None else None


def element_bytes(kv_dtype: str | None, model_bytes: float, head_dim: int) -> float | None:
    """Bytes a KV element takes at ``kv_dtype`` (None / ``auto``: the model's own; per-token-head quantized
    kinds add their fp32 scale per head); None for a kind whose layout is not modelled here."""
    dtype = kv_dtype or "auto"
    if dtype == "auto":
        return model_bytes
    if dtype in ("float16", "bfloat16", "f16", "bf16"):
        return 2.0
    if dtype in ("fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "q8_0"):
        return 1.0
    if dtype in ("int8_per_token_head", "fp8_per_token_head"):
        return 1.0 + 4.0 / head_dim
    if dtype == "int4_per_token_head":
        return 0.5 + 4.0 / head_dim
    if dtype in ("nvfp4", "nvfp4_4over6"):
        return 0.5 + 1.0 / 16
    return None


@dataclass(frozen=True)
class Need:
    """What an arm's KV holds per token: ``bytes_per_token`` over every layer that keeps KV (as if each kept every
    token: full attention's figure), at ``element`` bytes a K/V element, for ``max_model_len`` tokens; and the
    figures behind it (the model's layout, the weights dtype it is served in, the KV dtype, the engine arguments
    an engine kind's own arithmetic reads — ``Kind.kv_plan``)."""

    max_model_len: int
    bytes_per_token: float
    shape: KvLayout | None = None
    served_dtype: str = ""
    model: str = ""
    element: float = 0.0
    kv_dtype: str | None = None
    args: tuple[str, ...] = ()

    @property
    def bytes(self) -> int:
        """``max_model_len`` tokens at ``bytes_per_token``: one request's KV when every layer is full attention."""
        return int(self.max_model_len * self.bytes_per_token + 0.5)

    def basis(self, kv_dtype: str | None) -> str:
        """``auto KV on float32 weights; SmolLM2-135M-Instruct: 30 layers × 3 KV heads × 64``."""
        text = f"{kv_dtype or 'auto'} KV"
        if self.served_dtype and (kv_dtype or "auto") == "auto":
            text += f" on {self.served_dtype} weights"
        shape = self.shape.describe() if self.shape is not None else ""
        return "; ".join(
            p for p in (text, " ".join(p for p in (f"{self.model}:" if self.model else "", shape) if p)) if p
        )


def need(
    shape: KvLayout | None,
    kv_dtype: str | None,
    engine_args: Sequence[str],
    arm_args: Sequence[str],
    *,
    served_dtype: str | None = None,
    model: str = "",
) -> Need | None:
    """What one request of the arm's ``max_model_len`` holds per token, from the model's layout. The weights dtype
    is ``--dtype`` in the arguments, else ``served_dtype`` (what the plugin passes itself: the embedded trained
    model's), else the config's; ``--max-model-len`` in the arguments overrides the config's context. None when it
    cannot be computed here (a KV dtype whose layout is not modelled, no context)."""
    if shape is None:
        return None
    args = [*engine_args, *arm_args]
    dtype = flag_value(args, "--dtype")
    if dtype is None or dtype == "auto":
        dtype = served_dtype or shape.dtype
    model_bytes = DTYPE_BYTES.get(dtype, shape.model_bytes)
    per_element = element_bytes(kv_dtype, model_bytes, shape.head_dim)
    try:
        raw = flag_value(args, "--max-model-len")
        length = parse_count(raw) if raw is not None else None
    except ValueError:
        return None
    length = length or shape.max_position
    if per_element is None or length is None:
        return None
    return Need(
        max_model_len=length,
        bytes_per_token=shape.bytes_per_token(per_element),
        shape=shape,
        served_dtype=dtype,
        model=model,
        element=per_element,
        kv_dtype=kv_dtype,
        args=tuple(args),
    )


def refusal(arm: str, budget: int, found: Need, kv_dtype: str | None, plan: KvPlan | None = None) -> str | None:
    """Why ``budget`` cannot serve ``arm`` (a usage error's text), or None when one request of ``max_model_len``
    fits. With the engine's ``plan`` (its own arithmetic: blocks, windows), the plan decides: refused below one
    request's blocks, and the smallest budget named is one block more (vLLM 0.32 holds a null block aside; a budget
    in between is left to the engine, which may refuse it itself). Without a plan, only a layout of full attention
    throughout is judged (at ``bytes_per_token``). A layout or setting the arithmetic does not model is never
    refused: the engine decides for itself."""
    if plan is not None:
        if plan.request_bytes is None or plan.tokens is None or budget >= plan.request_bytes:
            return None
        smallest = plan.request_bytes + (plan.block_bytes or 0)  # the engine holds one block aside
    elif found.shape is not None and found.shape.all_full:
        if budget >= found.bytes:
            return None
        smallest = found.bytes
    else:
        return None
    windowed = found.shape is not None and any(layer.window for layer in found.shape.attention)
    if windowed and plan is not None and plan.tokens is not None:
        holds = (
            f"holds {plan.tokens:,} tokens ({found.basis(kv_dtype)}; vLLM keeps a window's worth a request in the "
            f"windowed layers: {plan.groups})"
        )
    else:
        holds = (
            f"holds {int(budget // found.bytes_per_token):,} tokens at {found.bytes_per_token:,g} bytes a token "
            f"({found.basis(kv_dtype)})"
        )
    return (
        f"arm {arm}: a KV budget of {fmt_bytes(budget)} {holds}, fewer than max_model_len {found.max_model_len:,}: "
        f"give at least {fmt_bytes(smallest)} ({smallest} bytes), or a smaller --max-model-len in --kv-engine-args"
    )
