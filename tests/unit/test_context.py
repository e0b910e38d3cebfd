"""The model's context before any boot, explicit depths that cannot fit it, defaults left out, and the
agentic fixture scaled to reach a depth while keeping its turns and growth."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pytest_kvcache.config import embedded
from pytest_kvcache.config.constants import SettingsError
from pytest_kvcache.config.context import agentic_target, check_at_boot, config_context
from pytest_kvcache.probes import agentic
from tests.factories import make_settings


def settings(tmp_path: Path, **cli: Any) -> Any:
    return make_settings(tmp_path, arms="auto", **cli)


def test_the_embedded_models_are_named_and_the_trained_one_is_the_default(tmp_path: Path) -> None:
    default = settings(tmp_path)
    assert default.embedded and default.embedded_model == "smollm2-135m" and default.embedded_spec.trained
    assert (default.context_tokens, default.context_source) == (8192, "the embedded smollm2-135m's context")
    assert (default.depths, default.fidelity_depths, default.max_tokens, default.agentic_max_tokens) == (
        (1000, 4000),
        (1000, 4000),
        128,
        64,
    )
    assert default.min_prefill_tps == 10.0 and default.warmups == 1 and default.turns is None
    assert settings(tmp_path, model="embedded").embedded_model == "smollm2-135m"
    tiny = settings(tmp_path, model="embedded:tiny-qwen3")
    assert tiny.embedded and tiny.model is None and not tiny.embedded_spec.trained
    assert (tiny.depths, tiny.turns, tiny.max_tokens, tiny.context_tokens) == ((4000, 16000), 9, None, 131072)
    with pytest.raises(SettingsError, match="embedded models: embedded:smollm2-135m, embedded:tiny-qwen3"):
        settings(tmp_path, model="embedded:llama-70b")
    assert embedded.parse("org/model") is None


def test_the_trained_model_is_served_in_bf16_when_an_arm_has_a_half_precision_kv_cache(tmp_path: Path) -> None:
    """vLLM 0.32's CPU build returns garbage with a float16/bfloat16 KV cache on float32 weights: such a run
    serves the embedded trained model in bfloat16, every arm alike; otherwise float32 (exact, faster)."""
    from pytest_kvcache.engines.kinds.vllm import build_engine_args

    half = make_settings(tmp_path, arms="auto,float16")
    assert half.embedded_dtype == "bfloat16"
    for arm in half.arms:
        args, _ = build_engine_args(half, arm, "/m")
        assert args[args.index("--dtype") + 1] == "bfloat16" and "--load-format" not in args
    plain = make_settings(tmp_path, arms="auto,fp8")
    assert plain.embedded_dtype == "float32"
    args, _ = build_engine_args(plain, plain.arms[1], "/m")
    assert args[args.index("--dtype") + 1] == "float32" and args[args.index("--kv-cache-dtype") + 1] == "fp8_e4m3"
    tiny = make_settings(tmp_path, arms="auto,float16", model="embedded:tiny-qwen3")
    assert tiny.embedded_dtype is None
    args, _ = build_engine_args(tiny, tiny.arms[1], "/m")
    assert "--dtype" not in args and args[args.index("--load-format") + 1] == "dummy"


def test_an_explicit_depth_beyond_a_known_context_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match=r"--kv-depths: 9k \+ 16 output tokens cannot fit the context of 8,192"):
        settings(tmp_path, depths="1k,9k")
    with pytest.raises(SettingsError, match=r"--kv-fidelity-depths: 8192 \+ 1 output token cannot fit"):
        settings(tmp_path, fidelity_depths="8192")
    assert settings(tmp_path, fidelity_depths="8191").fidelity_depths == (8191,)
    with pytest.raises(SettingsError, match="--kv-agentic-depth=9000: a last turn of 9,000 prompt tokens"):
        settings(tmp_path, agentic_depth="9k")
    with pytest.raises(SettingsError, match="--kv-max-tokens=9000 cannot fit"):
        settings(tmp_path, max_tokens="9000")
    # --max-model-len in the engine arguments narrows the context of any model
    with pytest.raises(SettingsError, match=r"context of 2,048 tokens \(--max-model-len 2048\)"):
        settings(tmp_path, model="embedded:tiny-qwen3", engine_args="--max-model-len 2048", depths="4k")


def test_a_default_output_length_beyond_the_context_leaves_its_probe_out_and_an_explicit_one_stops_the_run(
    tmp_path: Path,
) -> None:
    """A user's own probe on an engine with --max-model-len 200: the agentic probe's default 600 output tokens
    (tiny model) cannot fit, which only leaves that probe's requests out (said before the boot); the same
    value given on the command line is a usage error."""
    small = settings(tmp_path, model="embedded:tiny-qwen3", engine_args="--max-model-len 200", depths="100")
    assert small.agentic_max_tokens == 600
    assert any(
        note.startswith("agentic: every request left out, its 600 output tokens (--kv-agentic-max-tokens) exceed")
        for note in small.context_notes
    )
    with pytest.raises(SettingsError, match="--kv-agentic-max-tokens=600 cannot fit the context of 200 tokens"):
        settings(
            tmp_path,
            model="embedded:tiny-qwen3",
            engine_args="--max-model-len 200",
            depths="100",
            agentic_max_tokens="600",
        )


def test_default_depths_beyond_a_model_folders_context_are_left_out_and_said(tmp_path: Path) -> None:
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"text_config": {"max_position_embeddings": 32768}}))
    assert config_context(folder) == 32768
    found = settings(tmp_path, model=str(folder))
    assert found.context_tokens == 32768 and found.context_source == "m/config.json"
    assert found.depths == (10_000,) and found.fidelity_depths == (1000, 8000, 32000)
    assert found.context_notes == (
        "prefill@90k: left out, 90,000 + 16 tokens exceed the context of 32,768 tokens (m/config.json)",
    )
    hub = settings(tmp_path, model="org/model")  # a hub id: known only at the boot
    assert hub.context_tokens is None and hub.depths == (10_000, 90_000)


def test_at_the_first_boot_an_explicit_depth_that_cannot_fit_fails_it(tmp_path: Path) -> None:
    hub = settings(tmp_path, model="org/model", depths="4k,16k")
    error, notes = check_at_boot(hub, 8192, "auto")
    assert error is not None and "--kv-depths: 16k + 16 output tokens cannot fit" in error and "auto's engine" in error
    default = settings(tmp_path, model="org/model")
    error, notes = check_at_boot(default, 32768, "auto")
    assert error is None and notes == [
        "prefill@90k: left out, 90,000 + 16 tokens exceed the context of 32,768 tokens (max_model_len of auto's engine)"
    ]
    assert check_at_boot(settings(tmp_path), 8192, "auto") == (None, [])  # known before: checked then


def test_agentic_depth_values(tmp_path: Path) -> None:
    assert settings(tmp_path).agentic_depth == "fit"
    assert settings(tmp_path, agentic_depth="stock").agentic_depth == "stock"
    assert settings(tmp_path, agentic_depth="6k").agentic_depth == "6000"
    assert settings(tmp_path, agentic_depth="75%").agentic_depth == "75%"
    for bad in ("0%", "deep", "120%"):
        with pytest.raises(SettingsError, match="fit, stock, a token count"):
            settings(tmp_path, agentic_depth=bad)
    assert agentic_target("75%", 8192, 64) == 6080
    assert agentic_target("6000", None, 64) == 6000
    assert agentic_target("fit", 8192, 64) is None and agentic_target("50%", None, 64) is None


def words(body: Any) -> int:
    """A counter standing in for a tokenizer: one token per word, tools included."""
    text = json.dumps(body.get("tools") or []) + " ".join(str(m.get("content") or "") for m in body["messages"])
    return len(text.split())


def test_the_fixture_is_scaled_to_fit_keeping_its_turns_and_growth() -> None:
    stock = agentic.load()
    last = len(stock.turns)
    full = words(agentic.turn_body(stock, last, 1, 0))
    target = full // 5
    fitted, tokens = agentic.fit(stock, words, target, last_turn=last, session_no=1, seed=0, grow=False)
    assert tokens <= target and tokens > 0.97 * target  # as deep as it may go
    assert 0 < fitted.scale < 1 and fitted.stock_sha256 == stock.sha256 and fitted.sha256 != stock.sha256
    assert len(fitted.turns) == len(stock.turns)
    assert [t.user for t in fitted.turns] == [t.user for t in stock.turns]
    for a, b in zip(stock.turns, fitted.turns, strict=True):  # every result scaled alike: the growth curve kept
        assert len(b.result) == round(len(a.result) * fitted.scale) and a.result.startswith(b.result)
    again, _ = agentic.fit(stock, words, target, last_turn=last, session_no=1, seed=0, grow=False)
    assert again.sha256 == fitted.sha256  # deterministic: every arm sends the same prompts
    same, _ = agentic.fit(stock, words, full + 10, last_turn=last, session_no=1, seed=0, grow=False)
    assert same is stock  # fit: a session that fits already stays as committed
    grown, grown_tokens = agentic.fit(stock, words, 2 * full, last_turn=last, session_no=1, seed=0, grow=True)
    assert grown.scale > 1 and 0.97 * 2 * full < grown_tokens <= 2 * full
    with pytest.raises(agentic.FitError, match="without any tool result"):
        agentic.fit(stock, words, 50, last_turn=last, session_no=1, seed=0, grow=False)


def test_the_retrieval_default_reaches_the_limit_without_a_near_duplicate_depth(tmp_path: Path) -> None:
    def depths(context: int) -> tuple[int, ...]:
        folder = tmp_path / f"m{context}"
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps({"max_position_embeddings": context}))
        return tuple(settings(tmp_path, model=str(folder)).retrieval_depths)

    assert depths(131072) == (8000, 32000, 131048)
    assert depths(32768) == (8000, 32744)  # 32k is within 10% below the limit: the limit replaces it
    assert depths(16384) == (8000, 16360)
    assert depths(8192) == (1000, 4000, 8168)  # only the limit left: a shallow depth to compare with
    assert depths(4096) == (1000, 4072)
    explicit = settings(tmp_path, model=str(tmp_path / "m8192"), retrieval_depths="8k")
    assert tuple(explicit.retrieval_depths) == (8000,)
