"""Measure the measurer: the calibrated stream and the measuring client's self-check against it.

* ``stream`` — `~pytest_kvcache.selfcheck.stream.StreamServer`, an OpenAI-compatible server that sends
  every token chunk on a scripted deadline (`Schedule`) and records when each chunk left. Product code:
  the self-check serves from it at the start of every real run.
* ``check`` — `run_self_check` (the client's TTFT / decode-TPS error and CPU per chunk on this machine)
  and `overhead_warning` (the report's warning when that overhead is a visible share of the inter-token
  time), plus the pieces ``benchmarks/harness.py`` reuses.

This package exports exactly `run_self_check` and `overhead_warning`, loaded on first use: importing
``pytest_kvcache.selfcheck`` (or its ``stream`` module) does not import numpy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pytest_kvcache.selfcheck.check import overhead_warning, run_self_check

__all__ = ["overhead_warning", "run_self_check"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from pytest_kvcache.selfcheck import check

        return getattr(check, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
