"""One report pipeline: a report that cannot be built never passes, gates share the report's seed,
re-renders resolve options like a run, and a user's probe is a first-class probe (stand-in engine)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_kvcache import cli
from tests.plugin.conftest import latest, with_counts


@pytest.fixture
def args(standin_args: list[str]) -> list[str]:
    return with_counts(standin_args, warmups=0, runs=3, extra=("--kv-arms=auto,float16",))


BROKEN_WRITER = """
import pytest_kvcache.report.outputs.markdown as markdown

def _broken(report, plots=()):
    raise OSError("disk full while writing report.md")

markdown.markdown = _broken
"""

IMPOSSIBLE = "--kv-fail=decode_tps[short]: >= 1000000000"


def test_a_report_that_cannot_be_built_fails_the_run_and_says_why(pytester: pytest.Pytester, args: list[str]) -> None:
    pytester.makeconftest(BROKEN_WRITER)
    result = pytester.runpytest_subprocess(*args, IMPOSSIBLE)
    assert result.ret == 3, result.stdout.str()
    result.assert_outcomes(passed=4, skipped=8)  # the gate failed after round 1: rounds 2–3 not booted
    result.stdout.fnmatch_lines(
        [
            "gate FAIL: decode_tps[[]short@code]*",
            "*gate(s) failed: exit code 1",
            "ERROR: pytest-kvcache: the report could not be built: OSError: disk full while writing report.md*",
        ]
    )
    assert "Traceback" not in result.stdout.str()
    assert (latest(pytester) / "requests.jsonl").stat().st_size > 0  # the measurements stand


def test_kvcache_report_names_a_report_error_and_exits_3(
    pytester: pytest.Pytester, args: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    result = pytester.runpytest_subprocess(*args)
    assert result.ret == 0, result.stdout.str()
    from pytest_kvcache.report.outputs import markdown

    def broken(report: object, plots: object = ()) -> str:
        raise ValueError("cannot format")

    monkeypatch.setattr(markdown, "markdown", broken)
    code = cli.main([str(latest(pytester)), "--fail=decode_tps[short]: >= 1000000000"])
    out = capsys.readouterr().out
    assert code == 3, out
    assert "gate FAIL: decode_tps[short@code]" in out
    assert "ERROR: pytest-kvcache: the report could not be built: ValueError: cannot format" in out


def test_a_broken_compare_baseline_is_a_usage_error_before_anything_boots(
    pytester: pytest.Pytester, args: list[str], tag: str
) -> None:
    broken = pytester.path / ".kvcache" / "baselines" / "old"
    broken.mkdir(parents=True)
    (broken / "requests.jsonl").write_text("")  # no run.json
    result = pytester.runpytest_subprocess(*args, "--kv-compare=old", IMPOSSIBLE)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["ERROR: pytest-kvcache: --kv-compare: */baselines/old: incomplete stored run*run.json"]
    )
    assert not (pytester.path / ".kvcache" / "runs").exists()  # nothing booted, nothing measured


def test_gates_and_the_report_use_the_same_seed(pytester: pytest.Pytester, args: list[str]) -> None:
    gate = "--kv-fail=decode_tps[short@code]: float16 >= auto * 0.5"
    result = pytester.runpytest_subprocess(*args, "--kv-seed=7", gate)
    assert result.ret == 0, result.stdout.str()
    report = json.loads((latest(pytester) / "report.json").read_text())
    assert report["seed"] == 7
    delta = next(
        d for d in report["deltas"] if (d["probe"], d["point"], d["metric"]) == ("short", "code", "decode_tps")
    )
    (judged,) = report["gates"]
    # one boot a side: the gate is judged on the delta's within-boot CI widened by the default band, the very
    # interval the delta's own verdict was judged on (issue 32)
    assert judged["evidence"]["within_ci"] == [delta["ci_low"], delta["ci_high"]]
    assert [judged["ci_low"], judged["ci_high"]] == delta["judged_ci"]
    assert judged["value"] == delta["ratio"]


# ------------------------------------------------------------------------------------ re-render options


@pytest.fixture
def stored(pytester: pytest.Pytester, args: list[str]) -> Path:
    """One finished two-arm run on the stand-in, also saved as baseline ``base``."""
    result = pytester.runpytest_subprocess(*args, "--kv-save=base")
    assert result.ret == 0, result.stdout.str()
    return latest(pytester)


def test_rerender_takes_gates_from_cli_env_and_ini(
    pytester: pytest.Pytester, stored: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plain = pytester.runpytest_subprocess(f"--kv-rerender={stored}")
    assert plain.ret == 0, plain.stdout.str()
    cli_gate = pytester.runpytest_subprocess(f"--kv-rerender={stored}", IMPOSSIBLE)
    assert cli_gate.ret == 1 and "gate FAIL: decode_tps[short@code]" in cli_gate.stdout.str()
    monkeypatch.setenv("PYTEST_KVCACHE_FAIL", "decode_tps[short]: >= 1000000000")
    env_gate = pytester.runpytest_subprocess(f"--kv-rerender={stored}")
    assert env_gate.ret == 1 and "gate FAIL: decode_tps[short@code]" in env_gate.stdout.str()
    monkeypatch.delenv("PYTEST_KVCACHE_FAIL")
    pytester.makeini("[pytest]\nkv_fail = ttft_s[short]: <= 0.000001\nkv_inconclusive = fail\n")
    ini_gate = pytester.runpytest_subprocess(f"--kv-rerender={stored}")
    assert ini_gate.ret == 1 and "gate FAIL: ttft_s[short@code]" in ini_gate.stdout.str()


def test_rerender_takes_compare_noise_and_inconclusive_like_a_run(
    pytester: pytest.Pytester, stored: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTEST_KVCACHE_COMPARE", "base")
    # A wide threshold: on a loaded host one stand-in sample can be 3x slower, and the gate must still pass.
    result = pytester.runpytest_subprocess(f"--kv-rerender={stored}", "--kv-fail=decode_tps[short]: >= saved * 0.05")
    assert result.ret == 0, result.stdout.str()
    report = json.loads((stored / "report.json").read_text())
    assert report["compare"]["path"].endswith("baselines/base") and report["compare"]["rows"]
    # 1 boot each, 20× from the threshold: decided on the within-boot CI widened by the default band
    assert all(g["outcome"] == "pass" and g["evidence"]["kind"] == "default band" for g in report["gates"])
    monkeypatch.delenv("PYTEST_KVCACHE_COMPARE")
    undecided = "--kv-fail=decode_tps[short]: <= saved"  # no stored run given: inconclusive
    warn = pytester.runpytest_subprocess(f"--kv-rerender={stored}", undecided)
    assert warn.ret == 0
    fail = pytester.runpytest_subprocess(f"--kv-rerender={stored}", undecided, "--kv-inconclusive=fail")
    assert fail.ret == 1, fail.stdout.str()
    missing = pytester.runpytest_subprocess(f"--kv-rerender={stored}", "--kv-noise=nope")
    assert missing.ret == pytest.ExitCode.USAGE_ERROR
    missing.stderr.fnmatch_lines(["ERROR: pytest-kvcache: --kv-noise: no stored run 'nope' in *baselines*"])


# ------------------------------------------------------------------------------------ a user's probe

USER_PROBE = """
import pytest

