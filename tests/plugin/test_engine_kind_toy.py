"""A new engine kind is one module: ``toy_kind.py`` (registered from outside the package, with
``@register_kind``) is copied in as a run's conftest and the stand-in engine runs through it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_kvcache.engines.kinds.base import get_kind, kind_names, register_kind, unregister_kind
from pytest_kvcache.run.folder import read_records

TOY = Path(__file__).with_name("toy_kind.py")


@pytest.fixture
def toy() -> Iterator[None]:
    from tests.plugin import toy_kind  # registers the kind in this process too (on its first import)

    register_kind("toy")(toy_kind.ToyKind)
    yield
    unregister_kind("toy")


def test_a_toy_kind_from_one_module_runs_the_standin(
    pytester: pytest.Pytester, standin_args: list[str], toy: None
) -> None:
    from tests.plugin.toy_kind import TOY_COUNTERS

    pytester.makeconftest(TOY.read_text())
    result = pytester.runpytest_subprocess("--kv-engine=toy", "--kv-arms=toy16,toy8", *standin_args)
    result.assert_outcomes(passed=4)  # two short shapes on each arm
    result.stdout.fnmatch_lines(
        [
            "kvcache boot plan — launcher process, engine Toy engine (the stand-in, a kind registered by a test), *",
            "*toy16 (baseline): kv_cache_dtype=auto*",
            "*toy8: kv_cache_dtype=fp8_e4m3*",
        ]
    )
    run = pytester.path / ".kvcache" / "runs" / "latest"
    evidence = json.loads((run / "arms" / "toy8" / "evidence.json").read_text())
    assert evidence["engine_kind"] == "toy"
    assert evidence["cache_config"]["cache_dtype"] == "fp8_e4m3"  # its dtype name became its argument
    assert evidence["log"]["toy_log_lines"] > 0 and evidence["log"]["kv_cache_dtype"] == "fp8_e4m3"  # its parser
    records = read_records(run / "requests.jsonl")
    measured = [r for r in records if r.get("engine")]
    assert measured and all(r["sample"]["ok"] for r in records)
    assert all(set(r["engine"]) - {"lagging"} == set(TOY_COUNTERS) for r in measured)  # its counters, no others


def test_kv_engine_takes_the_registered_kinds(pytester: pytest.Pytester, toy: None) -> None:
    """--kv-engine's choices are the registry's: the run's own toy kind among them; its arm names its own."""
    assert {"vllm", "llamacpp", "openai", "toy"} <= set(kind_names()) and get_kind("toy").title.startswith("Toy")
    pytester.makeconftest(TOY.read_text())
    result = pytester.runpytest_subprocess("--kv-engine=nope", "--kv-arms=auto")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--kv-engine: expected one of vllm, llamacpp, openai, toy; got 'nope'"])
    result = pytester.runpytest_subprocess("--kv-engine=toy", "--kv-arms=fp8")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*unknown arm 'fp8'; valid arms: toy16, toy8"])
