"""One JSON-ready picture of the visible cards, and what it says.

* ``snapshot()`` / ``card_state()`` — every card's NVML state before and after a boot
  (``no_gpu_snapshot()`` where there is no usable GPU); ``diff()`` — what changed that matters for a
  comparison; ``memory_used_mib()`` — VRAM per card.
* ``require_idle()`` — refuse a busy card; ``settle()`` — wait until a card has cooled down.

``docs/gpu.md`` defines every field. Plain Python: no pytest, no server access.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pytest_kvcache.gpu.nvml import P2P_STATUS, _mib, _watts, format_cuda_version, throttle_reason_names

if TYPE_CHECKING:
    from pytest_kvcache.gpu.cards import CardRef
    from pytest_kvcache.gpu.nvml import Nvml


def card_state(nvml: Nvml, card: CardRef) -> dict[str, Any]:
    """Everything NVML tells about one card, JSON-ready; None for what this card/driver cannot say."""
    i = card.index
    constraints = nvml.power_limit_constraints_mw(i)
    memory = nvml.memory_bytes(i)
    util = nvml.utilization_pct(i)
    mask = nvml.throttle_mask(i)
    procs = nvml.compute_processes(i)
    return {
        "index": i,
        "uuid": card.uuid,
        "name": nvml.name(i),
        "power_limit_w": _watts(nvml.power_limit_mw(i)),
        "power_limit_default_w": _watts(nvml.power_limit_default_mw(i)),
        "power_limit_enforced_w": _watts(nvml.power_limit_enforced_mw(i)),
        "power_limit_min_w": _watts(constraints[0]) if constraints else None,
        "power_limit_max_w": _watts(constraints[1]) if constraints else None,
        "power_w": _watts(nvml.power_usage_mw(i)),
        "sm_clock_mhz": nvml.clock_mhz(i, "sm", "current"),
        "mem_clock_mhz": nvml.clock_mhz(i, "mem", "current"),
        "sm_clock_max_mhz": nvml.clock_mhz(i, "sm", "max"),
        "mem_clock_max_mhz": nvml.clock_mhz(i, "mem", "max"),
        "sm_app_clock_mhz": nvml.clock_mhz(i, "sm", "app"),
        "mem_app_clock_mhz": nvml.clock_mhz(i, "mem", "app"),
        "sm_app_clock_default_mhz": nvml.clock_mhz(i, "sm", "app_default"),
        "mem_app_clock_default_mhz": nvml.clock_mhz(i, "mem", "app_default"),
        "pstate": nvml.pstate(i),
        "temp_c": nvml.temperature_c(i),
        "throttle_mask": mask,
        "throttle_reasons": throttle_reason_names(mask),
        "memory_used_mib": _mib(memory[0]) if memory else None,
        "memory_total_mib": _mib(memory[1]) if memory else None,
        "util_gpu_pct": util[0] if util else None,
        "util_mem_pct": util[1] if util else None,
        "pcie_gen": nvml.pcie_link(i, "gen"),
        "pcie_width": nvml.pcie_link(i, "width"),
        "pcie_gen_max": nvml.pcie_link(i, "gen_max"),
        "pcie_width_max": nvml.pcie_link(i, "width_max"),
        "persistence_mode": nvml.persistence_mode(i),
        "compute_processes": None if procs is None else [{"pid": pid, "used_mib": _mib(used)} for pid, used in procs],
    }


def snapshot(nvml: Nvml, cards: Sequence[CardRef], *, clock: Callable[[], float] = time.time) -> dict[str, Any]:
    """One JSON-ready picture of the host's GPUs: driver, every visible card, and P2P between them.

    ``p2p[a][b]`` is the READ peer-to-peer status from ``cards[a]`` to ``cards[b]`` (None on the
    diagonal and where NVML cannot say).
    """
    taken = clock()
    states = [card_state(nvml, card) for card in cards]
    p2p: list[list[str | None]] = []
    for a in cards:
        row: list[str | None] = []
        for b in cards:
            status = None if a.index == b.index else nvml.p2p_read_status(a.index, b.index)
            row.append(None if status is None else P2P_STATUS.get(status, f"status_{status}"))
        p2p.append(row)
    return {
        "gpu": True,
        "taken_unix_s": taken,
        "driver_version": nvml.driver_version(),
        "cuda_driver_version": format_cuda_version(nvml.cuda_driver_version()),
        "device_count": nvml.device_count(),
        "cards": states,
        "p2p": p2p,
        "nvml_errors": dict(sorted(dict(nvml.errors).items())),
    }


def no_gpu_snapshot(reason: str) -> dict[str, Any]:
    """What a snapshot says where there is no usable GPU."""
    return {"gpu": False, "reason": reason}


def _cards_by_uuid(snap: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    return {card["uuid"]: card for card in snap.get("cards") or []}


def _card_label(card: Mapping[str, Any]) -> str:
    return f"GPU {card.get('index')} ({str(card.get('uuid'))[:12]})"


def _fmt(value: Any, unit: str) -> str:
    if value is None:
        return "unknown"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return f"{value}{unit}"


#: (snapshot field, what it is, unit) — the card fields ``diff`` reports when they change.
DIFF_FIELDS: tuple[tuple[str, str, str], ...] = (
    ("power_limit_w", "power limit", " W"),
    ("power_limit_enforced_w", "enforced power limit", " W"),
    ("persistence_mode", "persistence mode", ""),
    ("sm_app_clock_mhz", "SM applications clock", " MHz"),
    ("mem_app_clock_mhz", "memory applications clock", " MHz"),
    ("sm_clock_max_mhz", "SM max clock", " MHz"),
    ("name", "name", ""),
)


def diff(before: Mapping[str, Any], after: Mapping[str, Any], *, own_pids: Iterable[int] = ()) -> list[str]:
    """What changed between two snapshots that matters for a comparison, one line per change.

    Power limits, persistence mode, applications clocks, driver/CUDA version, cards appearing or
    vanishing, and compute processes that are new in ``after`` and not in ``own_pids``.
    """
    lines: list[str] = []
    if not before.get("gpu") or not after.get("gpu"):
        if before.get("gpu") != after.get("gpu"):
            lines.append(
                f"GPU availability changed: {'available' if before.get('gpu') else before.get('reason')} → "
                f"{'available' if after.get('gpu') else after.get('reason')}"
            )
        return lines
    for key, what in (("driver_version", "driver"), ("cuda_driver_version", "CUDA driver version")):
        if before.get(key) != after.get(key):
            lines.append(f"{what} changed: {before.get(key)} → {after.get(key)}")
    old, new = _cards_by_uuid(before), _cards_by_uuid(after)
    for uuid in old.keys() - new.keys():
        lines.append(f"{_card_label(old[uuid])} is gone")
    for uuid in new.keys() - old.keys():
        lines.append(f"{_card_label(new[uuid])} appeared")
    own = set(own_pids)
    for uuid in [u for u in old if u in new]:
        a, b = old[uuid], new[uuid]
        label = _card_label(b)
        for key, what, unit in DIFF_FIELDS:
            if a.get(key) != b.get(key):
                lines.append(f"{label}: {what} {_fmt(a.get(key), unit)} → {_fmt(b.get(key), unit)}")
        seen = {p["pid"] for p in a.get("compute_processes") or []}
        for proc in b.get("compute_processes") or []:
            if proc["pid"] not in seen and proc["pid"] not in own:
                lines.append(
                    f"{label}: new foreign compute process pid {proc['pid']} ({_fmt(proc.get('used_mib'), ' MiB')})"
                )
    return lines


def memory_used_mib(snap: Mapping[str, Any]) -> dict[str, int]:
    """UUID → memory used (MiB), for the cards whose memory NVML could read."""
    return {
        card["uuid"]: int(card["memory_used_mib"])
        for card in snap.get("cards") or []
        if card.get("memory_used_mib") is not None
    }


def require_idle(snap: Mapping[str, Any], max_util_pct: float = 10, *, own_pids: Iterable[int] = ()) -> list[str]:
    """Problems that make a card unfit to measure on: compute processes that are not ours, or GPU
    utilization above ``max_util_pct``. Empty when every card is idle (or there is no GPU)."""
    problems: list[str] = []
    own = set(own_pids)
    for card in snap.get("cards") or []:
        label = _card_label(card)
        for proc in card.get("compute_processes") or []:
            if proc["pid"] not in own:
                problems.append(
                    f"{label}: foreign compute process pid {proc['pid']} ({_fmt(proc.get('used_mib'), ' MiB')})"
                )
        util = card.get("util_gpu_pct")
        if util is not None and util > max_util_pct:
            problems.append(f"{label}: utilization {util}% > {max_util_pct:g}%")
    return problems


def settle(
    nvml: Nvml,
    cards: Sequence[CardRef],
    *,
    max_temp_c: float | None,
    max_power_w: float | None,
    timeout_s: float,
    poll_s: float = 1.0,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[str, Any]:
    """Wait until every card is at or below ``max_temp_c`` and ``max_power_w`` (None: not checked;
    an unreadable value counts as settled), or ``timeout_s`` passed.

    Returns ``settled`` (bool), ``waited_s``, ``polls`` and the last ``cards`` readings (UUID →
    ``temp_c``, ``power_w``).
    """
    start = clock()
    polls = 0
    while True:
        polls += 1
        readings: dict[str, dict[str, float | None]] = {}
        ok = True
        for card in cards:
            temp = nvml.temperature_c(card.index)
            power = _watts(nvml.power_usage_mw(card.index))
            readings[card.uuid] = {"temp_c": temp, "power_w": power}
            if max_temp_c is not None and temp is not None and temp > max_temp_c:
                ok = False
            if max_power_w is not None and power is not None and power > max_power_w:
                ok = False
        waited = clock() - start
        if ok or waited >= timeout_s:
            return {
                "settled": ok,
                "waited_s": waited,
                "polls": polls,
                "max_temp_c": max_temp_c,
                "max_power_w": max_power_w,
                "timeout_s": timeout_s,
                "cards": readings,
            }
        sleep(min(poll_s, max(0.0, timeout_s - waited)))
