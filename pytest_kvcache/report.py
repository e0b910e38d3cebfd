"""Tables from records and evidence (pandas). Reads records; never talks to a server."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pandas as pd

from pytest_kvcache import analysis
from pytest_kvcache.engines.evidence import kv_capacity_tokens, resolved_cache_dtype
from pytest_kvcache.stats import SUMMARY_FIELDS, describe

SHORT_METRICS = ("wall_tps", "decode_tps", "ttft_s")
PREFILL_METRICS = ("ttft_s", "prefill_tps", "engine_prefill_s", "prompt_tokens")


def measured_frame(records: Iterable[Mapping[str, Any]]) -> pd.DataFrame:
    """``analysis.frame`` (one row per measured request) with the axis point named ``shape``."""
    return analysis.frame(list(records)).rename(columns={"point": "shape"})


def summary_table(
    records: Iterable[Mapping[str, Any]], arm_order: list[str], metrics: tuple[str, ...] = SHORT_METRICS
) -> pd.DataFrame:
    """n, mean, median, std, CV, min, max per probe × shape × metric × arm, over valid measured samples."""
    frame = measured_frame(records)
    columns = ["probe", "shape", "metric", "arm", *SUMMARY_FIELDS, "excluded", "flagged"]
    if frame.empty:
        return pd.DataFrame(columns=columns)
    rows = []
    order = {name: i for i, name in enumerate(arm_order)}
    for (probe, shape, arm), group in frame.groupby(["probe", "shape", "arm"], sort=False, dropna=False):
        group = group.dropna(axis=1, how="all")
        valid = group[group["valid"]]
        for metric in metrics:
            if metric not in group:
                continue
            stats = describe(valid[metric].tolist())
            rows.append(
                {
                    "probe": probe,
                    "shape": shape,
                    "metric": metric,
                    "arm": arm,
                    **stats,
                    "excluded": int((~group["valid"]).sum()),
                    "flagged": int(group["flagged"].sum()),
                }
            )
    table = pd.DataFrame(rows, columns=columns)
    table["_arm"] = table["arm"].map(lambda a: order.get(a, len(order)))
    table = table.sort_values(["probe", "shape", "metric", "_arm"], kind="stable").drop(columns="_arm")
    return table.reset_index(drop=True)


def format_summary(table: pd.DataFrame) -> list[str]:
    if table.empty:
        return ["(no measured samples)"]
    shown = table.copy()
    for col in ("mean", "median", "std", "min", "max"):
        shown[col] = [_fmt(v, m) for v, m in zip(shown[col], shown["metric"], strict=True)]
    shown["cv_pct"] = [f"{v:.1f}%" if v is not None and v == v else "-" for v in shown["cv_pct"]]
    return shown.to_string(index=False).splitlines()


def _fmt(value: Any, metric: str) -> str:
    if value is None or value != value:
        return "-"
    if metric.endswith("_s"):
        return f"{value:.3f}s" if abs(value) >= 1 else f"{value * 1000:.1f}ms"
    return f"{value:.2f}"


def evidence_lines(boot_id: str, evidence: Mapping[str, Any]) -> list[str]:
    """A compact, human reading of one boot's evidence."""
    if evidence.get("status") == "failed":
        return [f"{boot_id}: FAILED — {evidence.get('error', '').splitlines()[0] if evidence.get('error') else '?'}"]
    cache = evidence.get("cache_config") or {}
    log = evidence.get("log") or {}
    ready = evidence.get("ready_s")
    declared = evidence.get("declared_kv_cache_dtype") or "auto"
    parts = [
        f"declared {declared} → cache_dtype={resolved_cache_dtype(dict(evidence))}",
        f"kv_cache_size_tokens={kv_capacity_tokens(dict(evidence))}",
        f"block_size={cache.get('block_size', '?')}",
        f"prefix_caching={cache.get('enable_prefix_caching', '?')}",
        f"vLLM {evidence.get('engine_version') or log.get('engine_version') or '?'}",
        f"max_model_len={evidence.get('max_model_len')}",
        f"attention={log.get('attention_backend', 'not logged')}",
    ]
    if ready is not None:
        parts.append(f"ready in {ready:.1f} s")
    lines = [f"{boot_id}: " + ", ".join(parts)]
    for warning in evidence.get("warnings", []):
        lines.append(f"{boot_id}: warning: {warning}")
    return lines


