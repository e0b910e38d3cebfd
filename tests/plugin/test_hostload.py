"""A disturbed host is a confound: a CPU burner started by the project's conftest runs during the ``code``
shape's tests (half of the measured requests, both arms) and the samples it disturbs are flagged, or
excluded, and counted in the report (stand-in engine; the burner is a real busy loop on this host).

The host may be busy with other work too (other test runs on the same cores), so nothing here asserts
that an undisturbed sample is clean or an exact count: at least one burner sample is caught, and the
report counts exactly what ``requests.jsonl`` holds."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.plugin.conftest import latest

#: Starts one busy-loop process (about one core: 50 % of a 2-core host) for each ``code`` test and stops
#: it at the test's teardown; it ends by itself after 60 s whatever happens.
BURNER = """
import subprocess
import sys

BUSY = "import time\\nend = time.time() + 60\\nwhile time.time() < end:\\n    pass\\n"


class Burner:
    def __init__(self):
        self.running = {}

    def pytest_runtest_setup(self, item):
        if "code" in getattr(getattr(item, "callspec", None), "id", ""):
            self.running[item.nodeid] = subprocess.Popen([sys.executable, "-c", BUSY])

    def pytest_runtest_teardown(self, item):
        burner = self.running.pop(item.nodeid, None)
        if burner is not None:
            burner.kill()
            burner.wait()


def pytest_configure(config):
    config.pluginmanager.register(Burner(), "burner")  # a conftest's own hooks skip the stock suite's items
"""


@pytest.fixture
def args(standin_args: list[str], tag: str) -> list[str]:
    kept = [a for a in standin_args if not a.startswith(("--kv-engine-args", "--kv-warmups", "--kv-runs"))]
    return [
        *kept,
        f"--kv-engine-args={tag} --standin-ttft=0.25",  # requests of ~0.27 s: about one sampling interval
        "--kv-warmups=1",
        "--kv-runs=4",
        "--kv-arms=auto,float16",
        "--kv-host-cpu-max=30",
    ]


def measured(run: Path) -> list[dict[str, Any]]:
    lines = (run / "requests.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["phase"] == "measured"]


def busy_note(report: dict[str, Any]) -> str:
    (note,) = [n for n in report["notes"] if "saw the host's CPU busy outside the engine and client" in n]
    return str(note)


def check_sampled(run: Path, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every measured record has a host CPU window; a burner sample is flagged. Returns the flagged ones."""
    assert all(r["host_cpu"]["samples"] >= 1 for r in records), [r["host_cpu"] for r in records]
    flagged = [r for r in records if "host_cpu_busy" in r["flags"]]
    burned = [r for r in records if r["shape"] == "code"]
    assert len(burned) == 8 and any("host_cpu_busy" in r["flags"] for r in burned), [r["host_cpu"] for r in burned]
    lines = [json.loads(line) for line in (run / "hostcpu.jsonl").read_text().splitlines()]
    assert lines[0]["kind"] == "start" and len(lines) > 10
    assert all(0 <= line["other_busy_pct"] <= 100 for line in lines[1:] if line.get("other_busy_pct") is not None)
    assert max(line["own_processes"] for line in lines[1:]) >= 2  # pytest and the stand-in engine
    return flagged


def peaks(records: list[dict[str, Any]], shape: str) -> list[float]:
    return sorted(p for r in records if r["shape"] == shape and (p := r["host_cpu"]["other_busy_pct_max"]) is not None)


def test_the_burners_samples_are_excluded_and_counted(pytester: pytest.Pytester, args: list[str]) -> None:
    pytester.makeconftest(BURNER)
    result = pytester.runpytest_subprocess(*args, "--kv-host-cpu=exclude")
    assert result.ret in (0, 1), result.stdout.str()  # a probe test with an excluded sample fails (runner)
    run = latest(pytester)
    records = measured(run)
    flagged = check_sampled(run, records)
    excluded = [r for r in records if r["excluded_reason"]]
    assert excluded == flagged
    assert all(r["excluded_reason"].startswith("host CPU ") for r in excluded)
    assert all(r["excluded_reason"].endswith("% busy outside the engine and client (> 30%)") for r in excluded)
    report = json.loads((run / "report.json").read_text())
    note = busy_note(report)
    assert note.startswith(f"{len(flagged)} measured sample(s) saw") and note.endswith(": excluded"), note
    assert report["flags"]["samples"] == sum(1 for r in records if r["flags"])  # all flags, decode_window_short …
    assert "host_cpu_busy" in report["flags"]["kinds"]
    ttft_rows = [row for row in report["summary"] if row["metric"] == "ttft_s"]
    assert sum(row["excluded"] for row in ttft_rows) == len(excluded)
    reasons = {reason for row in ttft_rows for reason in row["excluded_reasons"]}
    assert reasons == {r["excluded_reason"] for r in excluded}
    print("exclude: code", peaks(records, "code"), "narrative", peaks(records, "narrative"))


def test_the_burners_samples_are_flagged_by_default(pytester: pytest.Pytester, args: list[str]) -> None:
    pytester.makeconftest(BURNER)
    result = pytester.runpytest_subprocess(*args)
    assert result.ret == 0, result.stdout.str()
    result.assert_outcomes(passed=4)
    run = latest(pytester)
    records = measured(run)
    flagged = check_sampled(run, records)
    assert not any(r["excluded_reason"] for r in records)
    report = json.loads((run / "report.json").read_text())
    note = busy_note(report)
    top = max(r["host_cpu"]["other_busy_pct_max"] for r in flagged)
    assert note == (
        f"{len(flagged)} measured sample(s) saw the host's CPU busy outside the engine and client "
        f"(max {top:.0f}%): flagged"
    )
    assert all(row["excluded"] == 0 for row in report["summary"])
    # one boot per arm on a host that was busy during the run: no delta is judged with the default band (issue 41)
    within = [d for d in report["deltas"] if d["ci_method"] == "within-boot" and d.get("spread")]
    assert within and {d["spread"]["kind"] for d in within} == {"widest"}, [d.get("spread") for d in within]
    assert report["bands"]["host_busy"] == len(flagged)
    assert any(
        line.startswith("Within-boot verdicts judged with the widest spread measured on any host")
        for line in result.stdout.lines
    ), result.stdout.str()[-3000:]
    print("flag: code", peaks(records, "code"), "narrative", peaks(records, "narrative"))


def test_off_samples_nothing(pytester: pytest.Pytester, args: list[str]) -> None:
    result = pytester.runpytest_subprocess(*args, "--kv-host-cpu-max=off")
    assert result.ret == 0, result.stdout.str()
    run = latest(pytester)
    assert not (run / "hostcpu.jsonl").exists()
    assert all("host_cpu" not in r for r in measured(run))
