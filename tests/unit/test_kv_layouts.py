"""KV arithmetic per attention layout: a model's layers from its config.json (config.kv_layout), what vLLM makes
of a KV budget (engines/kinds/vllm_kv.py), held to the figures vLLM's CPU build reported for reduced-size shapes
of each layout (tests/data/kv_layouts/, written by fixtures/kv_layouts.py --measure); the budget rule on top of
it; the log's maximum-concurrency line; and the report's planned-against-reported rows."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from pytest_kvcache.config import budget
from pytest_kvcache.config.constants import SettingsError
from pytest_kvcache.config.kv_layout import KvLayout
from pytest_kvcache.config.resolve import resolve
from pytest_kvcache.datafiles import embedded_model_path
from pytest_kvcache.engines.kinds import vllm_kv
from pytest_kvcache.engines.kinds.vllm import parse_log
from pytest_kvcache.report import kv_plan
from pytest_kvcache.report.load import RunData

DATA = Path(__file__).resolve().parents[1] / "data" / "kv_layouts"
MEASURED = sorted(DATA.glob("*.json"))
#: the same shapes (and the issue's Gemma-3-270M) on vLLM's CUDA build, auto and fp8 (scripts/h200/kv-layouts.sh)
MEASURED_GPU = sorted(DATA.glob("gpu/*.json"))


def _record(path: Path) -> dict[str, Any]:
    return cast(dict[str, Any], json.loads(path.read_text()))


def _plan(config: dict[str, Any], budget_bytes: int, length: int, args: Sequence[str] = (), *, cpu: bool = True) -> Any:
    """vLLM's plan for ``config`` at ``budget_bytes``, its weights dtype from ``--dtype`` in ``args`` or the config,
    its KV dtype from ``--kv-cache-dtype`` there."""
    layout = KvLayout.from_config(config)
    assert layout is not None
    found = budget.need(layout, budget.flag_value(list(args), "--kv-cache-dtype"), list(args), [])
    element = found.element if found is not None else layout.model_bytes
    knobs = vllm_kv.knobs(args, layout, length, cpu=cpu, env={})
    return vllm_kv.plan(layout, element, budget_bytes, length, knobs)


def test_every_layout_was_measured() -> None:
    names = {p.stem for p in MEASURED}
    assert {"llama", "qwen3-moe", "gemma3", "gpt-oss", "mistral-swa", "llama4-chunked", "deepseek-v2-mla"} <= names


@pytest.mark.parametrize(
    "path", MEASURED + MEASURED_GPU, ids=[p.stem for p in MEASURED] + [f"gpu-{p.stem}" for p in MEASURED_GPU]
)
def test_the_plan_matches_what_vllm_reported(path: Path) -> None:
    """Planned KV tokens within 1% of what vLLM reported (its CPU build; its CUDA build on an H100/H200), its
    concurrency to the log's two decimals; a layout not modelled gives no figure, and says why."""
    record = _record(path)
    reported = record["reported"]
    cpu = record.get("platform", "cpu") == "cpu"
    plan = _plan(record["config"], record["kv_cache_bytes"], record["max_model_len"], record["engine_args"], cpu=cpu)
    if "kv_cache_size_tokens" not in reported:
        # the engine could not serve it (vLLM 0.25.1's CUDA build and the Granite-4 hybrid's layer_types): no figure
        # to hold the plan to, and the plan gives none either
        assert "error" in reported and plan.tokens is None and plan.not_modelled, (plan, reported)
        return
    if plan.tokens is None:
        assert plan.not_modelled, plan
        return
    assert plan.tokens == pytest.approx(reported["kv_cache_size_tokens"], rel=0.01), (plan, reported)
    assert round(plan.concurrency, 2) == pytest.approx(reported["max_concurrency"], abs=0.011)
    assert reported["max_concurrency_len"] == record["max_model_len"]


def test_the_issue_s_gemma_3_270m_on_the_h200() -> None:
    """Issue 42: 18 layers, 15 on a 512-token window, 1 KV head × 256, bf16, 1 GiB at 32K on vLLM 0.25.1 (16-token
    blocks, 8,192 batched tokens): the old arithmetic said 58,254 tokens at 18,432 B/token; vLLM allocated 2.57×
    that, and fits one 32K request in ~224 MiB (512 MiB was refused as too small)."""
    config = {
        "model_type": "gemma3_text",
        "num_hidden_layers": 18,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "head_dim": 256,
        "hidden_size": 640,
        "sliding_window": 512,
        "layer_types": (["sliding_attention"] * 5 + ["full_attention"]) * 3,
        "max_position_embeddings": 32768,
        "torch_dtype": "bfloat16",
    }
    layout = KvLayout.from_config(config)
    assert layout is not None and layout.bytes_per_token(2.0) == 18432
    plan = _plan(config, 2**30, 32768, cpu=False)
    assert plan.tokens / 58254 == pytest.approx(2.57, abs=0.005)
    assert plan.request_bytes / 2**20 == pytest.approx(224, abs=0.5)
    assert plan.groups.startswith("6 groups of 3 layers, 16-token blocks of 48 KiB")
    found = budget.need(layout, "auto", ["--max-model-len", "32768"], [])
    assert found is not None
    half = _plan(config, 512 * 2**20, 32768, cpu=False)
    assert budget.refusal("auto", 512 * 2**20, found, "auto", half) is None
    tight = _plan(config, 200 * 2**20, 32768, cpu=False)
    why = budget.refusal("auto", 200 * 2**20, found, "auto", tight)
    assert why is not None and "give at least 223.8 MiB (234651648 bytes)" in why and "sliding-window (512)" in why


