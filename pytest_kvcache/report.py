"""Tables from records and evidence (pandas). Reads records; never talks to a server."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import pandas as pd

from pytest_kvcache.engines.evidence import kv_capacity_tokens, resolved_cache_dtype
from pytest_kvcache.stats import SUMMARY_FIELDS, describe

SHORT_METRICS = ("wall_tps", "decode_tps", "ttft_s")


def measured_frame(records: Iterable[Mapping[str, Any]]) -> pd.DataFrame:
    """One row per measured request: context columns plus one column per metric (None when voided)."""
    rows = []
    for r in records:
        if r.get("phase") != "measured":
            continue
        row = {k: r.get(k) for k in ("arm", "boot", "probe", "shape", "depth", "turn", "session", "index")}
        row["valid"] = bool(r.get("ok")) and not r.get("excluded_reason")
        row["flagged"] = bool(r.get("flags"))
        row.update(r.get("metrics") or {})
        rows.append(row)
    return pd.DataFrame(rows)


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
        return f"{value * 1000:.1f}ms"
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
