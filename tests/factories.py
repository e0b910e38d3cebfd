"""Builders the tests share (one place, as pytest-xdist's and GuideLLM's tests keep theirs)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

# ------------------------------------------------------------------------------------------ records


def measured_records(
    arm: str,
    values: Iterable[float],
    *,
    boot: str | Callable[[int], str] | None = None,
    replicate: int | None = None,
    probe: str = "short",
    shape: str = "code",
    metrics: Callable[[float], dict[str, float]] = lambda v: {"decode_tps": v},
) -> list[dict[str, Any]]:
    """Measured, successful records of one arm as ``requests.jsonl`` holds them, one per value: ``index`` counts
    from 0, ``metrics`` maps each value to the record's metrics (default: ``decode_tps``), ``boot`` is the boot
    id (default: the arm's name) or a function of the index, and ``replicate`` is written when given."""
    out: list[dict[str, Any]] = []
    for i, v in enumerate(values):
        record: dict[str, Any] = {"arm": arm, "boot": boot(i) if callable(boot) else (boot or arm)}
        if replicate is not None:
            record["replicate"] = replicate
        record.update(
            {
                "probe": probe,
                "shape": shape,
                "phase": "measured",
                "index": i,
                "ok": True,
                "excluded_reason": None,
                "metrics": metrics(v),
                "sample": {},
            }
        )
        out.append(record)
    return out
