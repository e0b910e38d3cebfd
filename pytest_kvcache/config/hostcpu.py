"""What this host's CPU can do for vLLM's CPU build (read from /proc/cpuinfo, Linux x86)."""

from __future__ import annotations

from pathlib import Path

#: vLLM's CPU attention backend serves an FP8 KV cache only with one of these (``cpu_attn.py``).
FP8_KV_FLAGS = ("avx512f", "amx_tile")


def cpu_flags(cpuinfo: str | None = None) -> tuple[str, set[str]]:
    """(model name, flags) of the first CPU; empty when unknown (not Linux)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return "", set()
    model, flags = "", set[str]()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and not model:
            model = value.strip()
        elif key == "flags" and not flags:
            flags = set(value.split())
    return model, flags


def fp8_kv_unsupported_reason(cpuinfo: str | None = None) -> str | None:
    """Why vLLM's CPU build cannot serve an FP8 KV cache here, or None when it can (or we cannot tell)."""
    model, flags = cpu_flags(cpuinfo)
    if not flags or any(f in flags for f in FP8_KV_FLAGS):
        return None
    simd = sorted(f for f in flags if f.startswith(("avx", "sse4")))
    return (
        f"vLLM's CPU build serves an FP8 KV cache only on x86 CPUs with AVX-512 or AMX; this CPU "
        f"({model or 'unknown'}) has {', '.join(simd) or 'neither'}"
    )
