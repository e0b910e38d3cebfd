"""Summary statistics of measured samples (numpy)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np

SUMMARY_FIELDS = ("n", "mean", "median", "std", "cv_pct", "min", "max")


def describe(values: Iterable[float | None]) -> dict[str, Any]:
    """n, mean, median, sample std (ddof=1), CV %, min, max of the non-missing values."""
    data = np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=float)
    n = int(data.size)
    if n == 0:
        return {"n": 0, "mean": None, "median": None, "std": None, "cv_pct": None, "min": None, "max": None}
    mean = float(data.mean())
    std = float(data.std(ddof=1)) if n > 1 else None
    return {
        "n": n,
        "mean": mean,
        "median": float(np.median(data)),
        "std": std,
        "cv_pct": (100.0 * std / mean) if std is not None and mean != 0 else None,
        "min": float(data.min()),
        "max": float(data.max()),
    }
