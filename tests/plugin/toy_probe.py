"""A toy probe with its own axis and its own report section, written outside the package: the whole of what a new
probe costs. ``test_probe_toy.py`` copies this file into a run's folder as a test module and runs it.

Its axis is its own option (``TOY_ECHO_TOKENS``, the output lengths to ask for: an environment variable here, as a
user's probe has no ``Settings`` field): every test that takes ``kv_echo_tokens`` runs once per length and boot,
named ``e4``, ``e8``. Its spec says whether a length fits the model's context, and prints its line in the boot plan;
its section adds ``echo`` to report.json and a table to report.md.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from pytest_kvcache.probes.registry import Axis, ProbeSpec, register
from pytest_kvcache.probes.short import chat_payload
from pytest_kvcache.report.part import ReportPart
from pytest_kvcache.report.part import register as register_part

LENGTHS = tuple(int(n) for n in os.environ.get("TOY_ECHO_TOKENS", "4,8").split(","))


def echo_id(tokens: int) -> str:
    return f"e{tokens}"


def plan(settings: Any) -> str:
    fits = [n for n in LENGTHS if settings.context_tokens is None or n < settings.context_tokens]
    return f"echo probe: {len(fits)} output length(s) {','.join(map(echo_id, fits))} (TOY_ECHO_TOKENS)"


SPEC = register(
    ProbeSpec(
        name="echo",
        title="Echo (a toy probe with its own axis)",
        metrics=("decode_tps", "ttft_s"),
        primary_metric="decode_tps",
        marker_help="echo: a toy probe from outside the package, one test per output length (TOY_ECHO_TOKENS).",
        axis=Axis("kv_echo_tokens", "TOY_ECHO_TOKENS", echo_id, points=True, values=lambda settings: LENGTHS),
        plan=plan,
    )
)


def section(run: Any, ctx: Any) -> dict[str, Any]:
    """report.json's ``echo``: per arm and length, the completion tokens the engine gave (the asked-for count)."""
    rows: dict[str, dict[str, int]] = {}
    for record in run.records:
        if record.get("probe") == "echo" and record.get("phase") == "measured":
            arm = rows.setdefault(str(record["arm"]), {})
            arm[str(record["shape"])] = int(record["sample"].get("completion_tokens") or 0)
    return {"echo": rows} if rows else {}


def lines(report: Any) -> list[str]:
    echo = report.get("echo")
    if not echo:
        return []
    out = ["", "## Echo lengths", "", "| Arm | Length | Tokens |", "|---|---|---|"]
    return out + [f"| {arm} | {point} | {n} |" for arm, points in echo.items() for point, n in points.items()]


#: its report part: report.json's key after every stock one, report.md's table after the probe tables
register_part(ReportPart("echo", json=(1000, section), markdown=(85, lines)))


@pytest.mark.echo
def test_echo(kv_server: Any, kv_client: Any, kv_record: Any, kv_echo_tokens: int) -> None:
    payload = chat_payload(kv_server.model, [{"role": "user", "content": "Count."}], "greedy", kv_echo_tokens)
    payload["ignore_eos"] = True
    for index in range(2):
        sample = kv_client.stream_chat(payload)
        kv_record(sample, probe="echo", shape=echo_id(kv_echo_tokens), phase="measured", index=index)
        assert sample.ok, sample.error
