"""Prometheus ``/metrics`` scrapes of a server, and the values and deltas we read from them. The names read are an
engine kind's own (``Kind.counters``: vLLM's in ``engines/kinds/vllm.py``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families


@dataclass(frozen=True)
class Scrape:
    """One parsed scrape: sample name → list of (labels, value)."""

    samples: Mapping[str, tuple[tuple[Mapping[str, str], float], ...]]

    def labels(self, name: str) -> dict[str, str] | None:
        """Labels of the first sample called ``name`` (info gauges like ``vllm:cache_config_info``)."""
        rows = self.samples.get(name)
        return dict(rows[0][0]) if rows else None

    def total(self, name: str, **match: str) -> float | None:
        """Sum of the samples called ``name`` whose labels include ``match``; None when absent."""
        rows = self.samples.get(name)
        if rows is None:
            return None
        return sum(value for labels, value in rows if all(labels.get(k) == v for k, v in match.items()))


def parse(text: str) -> Scrape:
    samples: dict[str, list[tuple[Mapping[str, str], float]]] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                samples.setdefault(sample.name, []).append((dict(sample.labels), float(sample.value)))
    except KeyboardInterrupt:
        # Ctrl-C landing inside the parser's generators leaves a frame without a line number (Python 3.11),
        # on which pytest's own interrupt report crashes (exit 1 instead of 2): raise it from here instead.
        raise KeyboardInterrupt("interrupted while parsing /metrics") from None
    return Scrape({name: tuple(rows) for name, rows in samples.items()})


def delta(before: Scrape, after: Scrape, name: str, **match: str) -> float | None:
    """Counter increase between two scrapes; None when the counter is absent from either."""
    a, b = before.total(name, **match), after.total(name, **match)
    if a is None or b is None:
        return None
    return b - a


def spec_metrics(engine: Mapping[str, object]) -> dict[str, float]:
    """Speculative-decoding figures of one request from its counter deltas (empty when no draft was made).

    ``acceptance_length`` = 1 + accepted / drafts: tokens per verification step (vLLM's "mean acceptance
    length"; 1.0 when every draft is rejected). ``acceptance_rate`` = accepted / draft tokens.
    """
    drafts, tokens, accepted = (engine.get(k) for k in ("spec_drafts", "spec_draft_tokens", "spec_accepted_tokens"))
    if not isinstance(drafts, int | float) or not isinstance(accepted, int | float) or drafts <= 0:
        return {}
    out = {"acceptance_length": 1.0 + accepted / drafts}
    if isinstance(tokens, int | float) and tokens > 0:
        out["acceptance_rate"] = accepted / tokens
    return out


def engine_delta(
    before: Scrape,
    after: Scrape,
    counters: Mapping[str, str],
    per_position: str | None = None,
) -> dict[str, object]:
    """Counter deltas between two scrapes; a counter the engine does not export is left out. ``counters``:
    name in records → sample name (an engine kind's own: ``Kind.counters``).

    ``spec_accepted_per_position`` lists accepted tokens per draft position when the engine exports it.
    """
    out: dict[str, object] = {}
    for key, name in counters.items():
        value = delta(before, after, name)
        if value is not None:
            out[key] = int(value) if name.endswith("_total") else value
    rows_before = {r[0].get("position"): r[1] for r in before.samples.get(per_position or "", ())}
    rows_after = {r[0].get("position"): r[1] for r in after.samples.get(per_position or "", ())}
    if rows_after:
        positions = sorted(rows_after, key=lambda p: int(p) if p and p.isdigit() else 0)
        out["spec_accepted_per_position"] = [int(rows_after[p] - rows_before.get(p, 0.0)) for p in positions]
    return out
