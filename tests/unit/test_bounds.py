"""Issue 45, round 3: every count option has an upper bound, every depth option beyond a known context is a usage
error, every gate given is evaluated or an error with its reason, and model metadata of the wrong shape is a
usage error naming the file."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from pytest_kvcache.config import values as v
from pytest_kvcache.config.constants import SettingsError
from pytest_kvcache.config.context import check_at_boot, config_context
from pytest_kvcache.config.model_files import ModelFileError, check_folder, validate
from pytest_kvcache.config.settings import OPTIONS, Settings
from pytest_kvcache.probes import registry
from pytest_kvcache.report import gates
from tests.factories import make_settings as _make_settings
from tests.unit.test_docs import ROOT

# ------------------------------------------------------------------------------------------------ bounds


def make_settings(tmp_path: Path, arms: str = "auto", **options: Any) -> Settings:
    return _make_settings(tmp_path, arms=arms, **options)


def _count_options() -> list[tuple[str, object]]:
    """Every option whose parser reads a whole number (it takes "1" and gives an int back)."""
    found: list[tuple[str, object]] = []
    for spec in OPTIONS:
        if spec.parse is None or spec.parse is v.size:  # a byte size: the KV budget rule checks it against the model
            continue
        try:
            value = spec.parse("1")
        except (SettingsError, TypeError, ValueError):
            continue
        if (isinstance(value, int) and not isinstance(value, bool)) or value == (1,):
            found.append((spec.cli, spec.parse))
    return found


def test_the_count_options_are_found() -> None:
    names = {cli for cli, _ in _count_options()}
    for cli in ("--kv-runs", "--kv-replicates", "--kv-capacity-start", "--kv-capacity-max-sessions", "--kv-turns"):
        assert cli in names
    assert "--kv-concurrency" in names and "--kv-seed" in names and "--kv-port" in names


@pytest.mark.parametrize(("cli", "parse"), _count_options(), ids=[cli for cli, _ in _count_options()])
def test_every_count_option_has_an_upper_bound_and_its_docs_say_it(cli: str, parse: object) -> None:
    assert callable(parse)
    with pytest.raises(SettingsError):
        parse(str(10**12))
    bounds = (ROOT / "docs" / "configuration.md").read_text().split("### Bounds", 1)[1].split("\n## ", 1)[0]
    assert f"`{cli}`" in bounds or f"`{cli}=" in bounds, f"{cli} has no row in configuration.md's Bounds"


def test_count_takes_its_range_and_names_it() -> None:
    parse = v.count(1, 4096)
    assert parse("1") == 1 and parse(" 4096 ") == 4096 and parse(7) == 7
    with pytest.raises(SettingsError, match=r"^expected a whole number from 1 to 4,096, got '4097'$"):
        parse("4097")
    with pytest.raises(SettingsError, match=r"^expected a whole number >= 1, got '0'$"):
        parse("0")
    with pytest.raises(SettingsError, match="expected a whole number, got 'x'"):
        parse("x")


def test_the_bounds_are_generous_for_real_gpu_use() -> None:
    assert v.MAX_REPLICATES >= 20 and v.MAX_BOOT_BUDGET >= 2 * v.MAX_REPLICATES
    assert v.MAX_CAPACITY_SESSIONS >= 4096 and v.MAX_RUNS >= 1000 and v.MAX_TOKENS >= 1_000_000


def test_a_bound_is_checked_from_every_source(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match=r"^--kv-capacity-start: expected a whole number from 1 to 4,096"):
        make_settings(tmp_path, capacity_start="100000")
    with pytest.raises(SettingsError, match=r"^PYTEST_KVCACHE_REPLICATES: expected a whole number from 1 to 20"):
        make_settings(tmp_path, env={"PYTEST_KVCACHE_REPLICATES": "21"})
    with pytest.raises(SettingsError, match=r"^--kv-max-replicates: expected a whole number from 1 to 40"):
        make_settings(tmp_path, max_replicates="1000000", fail="ttft_s[short]: <= 5")
    assert make_settings(tmp_path, replicates="20").replicates == 20


# ------------------------------------------------------------------------------------------------ depths


def test_an_explicit_capacity_depth_beyond_a_known_context_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(
        SettingsError,
        match=r"^--kv-capacity-depths: 16k \+ 16 output tokens \(--kv-capacity-max-tokens\) cannot fit the context of "
        r"8,192 tokens \(the embedded smollm2-135m's context\); give depths up to 8,176$",
    ):
        make_settings(tmp_path, capacity_depths="1k,16k")
    assert make_settings(tmp_path, capacity_depths="8176").capacity_depths == (8176,)
    with pytest.raises(SettingsError, match=r"8177 \+ 16 output tokens"):
        make_settings(tmp_path, capacity_depths="8177")
    with pytest.raises(SettingsError, match=r"--kv-capacity-max-tokens=9000 cannot fit the context of 8,192"):
        make_settings(tmp_path, capacity_max_tokens="9000")


def test_default_capacity_depths_beyond_the_context_are_left_out_and_said(tmp_path: Path) -> None:
    found = make_settings(tmp_path, model="org/model", engine_args="--max-model-len 20000")
    assert found.capacity_depths == (16_000,)
    assert "capacity@32k: left out, 32,000 + 64 tokens exceed the context of 20,000 tokens (--max-model-len 20000)" in (
        found.context_notes
    )


def test_at_the_first_boot_an_explicit_capacity_depth_that_cannot_fit_fails_it(tmp_path: Path) -> None:
    external = make_settings(tmp_path, model="org/model", capacity_depths="4k")
    error, _ = check_at_boot(external, 2048, "auto")
    assert error == (
        "--kv-capacity-depths: 4k + 64 output tokens (--kv-capacity-max-tokens) cannot fit the context of 2,048 "
        "tokens (max_model_len of auto's engine); give depths up to 1,984"
    )
    error, notes = check_at_boot(make_settings(tmp_path, model="org/model"), 20_000, "auto")
    assert error is None and any(n.startswith("capacity@32k: left out") for n in notes)


# ------------------------------------------------------------------------------------------------ gates


def test_a_gate_that_cannot_be_evaluated_says_why() -> None:
    specs = {s.name: s for s in registry.specs()}
    one = ["auto"]
    assert "no second arm" in str(gates.unusable(gates.parse("ttft_s[short]: <= +10%"), one))
    assert gates.unusable(gates.parse("ttft_s[short]: <= +10%"), ["auto", "fp8"]) is None
    assert gates.unusable(gates.parse("ttft_s[short]: <= 1"), one) is None
    fidelity = gates.parse("logprob_drift[fidelity]: <= 0.01")
    assert "no second arm" in str(gates.unusable(fidelity, one, specs))
    assert "the baseline has no figures" in str(
        gates.unusable(gates.parse("logprob_drift[fidelity]: auto <= 0.01"), ["auto", "fp8"], specs)
    )
    at = gates.parse("ttft_s[prefill@32k]: <= 1")
    assert gates.unusable(at, one, points={"prefill": ("1k", "4k")}) == (
        "prefill has no point 32k in this run (its points: 1k, 4k)"
    )
    assert gates.unusable(at, one, points={"prefill": ("32k",)}) is None


def test_a_single_arm_baseline_gate_is_a_usage_error_before_any_boot(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match=r"^--kv-fail: gate 'ttft_s\[short\]: <= \+10%' cannot be evaluated: it"):
        make_settings(tmp_path, fail="ttft_s[short]: <= +10%")
    with pytest.raises(SettingsError, match=r"prefill has no point 32k in this run \(its points: 1k, 4k\)"):
        make_settings(tmp_path, arms="auto,float16", fail="ttft_s[prefill@32k]: <= +10%")
    assert make_settings(tmp_path, arms="auto,float16", fail="ttft_s[prefill@4k]: <= +10%").gates


def _frame(arms: list[str], metric: str = "decode_tps") -> pd.DataFrame:
    rows = [
        {"probe": "short", "point": "code", "arm": arm, "boot": arm, "valid": True, metric: 100.0 + i}
        for arm in arms
        for i in range(4)
    ]
    return pd.DataFrame(rows)


@pytest.mark.parametrize(
    ("text", "arms", "reason"),
    [
        ("ttft_s[short]: <= +10%", ["auto"], "no second arm"),
        ("decode_tps[prefill]: >= 1", ["auto"], "no prefill test ran in this run"),
        ("ttft_s[short]: <= 5", ["auto"], "no short sample of this run has ttft_s (never measured)"),
        ("decode_tps[short@narrative]: >= 1", ["auto"], "short has no point narrative in this run (its points: code)"),
        ("decode_tps[short]: >= saved", ["auto", "fp8"], "the stored run (--kv-compare) has no short figures of arm"),
    ],
)
def test_every_gate_given_is_among_the_outcomes(text: str, arms: list[str], reason: str) -> None:
    data = _frame(arms)
    saved = _frame(["auto"])
    results = gates.evaluate([gates.parse(text)], data, arms, seed=0, saved=saved)
    assert [r["outcome"] for r in results] == ["error"]
    assert results[0]["gate"] == text and reason in results[0]["reason"]


def test_an_error_gate_fails_the_run() -> None:
    from pytest_kvcache.report.judge import Judgement, exit_code

    error = gates.evaluate([gates.parse("decode_tps[prefill]: >= 1")], _frame(["auto"]), ["auto"], seed=0)
    assert exit_code(Judgement(gate_results=error, failed_gates=error)) == 1


# ------------------------------------------------------------------------------------------------ model files


@pytest.mark.parametrize(
    ("name", "data", "message"),
    [
        ("config.json", [1, 2], "expected a JSON object, got a list"),
        ("config.json", {"num_hidden_layers": "30"}, 'num_hidden_layers must be a positive whole number, got "30"'),
        ("config.json", {"head_dim": [64]}, "head_dim must be a positive whole number, got [64]"),
        ("config.json", {"max_position_embeddings": None}, "max_position_embeddings must be a positive whole number"),
        ("config.json", {"num_key_value_heads": True}, "num_key_value_heads must be a positive whole number, got true"),
        ("config.json", {"text_config": {"head_dim": "64"}}, "text_config.head_dim must be a positive whole number"),
        ("config.json", {"text_config": []}, "text_config must be an object, got []"),
        ("config.json", {"torch_dtype": 16}, "torch_dtype must be a string, got 16"),
        ("tokenizer_config.json", "text", "expected a JSON object, got a string"),
        ("tokenizer_config.json", {"chat_template": 5}, "chat_template must be a template string"),
        ("generation_config.json", {"temperature": "hot"}, 'temperature must be a number, got "hot"'),
        ("generation_config.json", {"eos_token_id": "2"}, "eos_token_id must be a token id"),
    ],
)
def test_model_metadata_of_the_wrong_shape_is_a_usage_error_naming_the_file(
    tmp_path: Path, name: str, data: object, message: str
) -> None:
    (tmp_path / name).write_text(json.dumps(data))
    with pytest.raises(ModelFileError, match=re.escape(f"{tmp_path / name}: {message}")):
        check_folder(tmp_path)
    assert issubclass(ModelFileError, SettingsError)


def test_model_metadata_of_the_right_shape_is_read() -> None:
    path = Path("config.json")
    good = {
        "num_hidden_layers": 30,
        "head_dim": 64,
        "max_position_embeddings": 8192,
        "rope_theta": 10000.0,
        "eos_token_id": [1, 2],
        "bos_token_id": None,
        "kv_lora_rank": None,
        "anything_else": [None, "x"],
    }
    assert validate(good, path) == good
    assert validate({"pad_token": None, "eos_token": {"content": "</s>"}}, Path("tokenizer_config.json"))
    assert validate({"chat_template": [{"name": "default", "template": "x"}]}, Path("tokenizer_config.json"))


def test_the_context_reader_refuses_a_config_that_is_a_list(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("[1]")
    with pytest.raises(ModelFileError, match=r"config\.json: expected a JSON object, got a list"):
        config_context(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ModelFileError, match=r"config\.json: not valid JSON"):
        config_context(tmp_path)
    (tmp_path / "config.json").unlink()
    assert config_context(tmp_path) is None


def test_a_model_folder_of_the_wrong_shape_is_refused_at_resolution(tmp_path: Path) -> None:
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_text('{"max_position_embeddings": 8192}')
    (folder / "generation_config.json").write_text('{"max_new_tokens": -1}')
    with pytest.raises(SettingsError, match=r"^--kv-model: .*/m/generation_config.json: max_new_tokens must be"):
        make_settings(tmp_path, model=str(folder))
