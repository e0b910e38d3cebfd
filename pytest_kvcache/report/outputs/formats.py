"""The cell formats every writer shares (``report.md``, the terminal, ``report.html``): numbers by metric,
deltas with their CI and verdict, a markdown table, and the probe specs' titles."""

from __future__ import annotations

from pytest_kvcache.model import DeltaRow, Json, Report, SavedRow
from pytest_kvcache.probes.registry import ENERGY_METRICS, ProbeSpec
from pytest_kvcache.report.energy import joules_text


def fmt(value: float | int | None, metric: str) -> str:
    if value is None or value != value:
        return "–"
    if metric in ENERGY_METRICS:
        return joules_text(float(value))
    if metric.endswith("_s"):
        return f"{value:.3f} s" if abs(value) >= 1 else f"{value * 1000:.0f} ms"
    if metric in ("prompt_tokens", "cached_tokens", "kv_cache_size_tokens"):
        return f"{value:,.0f}"
    return f"{value:,.2f}"


def fmt_delta(row: DeltaRow | SavedRow) -> str:
    delta, lo, hi = row.get("delta_pct"), row.get("ci_low"), row.get("ci_high")
    if delta is None:
        return "–"
    text = f"{delta:+.1f}%"
    if lo is not None and hi is not None:
        text += f" [{(lo - 1) * 100:+.1f}, {(hi - 1) * 100:+.1f}]"
    verdict = row.get("verdict")
    if row.get("verdict_note"):
        text += f" ({row['verdict_note']})"
    elif verdict and verdict != "inconclusive":
        text += f" {verdict}" + (f" ({row['provisional']})" if row.get("provisional") else "")
    elif verdict:
        text += " (inconclusive)"
    return text


def _md_table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(cells) + " |" for cells in rows]
    return lines


def probe_specs(report: Report) -> dict[str, ProbeSpec]:
    """The probe specs the report was built with (``report["probes"]``), for titles and labels."""
    return {d["name"]: ProbeSpec.from_dict(d) for d in report.get("probes") or []}


def title(report: Report, probe: str) -> str:
    spec = probe_specs(report).get(probe)
    return spec.title if spec else probe


def json_text(value: Json) -> str:
    return "absent" if value is None else str(value)
