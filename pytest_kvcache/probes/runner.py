"""The warmup-then-measure loop shared by probes, and the verdict of one probe test."""

from __future__ import annotations

import contextlib
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

    def extra_info(self) -> dict[str, Any]:
        """Means of our metrics over valid measured samples (pytest-benchmark's ``extra_info``)."""
        info: dict[str, Any] = {"valid_samples": len(self.valid)}
        if self.records:
            info.update({k: self.records[0].get(k) for k in ("arm", "boot", "probe", "shape")})
        for metric in ("ttft_s", "wall_tps", "decode_tps", "prefill_tps"):
            values = [r["metrics"][metric] for r in self.valid if r["metrics"].get(metric) is not None]
            if values:
                info[f"{metric}_mean"] = sum(values) / len(values)
        return info

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
    bench: Any = None,
) -> ProbeOutcome:
    """Send ``warmups`` unmeasured then ``runs`` measured requests, recording each before the next.

    ``send(phase, index)`` returns the sample and extra record fields (engine counter deltas, depth …).
    ``stop_on_failure`` ends the loop early (the engine died: further requests cannot succeed).
    """
    outcome = ProbeOutcome(label=label, requested=runs)

    def one(phase: str, index: int) -> bool:
        sample, extra = send(phase, index)
        outcome.records.append(record(sample, phase=phase, index=index, **extra))
        return sample.ok or not stop_on_failure(sample)

    for index in range(warmups):
        if not one("warmup", index):
            return outcome
    if bench is None:
        for index in range(runs):
            if not one("measured", index):
                break
        return outcome
    # pytest-benchmark drives the measured loop: one pedantic round = one measured request (its time is
    # the request's round trip, recording included); our own metrics go to extra_info.
    counter = iter(range(runs))

    def round_() -> None:
        if not one("measured", next(counter)):
            raise _Stop

    with contextlib.suppress(_Stop):
        bench.pedantic(round_, rounds=runs, iterations=1, warmup_rounds=0)
    bench.extra_info.update(outcome.extra_info())
    return outcome


class _Stop(Exception):
    """Ends a pytest-benchmark loop early: the engine died."""
