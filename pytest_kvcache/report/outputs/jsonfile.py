"""``report.json``: the report as JSON (NaN and infinities as null, numpy scalars as Python numbers)."""

from __future__ import annotations

import json

from pytest_kvcache.model.report import Report
from pytest_kvcache.report import deciding


def clean(value: object) -> object:
    """JSON-safe: NaN/inf → None, tuples → lists, numpy scalars → Python numbers."""
    if isinstance(value, dict):
        return {str(k): clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [clean(v) for v in value]
    item = getattr(value, "item", None)
    if item is not None and callable(item) and not isinstance(value, str | bytes):
        value = item()
    if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
        return None
    return value


def render(report: Report) -> str:
    """The report as JSON; every delta (and stored-run comparison) row carries ``decided_ci``, the interval its
    verdict was taken on, and ``ci_basis``, what that interval is (``report.deciding``)."""
    out = clean(report)
    if isinstance(out, dict):
        deciding.annotate(out.get("deltas") or [])
        deciding.annotate((out.get("compare") or {}).get("rows") or [])
    return json.dumps(out, indent=2, sort_keys=False, default=str, allow_nan=False) + "\n"
