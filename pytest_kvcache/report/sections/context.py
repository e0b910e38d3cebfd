"""What every report section is given: the loaded run and a :class:`BuildContext` — the run's arms, probe
specs, seed, frame and platform, and the facts several sections share, each computed once per build: the
judged deltas and crossovers, the boots, the arm entries, the blocks, another section's keys."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, cast

import pandas as pd

from pytest_kvcache.model.report import ArmEntry, BlockEntry, BootEntry, CrossoverRow, DeltaRow
from pytest_kvcache.report import bands, spread
from pytest_kvcache.report.comparison import crossover_rows, delta_rows
from pytest_kvcache.report.frame import host_busy
from pytest_kvcache.report.load import RunData
from pytest_kvcache.report.multiplicity import apply_holm
from pytest_kvcache.report.points import Specs
from pytest_kvcache.report.sections.entries import arm_entries, block_entries, boot_entries
from pytest_kvcache.report.verdicts import judge_crossovers

#: A report section: the keys it adds to the report, from the loaded run and the build's context.
Section = Callable[[RunData, "BuildContext"], dict[str, Any]]


@dataclass
class BuildContext:
    """One build of one run's report. ``allow_diff`` adds to the run's own ``--kv-allow-diff`` keys."""

    run: RunData
    allow_diff: Sequence[str] = ()
    _parts: dict[Section, dict[str, Any]] = field(default_factory=dict, repr=False)

    def of(self, section: Section) -> dict[str, Any]:
        """The keys ``section`` adds, computed once per build (a section may read another's this way)."""
        if section not in self._parts:
            self._parts[section] = section(self.run, self)
        return self._parts[section]

    @property
    def specs(self) -> Specs:
        return self.run.specs

    @cached_property
    def arms(self) -> list[str]:
        return self.run.arms

    @property
    def seed(self) -> int:
        return self.run.seed

    @property
    def data(self) -> pd.DataFrame:
        return self.run.frame

    @cached_property
    def settings(self) -> dict[str, Any]:
        """The run's settings as ``run.json`` stored them."""
        return cast(dict[str, Any], self.run.meta.get("settings") or {})

    @cached_property
    def allow(self) -> list[str]:
        """The evidence paths allowed to differ between boots: the run's ``--kv-allow-diff``, then ``allow_diff``."""
        return [*cast(list[str], self.settings.get("allow_diff") or []), *self.allow_diff]

    @cached_property
    def platform(self) -> bands.Platform:
        return bands.platform_of(self.run.evidence)

    @cached_property
    def unlike(self) -> str | None:
        """Why this run is not the case the platform's default bands were measured on (``bands.unlike_source``):
        its model's size class; None: it is."""
        return bands.unlike_source(self.platform, self.run.meta)

    @cached_property
    def _judged(self) -> tuple[list[DeltaRow], dict[str, dict[str, Any]]]:
        deltas = delta_rows(self.data, self.arms, self.specs, self.seed)
        used = spread.judge_deltas(deltas, self.platform, run_busy=host_busy(self.data), unlike=self.unlike)
        apply_holm(deltas)  # after the verdicts are set, before the crossovers and sentences read them
        return deltas, used

    @property
    def deltas(self) -> list[DeltaRow]:
        """Every arm against the baseline, judged (within boots, widened by the platform's default bands), then
        Holm within each (arm, probe) family."""
        return self._judged[0]

    @property
    def used_bands(self) -> dict[str, dict[str, Any]]:
        """The spreads the within-boot deltas were judged with (``report.spread.judge_deltas``): ``families``
        (default band family → SD percent) and ``spreads`` (kind → its source in words)."""
        return self._judged[1]

    @cached_property
    def crossovers(self) -> list[CrossoverRow]:
        """Where each arm's curve crosses the baseline's, judged against :attr:`deltas`."""
        found = crossover_rows(self.data, self.arms, self.specs, self.seed, self.platform)
        judge_crossovers(found, self.deltas)
        return found

    @cached_property
    def boots(self) -> list[BootEntry]:
        return boot_entries(self.run)

    @cached_property
    def entries(self) -> list[ArmEntry]:
        return arm_entries(self.run, self.arms)

    @cached_property
    def blocks(self) -> list[BlockEntry]:
        return block_entries(self.run)