def test_the_embedded_models_plan_what_the_cpu_build_reports() -> None:
    """tiny-qwen3 at the CPU default's 2 GiB: 1,048,576 tokens, 8.00x at 131,072 (the CPU log line); a 40 MiB
    budget at 8,192: 20,480 (the capacity run's)."""
    tiny = budget.model_shape(embedded_model_path())
    assert tiny is not None and tiny.all_full
    plan = _plan(json.loads((embedded_model_path() / "config.json").read_text()), 2 * 2**30, 131072)
    assert (plan.tokens, round(plan.concurrency, 2)) == (1048576, 8.0)
    config = json.loads((embedded_model_path() / "config.json").read_text())
    assert _plan(config, 40 * 2**20, 8192).tokens == 20480
    # vLLM 0.32 holds a null block aside: at 8,192 tokens 16 MiB (64 blocks, one request) was refused, 16.25 MiB
    # served 8,320 tokens (fixtures/kv_layouts.py's boot(), 2026-12-06); the rule names the 16.25 MiB
    edge = _plan(config, 16 * 2**20, 8192)
    assert (edge.request_bytes, edge.block_bytes) == (16 * 2**20, 2**18)
    assert _plan(config, 16 * 2**20 + 2**18, 8192).tokens == 8320


@pytest.mark.parametrize(
    ("config", "kinds", "unmodelled"),
    [
        # Qwen2.5 carries a window it does not use
        ({"model_type": "qwen2", "sliding_window": 131072, "use_sliding_window": False}, ["full"] * 4, ""),
        (
            {"model_type": "qwen3", "sliding_window": 4096, "use_sliding_window": True, "max_window_layers": 2},
            ["full", "full", "sliding", "sliding"],
            "",
        ),
        ({"model_type": "gemma2", "sliding_window": 4096}, ["sliding", "full"] * 2, ""),
        ({"model_type": "cohere2", "sliding_window": 4096}, ["sliding"] * 3 + ["full"], ""),
        (
            {"model_type": "gpt_oss", "sliding_window": 128, "layer_types": ["full_attention"] * 4},
            ["sliding", "full"] * 2,
            "",
        ),
        ({"model_type": "mistral", "sliding_window": 4096}, ["sliding"] * 4, ""),
        ({"model_type": "mistral", "sliding_window": None}, ["full"] * 4, ""),
        ({"model_type": "llama4_text", "attention_chunk_size": 8192}, ["chunked"] * 3 + ["full"], ""),
        (
            {"model_type": "llama4_text", "attention_chunk_size": 8192, "no_rope_layers": [1, 0, 1, 0]},
            ["chunked", "full"] * 2,
            "",
        ),
        ({"model_type": "qwen3_next"}, ["state"] * 3 + ["full"], "3 of 4 layers keep a fixed-size state"),
        (
            {"model_type": "jamba", "attn_layer_period": 4, "attn_layer_offset": 2},
            ["state"] * 2 + ["full", "state"],
            "3 of 4 layers",
        ),
        (
            {"model_type": "nemotron_h", "hybrid_override_pattern": "M-*-"},
            ["state", "none", "full", "none"],
            "1 of 4 layers",
        ),
        (
            {"model_type": "granitemoehybrid", "layer_types": ["mamba"] * 3 + ["attention"]},
            ["state"] * 3 + ["full"],
            "3 of 4 layers",
        ),
        ({"model_type": "falcon_h1"}, ["full"] * 4, "falcon_h1 model's state layers"),
        ({"model_type": "gemma3n_text", "num_kv_shared_layers": 2}, ["full"] * 4, "reuse earlier layers' KV"),
        ({"model_type": "x", "layer_types": ["full_attention", "weird"] * 2}, ["full"] * 4, "layer type(s) weird"),
    ],
)
def test_layer_kinds_as_the_model_code_reads_them(config: dict[str, Any], kinds: list[str], unmodelled: str) -> None:
    base = {"num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64}
    layout = KvLayout.from_config({**base, **config})
    assert layout is not None
    assert [layer.kind for layer in layout.layers] == kinds
    assert unmodelled in layout.unmodelled and bool(layout.unmodelled) == bool(unmodelled)


def test_latent_attention_keeps_one_vector_a_token_a_layer() -> None:
    config = {
        "model_type": "deepseek_v2",
        "num_hidden_layers": 27,
        "num_attention_heads": 16,
        "hidden_size": 2048,
        "kv_lora_rank": 512,
        "qk_rope_head_dim": 64,
        "qk_nope_head_dim": 128,
        "v_head_dim": 128,
    }
    layout = KvLayout.from_config(config)
    assert layout is not None and layout.describe() == "27 layers × latent 576"
    assert layout.bytes_per_token(2.0) == 27 * 576 * 2
    assert KvLayout.from_config({**config, "use_mla": False}).bytes_per_token(2.0) == 27 * 16 * 256 * 2  # type: ignore[union-attr]


def test_per_layer_kv_heads_are_one_group_of_different_pages() -> None:
    """OpenELM-style per-layer KV heads: vLLM puts full layers of different sizes in one group (a block holds each
    layer's page)."""
    config = {
        "model_type": "llama",
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "head_dim": 64,
        "num_key_value_heads": [1, 2, 4],
    }
    layout = KvLayout.from_config(config)
    assert layout is not None and layout.bytes_per_token(2.0) == (1 + 2 + 4) * 128 * 2
    plan = _plan(config, 7 * 256 * 128 * 10, 1280)  # 10 blocks of 128 tokens a layer: one request of 1,280
    assert (plan.tokens, plan.concurrency) == (1280, 1.0)


def test_engine_settings_change_the_windowed_groups() -> None:
    """Batched tokens, the block size, async scheduling on a GPU build (no change, measured), the hybrid manager
    switched off, tensor parallelism: each from its flag, else the build's default, and said."""
    config = _record(DATA / "gemma3.json")["config"]
    layout = KvLayout.from_config(config)
    assert layout is not None
    default = vllm_kv.knobs([], layout, 16384, cpu=True)
    assert (default.block_size, default.in_flight) == (128, 2048)
    wide = vllm_kv.knobs(["--max-num-batched-tokens", "8192", "--block-size=32"], layout, 16384, cpu=True)
    assert (wide.block_size, wide.in_flight) == (32, 8192) and "(--max-num-batched-tokens)" in " ".join(wide.said)
    # async scheduling keeps one batch's allowance: vLLM 0.25.1 on an H100 reported the same KV tokens with it
    gpu = vllm_kv.knobs(["--async-scheduling"], layout, 16384, cpu=False)
    assert (gpu.block_size, gpu.in_flight) == (16, 8192)
    off = vllm_kv.plan(
        layout, 2.0, 64 * 2**20, 16384, vllm_kv.knobs(["--disable-hybrid-kv-cache-manager"], layout, 16384, cpu=True)
    )
    assert off.groups.startswith("1 group of 13 layers") and off.tokens == 64 * 2**20 // (13 * 128 * 256) * 128
    tp = vllm_kv.knobs(["-tp", "2"], layout, 16384, cpu=False)
    assert tp.tensor_parallel == 2
    mla = KvLayout.from_config(_record(DATA / "deepseek-v2-mla.json")["config"])
    assert mla is not None and vllm_kv.knobs([], mla, 4096, cpu=True).block_size == 16  # the CPU MLA kernel's


@pytest.mark.parametrize(
    ("args", "why"),
    [
        (["-pp", "2"], "pipeline parallelism"),
        (["--speculative-config", '{"method": "eagle", "model": "x"}'], "draft model"),
        (["--kv-transfer-config", "{}"], "KV connector"),
    ],
)
def test_settings_not_modelled_give_no_figure(args: list[str], why: str) -> None:
    plan = _plan(_record(DATA / "llama.json")["config"], 64 * 2**20, 4096, args)
    assert plan.tokens is None and why in plan.not_modelled
    ngram = _plan(
        _record(DATA / "llama.json")["config"],
        64 * 2**20,
        4096,
        ["--speculative-config", '{"method": "ngram", "num_speculative_tokens": 3}'],
    )
    assert ngram.tokens == 43648


def test_a_state_layout_is_never_refused_nor_given_a_wrong_figure(tmp_path: Path) -> None:
    """Qwen3-Next's linear-attention layers keep a fixed-size state: no planned figure, no refusal, however small
    the budget (the engine decides); the old arithmetic counted its 4 layers as full attention."""
    folder = tmp_path / "hybrid"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(_record(DATA / "qwen3-next-hybrid.json")["config"]))
    settings = resolve(
        {"model": str(folder), "arms": "auto", "cache_bytes": "1MiB", "engine_args": "--max-model-len 4096"},
        {},
        {},
        {},
        tmp_path,
    )
    from pytest_kvcache.config.resolve import arm_plan

    plan = arm_plan(settings, settings.arms[0])
    assert plan is not None and plan.tokens is None and "fixed-size state" in plan.not_modelled