def agentic_turns(records: Iterable[Mapping[str, Any]], arm_order: list[str]) -> pd.DataFrame:
    """Per arm and turn, means across sessions of prompt/cached tokens, ttft_s and decode_tps."""
    frame = measured_frame(r for r in records if r.get("probe") == "agentic")
    if frame.empty:
        return pd.DataFrame()
    valid = frame[frame["valid"]]
    table = (
        valid.groupby(["arm", "turn"])
        .agg(
            sessions=("session", "nunique"),
            prompt_tokens=("prompt_tokens", "mean"),
            cached_tokens=("cached_tokens", "mean"),
            ttft_s=("ttft_s", "mean"),
            ttft_s_std=("ttft_s", "std"),
            decode_tps=("decode_tps", "mean"),
        )
        .reset_index()
    )
    order = {name: i for i, name in enumerate(arm_order)}
    table["_arm"] = table["arm"].map(lambda a: order.get(a, len(order)))
    return table.sort_values(["_arm", "turn"]).drop(columns="_arm").reset_index(drop=True)


def agentic_lines(records: Sequence[Mapping[str, Any]], arm_order: list[str]) -> list[str]:
    """The per-turn table (one column pair per arm) and each arm's TTFT-growth verdict."""
    from pytest_kvcache.probes.agentic import growth_verdict

    table = agentic_turns(records, arm_order)
    if table.empty:
        return ["(no valid agentic turns)"]
    arms = [a for a in arm_order if a in set(table["arm"])]
    wide = table.pivot(index="turn", columns="arm", values=["prompt_tokens", "ttft_s", "decode_tps"])
    rows = []
    for turn in wide.index:
        row: dict[str, Any] = {"turn": int(turn), "prompt_tokens": f"{wide['prompt_tokens'].loc[turn].mean():,.0f}"}
        for arm in arms:
            row[f"{arm} ttft"] = _fmt(wide["ttft_s"].loc[turn].get(arm), "ttft_s")
            row[f"{arm} decode_tps"] = _fmt(wide["decode_tps"].loc[turn].get(arm), "decode_tps")
        rows.append(row)
    lines = pd.DataFrame(rows).to_string(index=False).splitlines()
    for arm in arms:
        sub = table[table["arm"] == arm]
        verdict = growth_verdict(
            dict(zip(sub["turn"], sub["ttft_s"], strict=True)),
            dict(zip(sub["turn"], sub["prompt_tokens"], strict=True)),
        )
        if "ttft_growth" in verdict:
            lines.append(
                f"{arm}: TTFT grew {verdict['ttft_growth']:.1f}× while context grew {verdict['context_growth']:.1f}× "
                f"(turn 2 → {verdict['last_turn']}): {verdict['verdict']}"
            )
            for turn, note in verdict["flags"].items():
                lines.append(f"{arm}: turn {turn}: {note}")
        else:
            lines.append(f"{arm}: {verdict['verdict']} for a growth verdict")
    return lines


def spec_decode_lines(records: Sequence[Mapping[str, Any]], arm_order: list[str]) -> list[str]:
    """Speculative-decoding acceptance per arm and probe from /metrics deltas, or "not enabled"."""
    lines = []
    for arm in arm_order:
        for probe in sorted({str(r.get("probe")) for r in records if r.get("arm") == arm}):
            engines = [
                r.get("engine") or {}
                for r in records
                if r.get("arm") == arm and r.get("probe") == probe and r.get("phase") == "measured"
            ]
            drafted = sum(e.get("spec_draft_tokens", 0) for e in engines)
            accepted = sum(e.get("spec_accepted_tokens", 0) for e in engines)
            if not any("spec_draft_tokens" in e for e in engines) or drafted == 0:
                continue
            lines.append(f"{arm} {probe}: {accepted}/{drafted} draft tokens accepted ({100 * accepted / drafted:.1f}%)")
    return lines or ["not enabled (no vllm:spec_decode_* counters moved)"]


def gpu_lines(boot_id: str, evidence: Mapping[str, Any]) -> list[str]:
    """Per-card power caps before/after, VRAM when ready, and what changed — or "no GPU"."""
    before, after = evidence.get("gpu_before") or {}, evidence.get("gpu_after") or {}
    if not before:
        return []
    if not before.get("gpu"):
        return [f"{boot_id}: GPU: none recorded ({before.get('reason', 'no GPU')})"]
    lines = []
    after_cards = {c.get("uuid"): c for c in after.get("cards") or []}
    vram = evidence.get("vram_ready_mib") or {}
    for card in before.get("cards") or []:
        uuid = card.get("uuid")
        post = after_cards.get(uuid, {})
        lines.append(
            f"{boot_id}: GPU {card.get('index')} {card.get('name')} ({str(uuid)[:12]}): power cap "
            f"{card.get('power_limit_w')} W before / {post.get('power_limit_w', '?')} W after, "
            f"VRAM {vram.get(uuid, '?')} MiB when ready, {card.get('temp_c')}→{post.get('temp_c', '?')} °C"
        )
    lines += [f"{boot_id}: GPU change: {change}" for change in evidence.get("gpu_changes") or []]
    return lines
