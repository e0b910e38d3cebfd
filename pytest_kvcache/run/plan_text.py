"""The boot plan's lines as the terminal shows them before anything boots: each boot's KV budget against what
the engine kind's arithmetic plans for it, the KV planned for arms without a budget, and the capacity probe's setup.
Plain Python over the settings and the plan."""

from __future__ import annotations

from collections.abc import Sequence

from pytest_kvcache.config.budget import fmt_bytes
from pytest_kvcache.config.resolve import arm_need
from pytest_kvcache.config.settings import Settings
from pytest_kvcache.model.evidence import PlanEntry


def budget_text(settings: Settings, entry: PlanEntry) -> str:
    """``, KV budget 32 MiB (16,384 tokens at 2,048 B/token; max_model_len 8,192), concurrency 2.00x planned`` for a
    boot with a budget: the tokens and concurrency the engine kind's arithmetic plans (``kv_plan``, vLLM's groups
    and windows), or why it plans none."""
    budget = entry.get("kv_cache_bytes")
    if budget is None:
        return ""
    arm = next((a for a in settings.arms if a.name == entry.get("arm")), None)
    found = arm_need(settings, arm) if arm is not None else None
    plan = entry.get("kv_plan") or {}
    if found is None:
        return f", KV budget {fmt_bytes(budget)}"
    if plan.get("not_modelled"):
        return (
            f", KV budget {fmt_bytes(budget)} (KV tokens not modelled: {plan['not_modelled']}; the engine's figure is "
            "used)"
        )
    tokens, concurrency = plan.get("tokens"), plan.get("concurrency")
    if tokens is None or concurrency is None:
        return (
            f", KV budget {fmt_bytes(budget)} ({int(budget // found.bytes_per_token):,} tokens at "
            f"{found.bytes_per_token:,.0f} B/token; max_model_len {found.max_model_len:,})"
        )
    windowed = found.shape is not None and any(layer.window for layer in found.shape.attention)
    if windowed:
        return (
            f", KV budget {fmt_bytes(budget)} ({tokens:,} tokens planned: {plan.get('groups')}; max_model_len "
            f"{found.max_model_len:,}), concurrency {concurrency:.2f}x planned"
        )
    return (
        f", KV budget {fmt_bytes(budget)} ({tokens:,} tokens at {found.bytes_per_token:,.0f} B/token; max_model_len "
        f"{found.max_model_len:,}), concurrency {concurrency:.2f}x planned"
    )


def kv_plan_lines(plan: Sequence[PlanEntry]) -> list[str]:
    """The KV cache planned for arms without a budget of the plugin's (the CPU build's ``VLLM_CPU_KVCACHE_SPACE``),
    one line per arm: ``KV planned for auto in 2 GiB of KV (VLLM_CPU_KVCACHE_SPACE): 1,048,576 tokens, concurrency
    8.00x at max_model_len 131,072``."""
    lines: dict[str, str] = {}
    for entry in plan:
        kv = entry.get("kv_plan")
        if not kv or entry.get("kv_cache_bytes") is not None or str(entry.get("arm")) in lines:
            continue
        where = f"{fmt_bytes(kv.get('budget_bytes') or 0)} of KV (VLLM_CPU_KVCACHE_SPACE)"
        if kv.get("tokens") is None:
            text = f"not modelled ({kv.get('not_modelled')}); the engine's figure is used"
        else:
            text = (
                f"{kv['tokens']:,} tokens, concurrency {kv.get('concurrency') or 0:.2f}x at max_model_len "
                f"{kv.get('max_model_len') or 0:,}"
            )
        lines[str(entry.get("arm"))] = f"  KV planned for {entry.get('arm')} in {where}: {text}"
    return list(lines.values())
