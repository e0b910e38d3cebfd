"""Faults for the calibrated stream: make `StreamServer` (and the stand-in engine) misbehave on cue.

A `Fault` rides on a `Schedule` — for every request (``StreamServer(Schedule(fault=...))``) or for one
request, as JSON in the ``X-Stream-Schedule`` header (`fault_header`). The kinds: ``drop`` (cut the
connection after N token chunks, RST or FIN), ``stall`` (pause before chunk N), ``malformed`` (an SSE
line that is not JSON), ``stream_error`` (vLLM's in-stream error event), ``http_error`` (an HTTP status
with an OpenAI-style error body), ``no_usage``, ``zero_tokens``, ``hang`` (no response at all),
``stop_early`` (finish after N token chunks, whatever was asked) and ``misreport`` (a final usage that claims
another count).
`Fault`'s docstring has the detail.

`Fault` is defined in `pytest_kvcache.selfcheck.stream`, not here: a fault is a field of the `Schedule`
that crosses process boundaries as JSON (the header, the stand-in engine, the self-check's child
process), and its behaviour is interleaved with the pacing of every chunk, so separating it would mean
rewriting the server's generation path. This module is its public, documented home for tests; the
self-check itself never sets a fault. See ``docs/testing.md``.
"""

from __future__ import annotations

from dataclasses import replace
from typing import get_args

from pytest_kvcache.selfcheck.schedule import Fault, FaultKind, Schedule

__all__ = ["FAULT_KINDS", "Fault", "FaultKind", "fault_header", "with_fault"]

#: Every fault kind, in `FaultKind`'s order.
FAULT_KINDS: tuple[FaultKind, ...] = get_args(FaultKind)


def with_fault(schedule: Schedule, fault: Fault | None) -> Schedule:
    """``schedule`` with ``fault`` injected (None: the same schedule without a fault)."""
    return replace(schedule, fault=fault)


def fault_header(fault: Fault, schedule: Schedule | None = None) -> dict[str, str]:
    """Request headers that make one request to a `StreamServer` (or the stand-in engine) hit ``fault``.

    ``schedule`` (default: `Schedule()`) is the rest of that request's schedule; the header replaces the
    server's default schedule for this request only.
    """
    return with_fault(schedule if schedule is not None else Schedule(), fault).to_header()
