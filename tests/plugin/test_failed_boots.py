"""A gate on any probe plus a boot that fails: a report and exit 1, never exit 3 (issue 41). On a GPU runner a
failed boot is the common failure; the gate then cannot be judged, and says why."""

from __future__ import annotations

import json

import pytest

from tests.plugin.conftest import latest

#: Each probe with a gate of its own shape and the options that keep it small on the stand-in.
PROBE_GATES = {
    "short": ("decode_tps[short]: other >= base * 0.97", ()),
    "prefill": ("ttft_s[prefill]: other <= base * 1.1", ("--kv-depths=256", "--kv-depth-runs=2")),
    "agentic": ("decode_tps[agentic]: other >= base * 0.9", ("--kv-sessions=1", "--kv-turns=2")),
    "concurrency": ("stream_tps_median[concurrency]: other >= base * 0.9", ("--kv-concurrency=2",)),
    "fidelity": ("logprob_drift[fidelity]: other <= 0.1", ("--kv-fidelity-depths=256", "--kv-fidelity-window=128")),
    "capacity": (
        "capacity[capacity@400]: other >= base * 1.5",
        (
            "--kv-capacity-depths=400",
            "--kv-slo=ttft_p95<=150ms",
            "--kv-capacity-think=0.4",
            "--kv-cache-bytes=3M",
            "--kv-capacity-window=1",
            "--kv-capacity-start=2",
            "--kv-capacity-max-sessions=8",
        ),
    ),
}

ARMS = """
[tool.pytest_kvcache.arms.base]
args = ["--max-model-len", "1024"{base}]

[tool.pytest_kvcache.arms.other]
args = ["--max-model-len", "1024", "--standin-exit-at-start"]
"""


@pytest.mark.parametrize(
    ("probes", "both"),
    [(sorted(PROBE_GATES), True), (["capacity", "fidelity", "prefill", "short"], False)],
    ids=["every-boot-fails", "one-arm-fails"],
)
def test_a_gate_with_a_failed_boot_gives_a_report_and_exit_1(
    pytester: pytest.Pytester, standin_args: list[str], probes: list[str], both: bool
) -> None:
    """Every probe's gate in one run (one subprocess: the stand-in boots fail at once), then a run where only
    the second arm fails (the baseline's capacity search runs, with its re-trials); each gate is among the
    outcomes, an error or inconclusive, and the report is there."""
    pytester.makefile(".toml", pyproject=ARMS.format(base=', "--standin-exit-at-start"' if both else ""))
    base = [a for a in standin_args if a not in ("-m", "short")]
    gates = [f"--kv-fail={PROBE_GATES[p][0]}" for p in probes]
    extra = [a for p in probes for a in PROBE_GATES[p][1]]
    result = pytester.runpytest_subprocess(
        *base, "-m", " or ".join(probes), "--kv-arms=base,other", "--kv-max-replicates=1", *gates, *extra
    )
    output = "\n".join(result.stdout.lines + result.stderr.lines)
    assert result.ret == 1, output
    assert "the report could not be built" not in output and "Traceback" not in output
    report = json.loads((latest(pytester) / "report.json").read_text())
    for probe in probes:
        gate = PROBE_GATES[probe][0]
        outcomes = [g for g in report["gates"] if g["gate"] == gate]
        assert outcomes, (gate, report["gates"])  # among the outcomes: judged, or said why it cannot be
        assert all(g["outcome"] in ("error", "inconclusive") for g in outcomes), outcomes
    assert (latest(pytester) / "report.md").is_file()