def test_a_windowed_budget_is_judged_by_the_windows(tmp_path: Path) -> None:
    """The gemma3 shape at 16K: 17.5 MiB holds one request (vLLM's CPU build: 254 blocks of 64 KiB is 15.9 MiB),
    though every layer counted full would need 52 MiB; 15 MiB does not, and the refusal names the windows."""
    folder = tmp_path / "gemma3"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(_record(DATA / "gemma3.json")["config"]))
    cli = {"model": str(folder), "arms": "auto", "engine_args": "--max-model-len 16384"}
    assert resolve({**cli, "cache_bytes": "17.5MiB"}, {}, {}, {}, tmp_path).cache_bytes == int(17.5 * 2**20)
    with pytest.raises(SettingsError, match=r"holds 15,\d{3} tokens .*sliding-window \(512\).*give at least 15.94 MiB"):
        resolve({**cli, "cache_bytes": "15MiB"}, {}, {}, {}, tmp_path)


def test_the_log_s_maximum_concurrency_is_read_on_its_line_or_its_own() -> None:
    one = (
        "INFO [kv_cache_utils.py:2327] CPU KV cache size: 66,052 tokens, Maximum concurrency for 16,384 tokens "
        "per request: 4.03x"
    )
    found = parse_log(one)
    assert (found["kv_cache_size_tokens"], found["kv_max_concurrency"], found["kv_concurrency_len"]) == (
        66052,
        4.03,
        16384,
    )
    two = "INFO GPU KV cache size: 149,972 tokens\nINFO Maximum concurrency for 32,768 tokens per request: 4.58x"
    found = parse_log(two)
    assert (found["kv_cache_size_tokens"], found["kv_max_concurrency"]) == (149972, 4.58)


