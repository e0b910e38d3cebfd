"""The plugin through pytest itself (pytester): help, options, usage errors, configuration sources."""

from __future__ import annotations

import pytest

USER_TEST = """
def test_uses_server(kv_server):
    assert kv_server.url
"""


def test_help_lists_every_option(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--help")
    result.stdout.fnmatch_lines(
        [
            "*pytest-kvcache*",
            "*--kv-arms=A,B*baseline*",
            "*--kv-endpoint=ARM=URL*",
            "*--kv-no-suite*",
            "*kv_arms (string)*",
        ]
    )
    for option in (
        "--kv-launcher",
        "--kv-model",
        "--kv-engine-args",
        "--kv-startup-timeout",
        "--kv-request-timeout",
        "--kv-warmups",
        "--kv-runs",
        "--kv-max-tokens",
        "--kv-sampling",
        "--kv-report-dir",
    ):
        assert option in result.stdout.str()


def test_inactive_without_arms(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_plain="def test_ok():\n    assert True\n", test_user=USER_TEST)
    result = pytester.runpytest("-rs")
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines(["*no --kv-arms given*"])
    assert "boot plan" not in result.stdout.str() and "= kvcache =" not in result.stdout.str()
    assert not (pytester.path / ".kvcache").exists()


def test_markers_are_registered(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--markers")
    result.stdout.fnmatch_lines(["*short: short-context probe*"])


def test_collect_only_shows_the_boot_plan_without_booting(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--collect-only", "-q", "--kv-arms=auto,float16,auto")
    result.stdout.fnmatch_lines(
        [
            "kvcache boot plan*",
            "  fidelity sized for the CPU: depths 1k,4k, window 512 (elsewhere: --kv-fidelity-depths=1k,8k,32k*",
            "  capacity sized for the CPU: depths 2k,4k, SLO ttft_p95<=200ms,itl_p95<=100ms, think 1 s, 5 s measured "
            "per trial, 16 tokens a turn, 1 to at most 32 sessions; each arm's own KV cache (no --kv-cache-bytes)",
            "  1. auto (baseline): kv_cache_dtype=auto — 16 test(s)",
            "  2. float16: kv_cache_dtype=float16 — 16 test(s)",
            "  3. auto.2: kv_cache_dtype=auto — 16 test(s)",
            "*test_short[[]auto-narrative]",
            "*test_short[[]auto-code]",
            "*test_short[[]float16-narrative]",
            "*test_short[[]auto.2-code]",
        ]
    )
    assert result.ret == 0
    assert not (pytester.path / ".kvcache").exists()


def test_the_boot_plan_states_the_trained_models_sizes_and_context(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The default embedded model (trained, 8K): its CPU sizes and its context are in the plan; collecting
    needs no conversion (--collect-only converts nothing)."""
    monkeypatch.delenv("PYTEST_KVCACHE_MODEL")
    result = pytester.runpytest("--collect-only", "-q", "--kv-arms=auto,auto")
    result.stdout.fnmatch_lines(
        [
            "kvcache boot plan — launcher process, model embedded:smollm2-135m — SmolLM2-135M-Instruct (trained; "
            "Apache-2.0), float32 on vLLM:",
            "  context 8,192 tokens (the embedded smollm2-135m's context): no request beyond it is sent",
            "  short probes sized for the CPU: 128 tokens, 1 warmup(s) + 5 runs a shape*",
            "  depth probes sized for the CPU: depths 1k,4k, 1 agentic session(s) of all turns, 64 tokens a turn, "
            "agentic depth fit*",
            "  fidelity sized for the CPU: depths 1k,4k, window 256*",
        ]
    )
    result = pytester.runpytest("--collect-only", "-q", "--kv-arms=auto", "--kv-depths=10k")
    assert result.ret == 4
    result.stderr.fnmatch_lines(["*--kv-depths: 10k + 16 output tokens cannot fit the context of 8,192 tokens*"])


def test_no_suite_collects_only_user_tests(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_user=USER_TEST)
    result = pytester.runpytest("--collect-only", "-q", "--kv-arms=auto,float16", "--kv-no-suite")
    result.stdout.fnmatch_lines(
        ["test_user.py::test_uses_server[[]auto]", "test_user.py::test_uses_server[[]float16]", "2 tests collected*"]
    )


def test_user_tests_are_grouped_by_arm(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_a=USER_TEST.replace("test_uses_server", "test_a"),
        test_b=USER_TEST.replace("test_uses_server", "test_b"),
    )
    result = pytester.runpytest("--collect-only", "-q", "--kv-arms=auto,float16", "--kv-no-suite")
    ids = [line for line in result.stdout.lines if "::" in line]
    assert ids == [
        "test_a.py::test_a[auto]",
        "test_b.py::test_b[auto]",
        "test_a.py::test_a[float16]",
        "test_b.py::test_b[float16]",
    ]


def test_marker_selection(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_user=USER_TEST)
    result = pytester.runpytest("--collect-only", "-q", "--kv-arms=auto,float16", "-m", "short")
    result.stdout.fnmatch_lines(["*4/34 tests collected (30 deselected)*"])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--kv-arms=auto,fp9"], "ERROR: pytest-kvcache: unknown arm 'fp9'; valid arms: *fp8_e4m3*"),
        (["--kv-arms=fp8,int8"], "ERROR: pytest-kvcache: arm(s) int8 (int8_per_token_head) need a GPU*"),
        (
            ["--kv-arms=auto", "--kv-endpoint=auto=http://127.0.0.1:9"],
            "ERROR: pytest-kvcache: --kv-endpoint requires --kv-launcher=external",
        ),
        (
            ["--kv-arms=auto,float16", "--kv-launcher=external", "--kv-endpoint=auto=http://127.0.0.1:9"],
            "ERROR: pytest-kvcache: --kv-launcher=external needs --kv-endpoint ARM=URL for: float16",
        ),
        (
            [
                "--kv-arms=auto",
                "--kv-launcher=external",
                "--kv-endpoint=auto=http://127.0.0.1:9",
                "--kv-endpoint=x=http://127.0.0.1:8",
            ],
            "ERROR: pytest-kvcache: --kv-endpoint names arm(s) not in*: x*",
        ),
        (["--kv-arms=auto", "--kv-runs=zero"], "ERROR: pytest-kvcache: --kv-runs: expected a whole number*"),
        (
            ["--kv-arms=auto", "--kv-model=./no/such/model"],
            "ERROR: pytest-kvcache: --kv-model: model folder './no/such/model' does not exist",
        ),
    ],
)
def test_usage_errors_exit_4_without_traceback(pytester: pytest.Pytester, args: list[str], message: str) -> None:
    result = pytester.runpytest(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])
    assert "Traceback" not in result.stdout.str() + result.stderr.str()
    assert not (pytester.path / ".kvcache").exists()


def test_pyproject_arms_and_ini_options(pytester: pytest.Pytester) -> None:
    pytester.makepyprojecttoml("""
        [tool.pytest.ini_options]
        kv_arms = "auto,noprefix"
        kv_runs = "2"

        [tool.pytest_kvcache.arms.noprefix]
        args = ["--no-enable-prefix-caching"]
    """)
    result = pytester.runpytest("--collect-only", "-q")
    result.stdout.fnmatch_lines(["  2. noprefix: kv_cache_dtype=default args=--no-enable-prefix-caching — 16 test(s)"])


def test_env_beats_ini_and_cli_beats_env(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    pytester.makeini("[pytest]\nkv_arms = auto\n")
    monkeypatch.setenv("PYTEST_KVCACHE_ARMS", "auto,float16")
    result = pytester.runpytest("--collect-only", "-q")
    result.stdout.fnmatch_lines(["  2. float16*"])
    result = pytester.runpytest("--collect-only", "-q", "--kv-arms=float16")
    result.stdout.fnmatch_lines(["  1. float16 (baseline)*"])
    assert "2. " not in result.stdout.str()


def test_bad_pyproject_arm_is_a_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makepyprojecttoml("""
        [tool.pytest_kvcache.arms.x]
        kv_cache_dtype = "fp99"
    """)
    result = pytester.runpytest("--kv-arms=x")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*[[]tool.pytest_kvcache.arms.x[]]: unknown kv_cache_dtype 'fp99'*"])
