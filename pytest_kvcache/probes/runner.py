"""The warmup-then-measure loop shared by probes, and the verdict of one probe test."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pytest_kvcache import interrupt, stats
from pytest_kvcache.config.settings import Settings
from pytest_kvcache.metrics import catalogue
from pytest_kvcache.model.records import Record as RecordData
from pytest_kvcache.sample import Sample

Record = Callable[..., RecordData]


@dataclass(frozen=True)
class Adaptive:
    """``--kv-target-ci``: after the planned runs, keep measuring until the CI half-width of ``metric``'s
    mean is at most ``target_pct`` of the mean, or ``max_runs`` measured requests were sent."""

    metric: str
    target_pct: float
    max_runs: int

    def stopped(self, n: int, width: float | None, *, unit: str) -> dict[str, Any]:
        """Why the loop stopped after ``n`` measured ``unit`` (requests, or concurrency trials)."""
        if width is not None and width <= self.target_pct:
            reason = f"target reached: CI half-width ±{width:.2f}% ≤ ±{self.target_pct:g}% after {n} {unit}"
        elif n >= self.max_runs:
            shown = f"±{width:.2f}%" if width is not None else "no CI"
            reason = f"cap reached: {n} {unit} (--kv-max-runs) with CI half-width {shown} > ±{self.target_pct:g}%"
        else:
            reason = f"stopped after {n} {unit}: the engine died"
        return {
            "metric": self.metric,
            "target_pct": self.target_pct,
            "max_runs": self.max_runs,
            "n": n,
            "half_width_pct": width,
            "reason": reason,
        }

    @classmethod
    def of(cls, settings: Settings, metric: str, runs: int) -> Adaptive | None:
        """The run's adaptive sampling for a probe planned with ``runs`` requests (None without --kv-target-ci)."""
        if settings.target_ci_pct is None:
            return None
        return cls(metric, settings.target_ci_pct, max(runs, settings.max_runs or 4 * runs))

    def half_width_pct(self, records: list[RecordData]) -> float | None:
        return self.half_width_pct_of([r["metrics"].get(self.metric) for r in records])

    def half_width_pct_of(self, values: list[float | None]) -> float | None:
        """The CI half-width of the mean of ``values``, in % of the mean (None: no CI yet)."""
        mean, lo, hi = stats.mean_ci([v for v in values if v is not None])
        if mean is None or lo is None or hi is None or mean == 0:
            return None
        return float((hi - lo) / 2 / abs(mean) * 100)


@dataclass
class ProbeOutcome:
    """Every record one probe test wrote, and whether the test passes."""

    label: str
    requested: int
    records: list[RecordData] = field(default_factory=list)
    #: Why measuring stopped, when ``--kv-target-ci`` drove it (metric, target, n, half width, reason).
    sampling: dict[str, Any] | None = None

    @property
    def measured(self) -> list[RecordData]:
        return [r for r in self.records if r["phase"] == "measured"]

    @property
    def failed(self) -> list[RecordData]:
        return [r for r in self.measured if not r["ok"]]

    @property
    def valid(self) -> list[RecordData]:
        return [r for r in self.measured if r["ok"] and not r["excluded_reason"]]

    def extra_info(self) -> dict[str, Any]:
        """Means of our metrics over valid measured samples (pytest-benchmark's ``extra_info``)."""
        info: dict[str, Any] = {"valid_samples": len(self.valid)}
        if self.records:
            info.update({k: self.records[0].get(k) for k in ("arm", "boot", "probe", "shape")})
        for metric in catalogue.names("client"):
            values = [v for r in self.valid if (v := r["metrics"].get(metric)) is not None]
            if values:
                info[f"{metric}_mean"] = sum(values) / len(values)
        return info

    def problems(self) -> list[str]:
        out = [f"measured request {r['index']} failed: {r['excluded_reason']}" for r in self.failed]
        last = self.records[-1] if self.records else None
        if last is not None and last["phase"] == "warmup" and not last["ok"]:  # the server was lost in a warmup
            out.insert(0, f"warmup request {last['index']} failed: {last['excluded_reason']}")
        if len(self.valid) < self.requested:
            out.append(f"{len(self.valid)} of {self.requested} measured samples are valid")
        return out

    def message(self) -> str:
        return f"{self.label}: " + "; ".join(self.problems())


Send = Callable[[str, int], tuple[Sample, Mapping[str, object]]]


#: Failures after which no further request can succeed: the engine died, or it is hung (it took a request and
#: sent nothing, not even headers, within the stall timeout: each further request would wait as long).
SERVER_LOST = frozenset({"engine_died", "no_response"})


def server_lost(sample: Sample) -> bool:
    return sample.error_kind in SERVER_LOST


def run_repeated(
    send: Send,
    record: Record,
    *,
    label: str,
    warmups: int,
    runs: int,
    stop_on_failure: Callable[[Sample], bool] = server_lost,
    bench: Any = None,
    adaptive: Adaptive | None = None,
) -> ProbeOutcome:
    """Send ``warmups`` unmeasured then ``runs`` measured requests, recording each before the next.

    ``send(phase, index)`` returns the sample and extra record fields (engine counter deltas, depth …).
    ``stop_on_failure`` ends the loop early (the engine died or hangs: further requests cannot succeed).
    ``adaptive`` adds measured requests after the planned ones until its target is met (or its cap).
    """
    outcome = ProbeOutcome(label=label, requested=runs)
    alive = True

    def one(phase: str, index: int) -> bool:
        nonlocal alive
        interrupt.check()  # a Ctrl-C lost in a finalizer stops the loop here, before one more request
        sample, extra = send(phase, index)
        outcome.records.append(record(sample, phase=phase, index=index, **extra))
        alive = sample.ok or not stop_on_failure(sample)
        return alive

    for index in range(warmups):
        if not one("warmup", index):
            return outcome
    if bench is None:
        for index in range(runs):
            if not one("measured", index):
                break
    else:
        _benchmarked(one, runs, bench, outcome)
    if adaptive is not None and alive:
        _adapt(one, adaptive, outcome)
    return outcome


def _adapt(one: Callable[[str, int], bool], adaptive: Adaptive, outcome: ProbeOutcome) -> None:
    width = adaptive.half_width_pct(outcome.valid)
    while (width is None or width > adaptive.target_pct) and len(outcome.measured) < adaptive.max_runs:
        if not one("measured", len(outcome.measured)):
            break
        width = adaptive.half_width_pct(outcome.valid)
    outcome.sampling = adaptive.stopped(len(outcome.measured), width, unit="request(s)")


def _benchmarked(one: Callable[[str, int], bool], runs: int, bench: Any, outcome: ProbeOutcome) -> None:
    """pytest-benchmark drives the planned measured loop: one pedantic round = one measured request (its
    time is the request's round trip, recording included); our own metrics go to extra_info. Adaptive
    extra requests run after it and are not in pytest-benchmark's statistics."""
    counter = iter(range(runs))

    def round_() -> None:
        if not one("measured", next(counter)):
            raise _Stop

    with contextlib.suppress(_Stop):
        bench.pedantic(round_, rounds=runs, iterations=1, warmup_rounds=0)
    bench.extra_info.update(outcome.extra_info())


class _Stop(Exception):
    """Ends a pytest-benchmark loop early: the engine died."""