def _run(plan: list[dict[str, Any]], evidence: dict[str, Any]) -> RunData:
    meta = {"plan": plan, "settings": {"arms": [{"name": "auto"}, {"name": "fp8"}]}}
    return cast(RunData, SimpleNamespace(meta=meta, evidence=evidence, records=[], arms=["auto", "fp8"]))


def test_the_report_sets_plan_beside_engine_and_flags_over_2_percent() -> None:
    planned = {
        "layout": "13 layers: 11 sliding-window (512) + 2 full, 1 KV head × 64",
        "budget_bytes": 2**26,
        "max_model_len": 16384,
        "tokens": 66052,
        "concurrency": 4.0315,
        "request_bytes": 16646144,
        "groups": "7 groups of 2 layers (1 padding)",
        "assumptions": "128-token blocks",
        "not_modelled": "",
    }
    plan = [
        {"boot": "auto", "arm": "auto", "kv_plan": planned},
        {"boot": "fp8", "arm": "fp8", "kv_plan": {**planned, "tokens": 132104, "concurrency": 8.06}},
    ]
    evidence = {
        "auto": {"cache_config": {"kv_cache_size_tokens": "66052"}, "log": {"kv_max_concurrency": 4.03}},
        "fp8": {"log": {"kv_cache_size_tokens": 99273, "kv_max_concurrency": 6.06}},
    }
    rows = kv_plan.rows(_run(plan, evidence))
    assert [(r["arm"], r["diff_pct"], r["flag"] is not None) for r in rows] == [
        ("auto", 0.0, False),
        ("fp8", -24.852, True),
    ]
    assert "sliding-window (512)" in str(rows[1]["flag"]) and "-24.9%" in str(rows[1]["flag"])
    report: Any = {"kv_plan": rows}
    md = "\n".join(kv_plan.markdown(report))
    assert "## KV cache: planned and reported" in md and "| auto | 13 layers" in md and "**flagged**" in md
    assert [flagged for _, flagged in kv_plan.terminal(report)] == [False, False, True]
    assert kv_plan.rows(_run([{"boot": "auto", "arm": "auto"}], evidence)) == []  # an old run: no section
    unmodelled = kv_plan.rows(
        _run(
            [{"boot": "auto", "arm": "auto", "kv_plan": {**planned, "tokens": None, "not_modelled": "state layers"}}],
            evidence,
        )
    )
    assert unmodelled[0]["diff_pct"] is None
    assert kv_plan.notes(cast(Any, {"kv_plan": unmodelled}))[0].startswith("not modelled for auto: state layers")
