"""A new probe with its own axis and section is one file: ``toy_probe.py`` (outside the package, as a user writes
it) is copied into a run's folder as a test module and runs on the stand-in engine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.plugin.conftest import latest, with_counts

TOY = Path(__file__).with_name("toy_probe.py")


def test_a_toy_probe_from_one_file_has_its_axis_plan_line_points_and_section(
    pytester: pytest.Pytester, standin_args: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TOY_ECHO_TOKENS", "3,6")
    pytester.makepyfile(test_echo=TOY.read_text())
    args = [a for a in with_counts(standin_args, warmups=0, runs=2) if a not in ("-m", "short")]
    result = pytester.runpytest_subprocess(
        *args, "--kv-arms=auto,float16", "--kv-no-suite", "-m", "echo", "-v", "--kv-fail=decode_tps[echo@e9]: >= -50%"
    )
    # a gate on a point the axis does not give is refused before any boot
    assert result.ret == 4, result.stdout.str()
    result.stderr.fnmatch_lines(["*decode_tps[[]echo@e9[]]*e3, e6*"])

    result = pytester.runpytest_subprocess(*args, "--kv-arms=auto,float16", "--kv-no-suite", "-m", "echo", "-v")
    assert result.ret == 0, result.stdout.str()
    result.assert_outcomes(passed=4)  # 2 lengths × 2 arms
    result.stdout.fnmatch_lines(
        [
            "*echo probe: 2 output length(s) e3,e6 (TOY_ECHO_TOKENS)*",
            "*test_echo.py::test_echo[[]auto-e3[]] PASSED*",
            "*test_echo.py::test_echo[[]float16-e6[]] PASSED*",
        ]
    )
    run = latest(pytester)
    report = json.loads((run / "report.json").read_text())
    assert report["echo"] == {"auto": {"e3": 3, "e6": 6}, "float16": {"e3": 3, "e6": 6}}
    assert {(d["probe"], d["point"]) for d in report["deltas"]} >= {("echo", "e3"), ("echo", "e6")}
    markdown = (run / "report.md").read_text()
    assert "## Echo (a toy probe with its own axis)" in markdown and "| float16 | e6 | 6 |" in markdown
