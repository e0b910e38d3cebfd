"""GPU state, per arm (``report["arms"][i]["gpu"]``): each card's power cap before and after the arm, its
VRAM when ready and before stopping; or why there is none."""

from __future__ import annotations

from pytest_kvcache.model.evidence import Evidence
from pytest_kvcache.model.report import GpuCardSummary, GpuSummary


def gpu_summary(evidence: Evidence) -> GpuSummary:
    """Per card: power cap before/after the arm, VRAM when ready and before stopping; or why none."""
    before, after = evidence.get("gpu_before") or {}, evidence.get("gpu_after") or {}
    if not before.get("gpu"):
        return {"gpu": False, "reason": before.get("reason")}
    post = {c.get("uuid"): c for c in after.get("cards") or []}
    ready = evidence.get("vram_ready_mib") or {}
    loaded = evidence.get("vram_before_stop_mib") or {}
    cards: list[GpuCardSummary] = []
    for card in before.get("cards") or []:
        uuid = card.get("uuid")
        cards.append(
            {
                "index": card.get("index"),
                "uuid": uuid,
                "name": card.get("name"),
                "power_limit_before_w": card.get("power_limit_w"),
                "power_limit_after_w": (post.get(uuid) or {}).get("power_limit_w"),
                "vram_ready_mib": ready.get(str(uuid)),
                "vram_before_stop_mib": loaded.get(str(uuid)),
                "driver_version": before.get("driver_version"),
            }
        )
    return {"gpu": True, "cards": cards, "changes": evidence.get("gpu_changes") or []}
