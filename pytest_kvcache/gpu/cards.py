"""Which cards a run uses: ``CardRef`` (NVML index and UUID) and ``visible_cards()``, which honours
``CUDA_VISIBLE_DEVICES`` the way CUDA does. Plain Python: no pytest, no server access."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pytest_kvcache.gpu.nvml import Nvml


@dataclass(frozen=True)
class CardRef:
    """One card: its NVML index (``nvidia-smi -i``) and its UUID (stable across reboots and renumbering)."""

    index: int
    uuid: str

    @property
    def label(self) -> str:
        return f"GPU {self.index} ({self.uuid[:12]})"


def _all_cards(nvml: Nvml) -> list[CardRef]:
    cards = []
    for index in range(nvml.device_count()):
        uuid = nvml.uuid(index)
        cards.append(CardRef(index, uuid or f"index-{index}"))
    return cards


def visible_cards(nvml: Nvml | None, env: Mapping[str, str] | None = None) -> list[CardRef]:
    """The cards a CUDA process started with ``env`` sees, in CUDA's order.

    ``CUDA_VISIBLE_DEVICES`` unset: every card. Set: a comma list of indices or ``GPU-…`` UUIDs or
    unique UUID prefixes; as in CUDA, the list ends at the first entry that names no card (or names
    one twice), and an empty value hides every card. ``MIG-…`` entries end the list (not supported).
    """
    if nvml is None:
        return []
    env = os.environ if env is None else env
    cards = _all_cards(nvml)
    spec = env.get("CUDA_VISIBLE_DEVICES")
    if spec is None:
        return cards
    chosen: list[CardRef] = []
    for raw in spec.split(","):
        item = raw.strip()
        card: CardRef | None = None
        if re.fullmatch(r"\d+", item):
            card = next((c for c in cards if c.index == int(item)), None)
        elif item[:4].upper() == "GPU-" and len(item) > 4:
            matches = [c for c in cards if c.uuid.lower().startswith(item.lower())]
            card = matches[0] if len(matches) == 1 else None
        if card is None or card in chosen:
            break
        chosen.append(card)
    return chosen
