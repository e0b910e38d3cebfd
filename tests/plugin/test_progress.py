"""A long run says where it is: progress lines through pytest's terminal reporter (stand-in engine,
output not a terminal, so plain lines)."""

from __future__ import annotations

import pytest

from tests.plugin.conftest import with_counts


@pytest.fixture
def args(standin_args: list[str]) -> list[str]:
    return with_counts(standin_args, warmups=0, runs=2, extra=("--kv-arms=auto,float16",))


def test_a_two_arm_run_reports_boots_requests_and_an_eta_in_order(pytester: pytest.Pytester, args: list[str]) -> None:
    result = pytester.runpytest_subprocess(*args)
    assert result.ret == 0, result.stdout.str()
    result.stdout.fnmatch_lines(
        [
            "kvcache: run folder */.kvcache/runs/* (requests.jsonl grows as requests finish)",
            "kvcache: auto (1/2) launching …",
            "kvcache: auto ready after * s (cache_dtype=auto, 65,536 KV tokens)",  # no test timed yet: no ETA
            "kvcache: short@narrative auto 1/2 ttft * ms * decode tok/s",
            "kvcache: short@narrative auto 2/2 ttft *",
            "kvcache: 1/4 probe tests done (test_short[[]auto-narrative]); run ETA *",
            "kvcache: float16 (2/2) launching …",
            "kvcache: float16 ready after * s (cache_dtype=float16, 65,536 KV tokens); run ETA *",
            "kvcache: short@code float16 2/2 *",
        ]
    )


def test_quiet_keeps_the_boot_lines_and_drops_the_requests(pytester: pytest.Pytester, args: list[str]) -> None:
    result = pytester.runpytest_subprocess(*args, "-q")
    assert result.ret == 0, result.stdout.str()
    result.stdout.fnmatch_lines(["kvcache: auto (1/2) launching …", "kvcache: float16 ready after *; run ETA *"])
    assert "kvcache: short@" not in result.stdout.str()
    assert "probe tests done" not in result.stdout.str()


def test_progress_off_is_silent(pytester: pytest.Pytester, args: list[str]) -> None:
    result = pytester.runpytest_subprocess(*args, "--kv-progress=off")
    assert result.ret == 0
    assert "kvcache: " not in result.stdout.str()


def test_a_slow_boot_says_what_the_engine_is_doing(
    pytester: pytest.Pytester, standin_args: list[str], tag: str
) -> None:
    slow = [a for a in standin_args if not a.startswith("--kv-engine-args")]
    result = pytester.runpytest_subprocess(
        *slow, "--kv-arms=auto", f"--kv-engine-args={tag} --standin-startup-delay=11", "--kv-runs=1"
    )
    assert result.ret == 0, result.stdout.str()
    result.stdout.fnmatch_lines(
        [
            "kvcache: auto (1/1) launching …",
            "kvcache: auto starting, 10 s: non-default args: *",
            "kvcache: auto ready *",
        ]
    )


def test_a_failed_boot_says_so(pytester: pytest.Pytester, standin_args: list[str], tag: str) -> None:
    failing = [a for a in standin_args if not a.startswith("--kv-engine-args")]
    result = pytester.runpytest_subprocess(
        *failing, "--kv-arms=auto", f"--kv-engine-args={tag} --standin-exit-at-start=2"
    )
    assert result.ret == 1
    result.stdout.fnmatch_lines(["kvcache: auto FAILED: auto: engine exited with code 2 during startup*"])
