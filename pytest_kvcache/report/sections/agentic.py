"""``report["agentic"]``: per arm and turn, means across sessions, and each arm's TTFT-growth verdict."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import pandas as pd

from pytest_kvcache.model.report import AgenticSection, AgenticTurn, GrowthVerdict
from pytest_kvcache.probes.agentic import growth_verdict
from pytest_kvcache.report.load import RunData
from pytest_kvcache.report.outputs import htmlpage, md_probes, terminal
from pytest_kvcache.report.part import ReportPart
from pytest_kvcache.report.sections.context import BuildContext


def agentic_section(data: pd.DataFrame, arms: Sequence[str]) -> AgenticSection:
    """Per arm and turn, means across sessions; and each arm's TTFT-growth verdict (the seed's words)."""
    sub = data[(data["probe"] == "agentic") & data["valid"]] if not data.empty else data
    if sub.empty or "turn" not in sub:
        return {"turns": [], "growth": []}
    table = (
        sub.groupby(["arm", "turn"])
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
    order = {name: i for i, name in enumerate(arms)}
    table = table.sort_values(["arm", "turn"], key=lambda col: col.map(order) if col.name == "arm" else col)

    def num(value: object) -> float | None:
        return float(cast(float, value)) if value is not None and value == value else None

    turns: list[AgenticTurn] = [
        {
            "arm": str(row["arm"]),
            "turn": int(row["turn"]),
            "sessions": int(row["sessions"]),
            "prompt_tokens": num(row["prompt_tokens"]),
            "cached_tokens": num(row["cached_tokens"]),
            "ttft_s": num(row["ttft_s"]),
            "ttft_s_std": num(row["ttft_s_std"]),
            "decode_tps": num(row["decode_tps"]),
        }
        for _, row in table.iterrows()
    ]
    growth: list[GrowthVerdict] = []
    for arm in [a for a in arms if a in set(table["arm"])]:
        mine = [t for t in turns if t["arm"] == arm and t.get("ttft_s") is not None]
        found = growth_verdict(
            {t["turn"]: float(t.get("ttft_s") or 0.0) for t in mine},
            {t["turn"]: float(t.get("prompt_tokens") or 0.0) for t in mine},
        )
        entry: GrowthVerdict = {"arm": arm, "verdict": str(found["verdict"])}
        if "ttft_growth" in found:
            entry["ttft_growth"] = float(found["ttft_growth"])
            entry["context_growth"] = float(found["context_growth"])
            entry["last_turn"] = int(found["last_turn"])
            entry["flags"] = {str(k): str(v) for k, v in found["flags"].items()}
            entry["line"] = (
                f"{arm}: TTFT grew {found['ttft_growth']:.1f}× while context grew "
                f"{found['context_growth']:.1f}× (turn 2 → {found['last_turn']}): {found['verdict']}"
            )
        else:
            entry["line"] = f"{arm}: {found['verdict']} for a growth verdict"
        growth.append(entry)
    return {"turns": turns, "growth": growth}


def section(run: RunData, ctx: BuildContext) -> dict[str, Any]:
    return {"agentic": agentic_section(ctx.data, ctx.arms)}


PART = ReportPart(
    json=(150, section),
    markdown=(150, md_probes.render_agentic),
    html=(50, htmlpage.agentic_tables),
    terminal=(30, terminal.agentic_terminal),
)
