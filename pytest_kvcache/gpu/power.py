"""The ``--kv-gpu-power-limit`` pinning: a ``PowerPlan`` (``config.grammars.parse_power_limit``) on the cards
(``plan_targets()``), ``apply_power_limits()`` (setting needs root), ``verify_power_limits()`` against a snapshot,
``restore_power_limits()``. Plain Python: no pytest, no server access."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pytest_kvcache.config.grammars import PowerPlan
from pytest_kvcache.gpu.cards import CardRef, _all_cards
from pytest_kvcache.gpu.nvml import GpuError, RootRequiredError
from pytest_kvcache.gpu.snapshot import _card_label

if TYPE_CHECKING:
    from pytest_kvcache.gpu.nvml import Nvml


def plan_targets(plan: PowerPlan, cards: Sequence[CardRef]) -> dict[str, float]:
    """UUID → watts for ``cards``. GpuError when an index or prefix names no card (or several)."""
    if plan.all_w is not None:
        return {card.uuid: plan.all_w for card in cards}
    out: dict[str, float] = {}
    for index, watts in plan.by_index.items():
        match = [c for c in cards if c.index == index]
        if not match:
            raise GpuError(
                f"--kv-gpu-power-limit {plan.spec!r}: GPU index {index} is not a visible card "
                f"(visible: {', '.join(str(c.index) for c in cards) or 'none'})"
            )
        out[match[0].uuid] = watts
    for prefix, watts in plan.by_uuid_prefix.items():
        match = [c for c in cards if c.uuid.lower().startswith(prefix.lower())]
        if len(match) != 1:
            what = "no visible card" if not match else f"{len(match)} cards"
            raise GpuError(f"--kv-gpu-power-limit {plan.spec!r}: {prefix} matches {what}")
        if match[0].uuid in out:
            raise GpuError(f"--kv-gpu-power-limit {plan.spec!r}: {match[0].label} is named twice")
        out[match[0].uuid] = watts
    return out


def apply_power_limits(nvml: Nvml, cards: Sequence[CardRef], plan: PowerPlan) -> dict[str, float]:
    """Set the plan's limits; return UUID → the limit (W) each changed card had before.

    A ``verify:`` plan sets nothing and returns ``{}``. Every target is checked against the card's
    allowed range before anything is set; if a setter fails midway the cards already changed are put
    back. NVML's NoPermission becomes RootRequiredError (setting needs root).
    """
    if plan.verify_only:
        return {}
    targets = plan_targets(plan, cards)
    by_uuid = {card.uuid: card for card in cards}
    for uuid, watts in targets.items():
        card = by_uuid[uuid]
        constraints = nvml.power_limit_constraints_mw(card.index)
        if constraints is not None and not constraints[0] <= watts * 1000 <= constraints[1]:
            raise GpuError(
                f"--kv-gpu-power-limit {plan.spec!r}: {watts:g} W is outside {card.label}'s range "
                f"{constraints[0] / 1000:g}–{constraints[1] / 1000:g} W"
            )
    originals: dict[str, float] = {}
    try:
        for uuid, watts in targets.items():
            card = by_uuid[uuid]
            current = nvml.power_limit_mw(card.index)
            if current is None:
                raise GpuError(f"{card.label}: cannot read the current power limit, so it could not be restored")
            originals[uuid] = current / 1000.0
            try:
                nvml.set_power_limit_mw(card.index, round(watts * 1000))
            except PermissionError as exc:
                del originals[uuid]
                raise RootRequiredError(
                    f"setting a GPU power limit needs root (NVML: {exc}); run as root, or set the limit "
                    f"beforehand (nvidia-smi -i {card.index} -pl {watts:g}) and pass "
                    f"--kv-gpu-power-limit=verify:{plan.spec.removeprefix('verify:')} to only check it"
                ) from exc
            except GpuError:
                del originals[uuid]
                raise
    except BaseException:
        with contextlib.suppress(GpuError):
            restore_power_limits(nvml, originals)
        raise
    return originals


def verify_power_limits(snap: Mapping[str, Any], plan: PowerPlan, *, tolerance_w: float = 1.0) -> list[str]:
    """Problems with the limits in ``snap`` against ``plan`` (empty: every card is as asked)."""
    if not snap.get("gpu"):
        return [f"no GPU ({snap.get('reason')}): cannot check power limit {plan.spec!r}"]
    states = snap.get("cards") or []
    cards = [CardRef(int(c["index"]), str(c["uuid"])) for c in states]
    try:
        targets = plan_targets(plan, cards)
    except GpuError as exc:
        return [str(exc)]
    problems: list[str] = []
    for state in states:
        if state["uuid"] not in targets:
            continue
        want = targets[state["uuid"]]
        label = _card_label(state)
        limit, enforced = state.get("power_limit_w"), state.get("power_limit_enforced_w")
        if limit is None:
            problems.append(f"{label}: power limit unreadable, wanted {want:g} W")
        elif abs(limit - want) > tolerance_w:
            problems.append(f"{label}: power limit is {limit:g} W, wanted {want:g} W")
        elif enforced is not None and enforced < want - tolerance_w:
            problems.append(f"{label}: enforced power limit is {enforced:g} W, below the wanted {want:g} W")
    return problems


def restore_power_limits(nvml: Nvml, originals: Mapping[str, float]) -> None:
    """Put back the limits ``apply_power_limits`` returned. Tries every card; GpuError lists failures."""
    index_of = {card.uuid: card.index for card in _all_cards(nvml)}
    failures: list[str] = []
    for uuid, watts in originals.items():
        if uuid not in index_of:
            failures.append(f"{uuid[:12]}: card not found")
            continue
        try:
            nvml.set_power_limit_mw(index_of[uuid], round(watts * 1000))
        except (PermissionError, GpuError) as exc:
            failures.append(f"GPU {index_of[uuid]} ({uuid[:12]}): {exc}")
    if failures:
        raise GpuError("could not restore GPU power limits: " + "; ".join(failures))
