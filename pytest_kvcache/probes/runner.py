"""The warmup-then-measure loop shared by probes, and the verdict of one probe test."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pytest_kvcache.client import Sample

Record = Callable[..., dict[str, Any]]


@dataclass
class ProbeOutcome:
    """Every record one probe test wrote, and whether the test passes."""

    label: str
    requested: int
    records: list[dict[str, Any]] = field(default_factory=list)

    @property
    def measured(self) -> list[dict[str, Any]]:
        return [r for r in self.records if r["phase"] == "measured"]

    @property
    def failed(self) -> list[dict[str, Any]]:
        return [r for r in self.measured if not r["ok"]]

    @property
    def valid(self) -> list[dict[str, Any]]:
        return [r for r in self.measured if r["ok"] and not r["excluded_reason"]]

    @property
    def flagged(self) -> list[dict[str, Any]]:
        return [r for r in self.measured if r["flags"]]

    def problems(self) -> list[str]:
        out = [f"measured request {r['index']} failed: {r['excluded_reason']}" for r in self.failed]
        if len(self.valid) < self.requested:
            out.append(f"{len(self.valid)} of {self.requested} measured samples are valid")
        return out

    def message(self) -> str:
        return f"{self.label}: " + "; ".join(self.problems())


Send = Callable[[str, int], tuple[Sample, dict[str, Any]]]


def engine_died(sample: Sample) -> bool:
    return sample.error_kind == "engine_died"


def run_repeated(
    send: Send,
    record: Record,
    *,
    label: str,
    warmups: int,
    runs: int,
    stop_on_failure: Callable[[Sample], bool] = engine_died,
) -> ProbeOutcome:
    """Send ``warmups`` unmeasured then ``runs`` measured requests, recording each before the next.

    ``send(phase, index)`` returns the sample and extra record fields (engine counter deltas, depth …).
    ``stop_on_failure`` ends the loop early (the engine died: further requests cannot succeed).
    """
    outcome = ProbeOutcome(label=label, requested=runs)
    for phase, count in (("warmup", warmups), ("measured", runs)):
        for index in range(count):
            sample, extra = send(phase, index)
            outcome.records.append(record(sample, phase=phase, index=index, **extra))
            if not sample.ok and stop_on_failure(sample):
                return outcome
    return outcome
