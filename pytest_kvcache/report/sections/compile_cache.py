"""``report["compile_cache"]``: what the engine's compile cache saved, per arm."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from pytest_kvcache.model.report import BootEntry
from pytest_kvcache.report.load import RunData
from pytest_kvcache.report.part import ReportPart
from pytest_kvcache.report.sections.context import BuildContext


def compile_cache_lines(boots: Sequence[BootEntry]) -> list[str]:
    """What the engine's compile cache saved, per arm: boots that compiled against boots that loaded the
    compiled graphs from the cache (their mean time to ready and torch.compile time). Empty when no arm has
    both kinds of boot (e.g. ``--enforce-eager``, or one boot an arm)."""
    lines = []
    for arm in dict.fromkeys(b["arm"] for b in boots):
        ran = [b for b in boots if b["arm"] == arm and b.get("ready_s") is not None]
        compiled = [b for b in ran if b.get("compile_cache") == "miss"]
        cached = [b for b in ran if b.get("compile_cache") == "hit"]
        if not compiled or not cached:
            continue
        ready_c = float(np.mean([float(b["ready_s"] or 0.0) for b in compiled]))
        ready_h = float(np.mean([float(b["ready_s"] or 0.0) for b in cached]))
        comp = [s for b in compiled if (s := b.get("compile_s")) is not None]
        load = [s for b in cached if (s := b.get("compile_s")) is not None]
        detail = (
            f"; torch.compile {np.mean(comp):.1f} s compiling, {np.mean(load):.1f} s loading" if comp and load else ""
        )
        lines.append(
            f"{arm}: {len(compiled)} boot(s) compiled (ready after {ready_c:.0f} s), {len(cached)} loaded the "
            f"compile cache (ready after {ready_h:.0f} s mean): {ready_c - ready_h:.0f} s saved a boot{detail}."
        )
    return lines


def section(run: RunData, ctx: BuildContext) -> dict[str, Any]:
    return {"compile_cache": compile_cache_lines(ctx.boots)}


PART = ReportPart(json=(50, section))
