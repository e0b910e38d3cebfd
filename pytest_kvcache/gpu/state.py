"""The run's GPU state: one NVML session, a sampler into ``gpu.jsonl``, the energy meter into
``energy.jsonl``, snapshots around every boot, drift flags per request and power-limit pinning. Plain
Python; the plugin's session drives it."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_kvcache.config.grammars import PowerPlan, parse_power_limit
from pytest_kvcache.gpu.cards import CardRef, visible_cards
from pytest_kvcache.gpu.drift import DriftRules
from pytest_kvcache.gpu.drift import drift as drift_flags
from pytest_kvcache.gpu.energy import EnergyMeter
from pytest_kvcache.gpu.nvml import GpuError, Nvml, last_open_error, open_nvml
from pytest_kvcache.gpu.power import apply_power_limits, restore_power_limits, verify_power_limits
from pytest_kvcache.gpu.sampler import Sampler
from pytest_kvcache.gpu.snapshot import no_gpu_snapshot, require_idle, settle
from pytest_kvcache.gpu.snapshot import snapshot as take_snapshot


@dataclass(frozen=True)
class GpuOptions:
    power_limit: str | None = None  # --kv-gpu-power-limit spec
    require_idle: bool = False
    settle: tuple[float, float] | None = None  # (max temp °C, max power W) between arms
    settle_timeout_s: float = 300.0
    hz: float = 4.0
    max_temp_c: float | None = None


@dataclass(eq=False)
class GpuState:
    options: GpuOptions
    nvml: Nvml | None = None
    cards: list[CardRef] = field(default_factory=list)
    sampler: Sampler | None = None
    meter: EnergyMeter | None = None
    plan: PowerPlan | None = None
    originals: dict[str, float] = field(default_factory=dict)
    reason: str | None = None
    error: str | None = None  # a pinning failure: every boot fails with it

    @property
    def available(self) -> bool:
        return self.nvml is not None and bool(self.cards)

    def open(self, run_path: Path, nvml: Nvml | None = None, devices: Sequence[str | None] | None = None) -> None:
        """Open NVML (or record "no GPU"), pin power limits, start the sampler. ``nvml``: a test's fake.

        ``devices``: the ``CUDA_VISIBLE_DEVICES`` each arm's engine runs under (None: unset, every card);
        the run follows the union of their cards. Without it, the cards this process sees."""
        self.nvml = nvml if nvml is not None else open_nvml()
        if self.nvml is None:
            self.reason = last_open_error() or "NVML is not available"
            return
        if devices is None:
            self.cards = visible_cards(self.nvml, os.environ)
        else:
            found = {card for spec in devices for card in self.cards_of(spec)}
            self.cards = sorted(found, key=lambda c: c.index)
        if not self.cards:
            self.reason = "NVML found no visible GPU" if devices is None else "no arm's engine sees a GPU"
            return
        if self.options.power_limit:
            self.plan = parse_power_limit(self.options.power_limit)
            if not self.plan.verify_only:
                try:
                    self.originals = apply_power_limits(self.nvml, self.cards, self.plan)
                except GpuError as exc:
                    self.error = f"cannot set GPU power limits ({self.options.power_limit}): {exc}"
        self.sampler = Sampler(self.nvml, self.cards, run_path / "gpu.jsonl", hz=self.options.hz).start()
        self.meter = EnergyMeter(self.nvml, self.cards, run_path / "energy.jsonl").start()

    def cards_of(self, devices: str | None) -> list[CardRef]:
        """The cards an engine started with ``CUDA_VISIBLE_DEVICES=devices`` sees (None: unset)."""
        if self.nvml is None:
            return []
        return visible_cards(self.nvml, {} if devices is None else {"CUDA_VISIBLE_DEVICES": devices})

    def _own(self, cards: Sequence[CardRef] | None) -> list[CardRef]:
        """``cards`` (a boot's), limited to the run's; every run card when None."""
        return list(self.cards) if cards is None else [c for c in cards if c in self.cards]

    def snapshot(self, cards: Sequence[CardRef] | None = None) -> dict[str, Any]:
        """The state of ``cards`` (a boot's; default: every card the run follows)."""
        if not self.available or self.nvml is None:
            return no_gpu_snapshot(self.reason or "no GPU")
        own = self._own(cards)
        if not own:
            return no_gpu_snapshot("this engine sees no GPU")
        return take_snapshot(self.nvml, own)

    def before_boot(self, cards: Sequence[CardRef] | None = None) -> tuple[dict[str, Any], list[str]]:
        """Settle, check idleness and pinned limits of ``cards`` (the boot's; default: all the run's);
        returns (snapshot, problems that must stop the boot)."""
        problems = [self.error] if self.error else []
        own = self._own(cards)
        if not self.available or self.nvml is None or not own:
            return self.snapshot(cards), problems
        if self.options.settle is not None:
            temp, power = self.options.settle
            settle(self.nvml, own, max_temp_c=temp, max_power_w=power, timeout_s=self.options.settle_timeout_s)
        snap = self.snapshot(own)
        if self.options.require_idle:
            problems += require_idle(snap, own_pids=[os.getpid()])
        if self.plan is not None:
            problems += verify_power_limits(snap, self.plan)
        return snap, problems

    def check(self, snap: dict[str, Any]) -> list[str]:
        """Power limits still as pinned?"""
        return verify_power_limits(snap, self.plan) if self.plan is not None and snap.get("gpu") else []

    def drift(
        self, t0_unix_s: float, t1_unix_s: float, cards: Sequence[CardRef] | None = None
    ) -> tuple[dict[str, Any] | None, list[str], str | None]:
        """The GPU window of one request on ``cards`` (its boot's; default: all the run's) and the drift
        flags/exclusion it implies."""
        if self.sampler is None:
            return None, [], None
        window = self.sampler.window(t0_unix_s, t1_unix_s, cards=None if cards is None else self._own(cards))
        rules = DriftRules(max_temp_c=self.options.max_temp_c)
        flags, excluded = drift_flags(window, rules)
        return window, flags, excluded

    def close(self) -> list[str]:
        """Stop sampling and restore the original power limits. Returns problems to report."""
        problems: list[str] = []
        if self.sampler is not None:
            self.sampler.stop()
            self.sampler = None
        if self.meter is not None:
            problems += self.meter.close()
            self.meter = None
        if self.originals and self.nvml is not None:
            try:
                restore_power_limits(self.nvml, self.originals)
            except GpuError as exc:
                problems.append(f"could not restore GPU power limits: {exc}")
            self.originals = {}
        if self.nvml is not None:
            with contextlib.suppress(Exception):
                self.nvml.shutdown()
            self.nvml = None
        return problems
