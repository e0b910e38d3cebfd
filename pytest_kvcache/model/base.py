"""The run model's shared pieces: schema versions, verdict and outcome words, a JSON value."""

from __future__ import annotations

from typing import Literal

RECORD_SCHEMA_VERSION = 1
REPORT_VERSION = 1

Verdict = Literal["better", "worse", "inconclusive"]
#: a gate's outcome; ``error``: it cannot be evaluated in this run (its reason says why), which fails the run
Outcome = Literal["pass", "fail", "inconclusive", "error"]

#: A JSON value whose inside the report does not read (launcher facts, NVML tables …).
Json = str | int | float | bool | None | list["Json"] | dict[str, "Json"]