from pytest_kvcache.probes.registry import ProbeSpec, register
from pytest_kvcache.probes.short import chat_payload

register(ProbeSpec(name="oneline", title="One-line answers", metrics=("decode_tps", "ttft_s"),
                   primary_metric="decode_tps", marker_help="a one-line answer."))


@pytest.mark.oneline
def test_oneline(kv_server, kv_client, kv_record):
    payload = chat_payload(kv_server.model, [{"role": "user", "content": "Name one prime."}], "greedy", 8)
    for index in range(3):
        sample = kv_client.stream_chat(payload)
        kv_record(sample, probe="oneline", shape="prime", phase="measured", index=index)
        assert sample.ok, sample.error
"""


def test_a_probe_in_one_new_file_is_summarised_plotted_and_gated(pytester: pytest.Pytester, args: list[str]) -> None:
    pytester.makepyfile(test_oneline=USER_PROBE)
    base = [a for a in args if a not in ("-m", "short")]
    result = pytester.runpytest_subprocess(
        *base, "--kv-no-suite", "-m", "oneline", "--kv-fail=decode_tps[oneline]: >= 1000000000"
    )
    assert result.ret == 1, result.stdout.str()
    result.assert_outcomes(passed=2, skipped=4)  # the gate failed after round 1: rounds 2–3 not booted
    result.stdout.fnmatch_lines(["One-line answers (measured samples*", "gate FAIL: decode_tps[[]oneline@prime]*"])
    run = latest(pytester)
    report = json.loads((run / "report.json").read_text())
    assert {d["probe"] for d in report["deltas"]} == {"oneline"}
    assert "oneline" in {p["name"] for p in report["probes"]}
    assert "## One-line answers" in (run / "report.md").read_text()
    assert (run / "oneline.png").is_file()
    # The stored run carries the spec: it re-renders and gates without the user's file.
    (pytester.path / "test_oneline.py").unlink()
    again = pytester.runpytest_subprocess(f"--kv-rerender={run}", "--kv-fail=ttft_s[oneline]: <= 1000")
    assert again.ret == 0, again.stdout.str()
    assert "gate PASS: ttft_s[oneline@prime]" in again.stdout.str()


def test_a_gate_on_an_unregistered_probe_is_a_usage_error(pytester: pytest.Pytester, args: list[str]) -> None:
    result = pytester.runpytest_subprocess(*args, "--kv-fail=decode_tps[oneline]: >= 1")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: pytest-kvcache: --kv-fail: gate * unknown probe 'oneline'; known: short*"])
    assert not (pytester.path / ".kvcache" / "runs").exists()


# ------------------------------------------------------------------------------------ light when inactive


@pytest.mark.parametrize("argv", [["--version"], ["--help"], ["-q", "--co", "-p", "no:cacheprovider"]])
def test_an_inactive_plugin_imports_neither_pandas_nor_numpy(tmp_path: Path, argv: list[str]) -> None:
    (tmp_path / "test_x.py").write_text("def test_x():\n    pass\n")
    code = (
        "import sys, pytest\n"
        f"pytest.main({argv!r})\n"
        "heavy = sorted(m for m in ('pandas', 'numpy', 'matplotlib') if m in sys.modules)\n"
        "print('PLUGIN=' + str('pytest_kvcache.plugin' in sys.modules))\n"
        "print('HEAVY=' + ','.join(heavy))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "HEAVY=\n" in done.stdout, done.stdout
    if argv != ["--version"]:  # pytest 9 answers --version before it loads plugins
        assert "PLUGIN=True" in done.stdout, done.stdout


def test_rerender_of_a_copied_run_folder_is_stable(pytester: pytest.Pytester, stored: Path, tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(stored, copy, symlinks=True)
    first = (copy / "report.json").read_text()
    assert cli.main([str(copy)]) == 0
    assert (copy / "report.json").read_text() == first
