"""The boot plan: every boot of every arm, its round and its lane, built once from the resolved settings."""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pytest_kvcache.config.arms import Arm
from pytest_kvcache.config.constants import Order, SettingsError

if TYPE_CHECKING:
    from pytest_kvcache.config.settings import Settings


@dataclass(frozen=True)
class Boot:
    """One boot of one arm. ``boot_id`` names it in test ids and folders: the arm's name with one boot
    per arm (``fp8``), ``fp8.r1``, ``fp8.r2`` … with replicates. ``index`` is its position in the run's
    boot order; ``extra`` marks an adaptive round, booted only while ``--kv-target-ci`` is not reached."""

    arm: Arm
    index: int
    replicate: int = 1
    replicates: int = 1
    extra: bool = False
    #: The lane it runs on under pytest-xdist (worker, its GPU group and host); 0 in a single-process run.
    lane: int = 0

    @property
    def boot_id(self) -> str:
        return self.arm.name if self.replicates == 1 else f"{self.arm.name}.r{self.replicate}"

    @property
    def block(self) -> int:
        """The block (one boot of every arm, run back to back on one lane) this boot belongs to."""
        return self.replicate


def boot_order(
    arms: Sequence[Arm], rounds: int, order: Order, seed: int = 0, planned: int | None = None
) -> tuple[Boot, ...]:
    """The run's boots: ``rounds`` rounds of every arm, each round ordered by ``order``.

    ``sequential``: every round in the declared order (A B A B); ``abba``: the declared order, then
    reversed, alternately (A B B A A B …), so drift over time and "the second boot is faster" cancel;
    ``random``: each round shuffled by a generator seeded with ``seed``. ``planned`` (≤ ``rounds``) is the
    number of rounds that always run; later rounds are adaptive extras.
    """
    rng = random.Random(seed)
    boots: list[Boot] = []
    for r in range(1, rounds + 1):
        round_arms = list(arms)
        if order == "abba" and r % 2 == 0:
            round_arms.reverse()
        elif order == "random":
            rng.shuffle(round_arms)
        for arm in round_arms:
            extra = planned is not None and r > planned
            boots.append(Boot(arm=arm, index=len(boots), replicate=r, replicates=rounds, extra=extra))
    return tuple(boots)


def lane_order(
    arms: Sequence[Arm], rounds: int, lanes: int, order: Order, seed: int = 0, planned: int | None = None
) -> tuple[Boot, ...]:
    """The run's boots placed on ``lanes`` parallel lanes (pytest-xdist workers, each with its GPU group).

    A block is one boot of every arm, run back to back on one lane; block ``r`` runs on lane
    ``(r - 1) % lanes`` as that lane's ``(r - 1) // lanes``-th block. The arms of a block are the declared
    order rotated by ``lane + position`` (``abba``, the default: with two arms every lane runs A B B A …, and
    lanes start on different arms), by ``lane`` alone (``sequential``) or shuffled (``random``). The result
    is a Latin square over time: at every slot the lanes run as many different arms as there are, so what
    the lanes share (host CPU, PCIe, memory bandwidth, power) loads every arm alike. ``index`` is the boot's
    position in time (slot, then lane).
    """
    if lanes <= 1:
        return boot_order(arms, rounds, order, seed, planned)
    rng = random.Random(seed)
    k = len(arms)
    placed: list[tuple[int, int, int, Arm, int]] = []  # (slot, lane, block, arm, ...)
    for r in range(1, rounds + 1):
        lane, position = (r - 1) % lanes, (r - 1) // lanes
        shift = (lane + position if order == "abba" else lane if order == "sequential" else 0) % k
        block_arms = [*arms[shift:], *arms[:shift]]
        if order == "random":
            rng.shuffle(block_arms)
        for i, arm in enumerate(block_arms):
            placed.append((position * k + i, lane, r, arm, i))
    placed.sort(key=lambda p: (p[0], p[1]))
    return tuple(
        Boot(
            arm=arm,
            index=index,
            replicate=r,
            replicates=rounds,
            extra=planned is not None and r > planned,
            lane=lane,
        )
        for index, (_, lane, r, arm, _) in enumerate(placed)
    )


#: With gates, the boots per arm a run may grow to by default while a gate is undecided (``--kv-max-replicates``).
GATE_BOOT_BUDGET = 3


def boot_budget(
    given: int | None, replicates: int, *, gates: bool, target_ci: float | None, launcher: str
) -> int | None:
    """``--kv-max-replicates``, resolved: the most boots per arm a run grows to, one counterbalanced round of
    every arm at a time, while something is undecided — a gate (``--kv-fail``), or with ``--kv-target-ci`` and
    2+ replicates a CI wider than the target. None: no adaptive rounds (the run boots what it was asked).

    Default: with gates, :data:`GATE_BOOT_BUDGET` (never fewer than ``--kv-replicates``); with
    ``--kv-target-ci`` and 2+ replicates, 2 × replicates; the larger when both apply. ``1`` (or the number of
    replicates) turns it off. Against external endpoints nothing is booted, so no rounds are added by default.
    ``gates``: whether a gate can be decided by another boot (``config.constants.BOOT_INVARIANT_PROBES`` cannot).
    """
    adaptive = gates or (target_ci is not None and replicates >= 2)
    if given is not None:
        if not gates and target_ci is None and given > replicates:
            raise SettingsError(
                "--kv-max-replicates adds boots only to decide a gate (--kv-fail) on a probe that varies from boot "
                "to boot (not fidelity or retrieval: the same on every boot) or to reach --kv-target-ci"
            )
        if given < replicates:
            raise SettingsError(f"--kv-max-replicates ({given}) must be at least --kv-replicates ({replicates})")
        return given if adaptive and given > replicates else None
    budget = 0
    if gates and launcher != "external":
        budget = max(budget, GATE_BOOT_BUDGET)
    if target_ci is not None and replicates >= 2:
        budget = max(budget, 2 * replicates)
    return budget if budget > replicates else None


@dataclass(frozen=True)
class BootPlan:
    """The run's boots, built once from the resolved settings (at configure) and handed to the session, the
    run and the pytest-xdist scheduler, which read it instead of rebuilding it."""

    boots: tuple[Boot, ...]

    @classmethod
    def of(cls, settings: Settings) -> BootPlan:
        """``settings``' boots: ``rounds`` rounds of every arm in its ``order``, placed on its ``lanes``."""
        boots = lane_order(
            settings.arms, settings.rounds, settings.lanes, settings.order, settings.order_seed, settings.replicates
        )
        return cls(boots=boots)

    def __iter__(self) -> Iterator[Boot]:
        return iter(self.boots)

    def __len__(self) -> int:
        return len(self.boots)

    def by_id(self) -> dict[str, Boot]:
        return {b.boot_id: b for b in self.boots}

    @property
    def lanes_used(self) -> set[int]:
        return {b.lane for b in self.boots}
