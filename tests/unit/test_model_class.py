"""A one-boot verdict rests on the default band only where the run is the case the band was measured on: no busy
host, and a model of a size class the band's runs served (issue 41). The parameter estimate that places a model in
its class, the classes the committed bands come from, and the widest spread for a model unlike them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pytest_kvcache.config import embedded, model_files
from pytest_kvcache.report import bands, judge, spread
from pytest_kvcache.report.build import build
from pytest_kvcache.report.load import RunData
from tests.factories import measured_records

ROOT = Path(__file__).resolve().parents[2]

#: DeepSeek-V2-Lite's published config (MLA and a mixture of 64 routed and 2 shared experts): 15.7B parameters.
DEEPSEEK_V2_LITE: dict[str, Any] = {
    "hidden_size": 2048,
    "num_hidden_layers": 27,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "kv_lora_rank": 512,
    "q_lora_rank": None,
    "qk_rope_head_dim": 64,
    "qk_nope_head_dim": 128,
    "v_head_dim": 128,
    "intermediate_size": 10944,
    "moe_intermediate_size": 1408,
    "n_routed_experts": 64,
    "n_shared_experts": 2,
    "vocab_size": 102400,
    "tie_word_embeddings": False,
}


def test_the_estimate_is_within_a_few_percent_of_published_counts() -> None:
    assert model_files.parameters(embedded.SMOLLM2.kv_config) == 134_479_872  # SmolLM2-135M
    qwen3_8b = json.loads((ROOT / "fixtures" / "qwen3-8b-shape" / "config.json").read_text())
    assert model_files.parameters(qwen3_8b) == 6_979_321_856  # the fixture's vocabulary is cut to 4,096
    qwen3_8b["vocab_size"] = 151_936
    assert model_files.parameters(qwen3_8b) == pytest.approx(8.19e9, rel=0.01)  # Qwen3-8B: 8.19B
    assert model_files.parameters(DEEPSEEK_V2_LITE) == pytest.approx(15.7e9, rel=0.05)
    assert model_files.parameters({"text_config": qwen3_8b}) == model_files.parameters(qwen3_8b)


def test_a_config_without_the_figures_gives_no_estimate() -> None:
    assert model_files.parameters({"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2}) is None
    mixture = {**DEEPSEEK_V2_LITE, "moe_intermediate_size": None, "intermediate_size": None}
    assert model_files.parameters(mixture) is None


@pytest.mark.parametrize(
    ("parameters", "name"),
    [
        (4_194_304, "under 1B parameters"),
        (999_999_999, "under 1B parameters"),
        (1_000_000_000, "1B to 10B parameters"),
        (8_190_000_000, "1B to 10B parameters"),
        (70_000_000_000, "10B to 100B parameters"),
        (671_000_000_000, "100B parameters or more"),
    ],
)
def test_size_classes(parameters: int, name: str) -> None:
    assert bands.size_class(parameters) == name


def test_the_committed_bands_name_the_classes_they_were_measured_on() -> None:
    assert bands.source_classes("cpu") == ("under 1B parameters",)
    assert bands.source_classes("gpu") == ("under 1B parameters", "1B to 10B parameters")


def test_a_run_is_unlike_the_bands_source_only_by_a_recorded_size() -> None:
    small = {"model_size": {"parameters": 134_479_872, "source": "estimated"}}
    big = {"model_size": {"parameters": 8_190_427_136, "source": "estimated from /m/config.json"}}
    unknown = {"model_size": {"parameters": None, "source": "no config.json here (a hub id)"}}
    assert bands.unlike_source("cpu", small) is None
    assert bands.unlike_source("gpu", big) is None  # the GPU bands include the 8B-shaped runs
    assert bands.unlike_source("cpu", big) == (
        "this run's model (8.2B parameters: 1B to 10B parameters) is unlike the band's models (under 1B parameters)"
    )
    assert bands.unlike_source("cpu", unknown) == "this run's model size is not known (no config.json here (a hub id))"
    assert bands.unlike_source("cpu", {}) is None  # a run made before model_size was recorded: judged as then


def test_a_model_unlike_the_bands_source_is_judged_with_the_widest_spread() -> None:
    why = bands.unlike_source("cpu", {"model_size": {"parameters": 70_000_000_000, "source": "x"}})
    chosen = spread.choose("decode_tps", "cpu", (1, 1), unlike=why)
    assert chosen.kind == "widest" and chosen.sd == spread.widest("decode_tps").sd  # type: ignore[union-attr]
    assert chosen.text.endswith(f": {why}")
    assert spread.choose("decode_tps", "cpu", (1, 1)).kind == "default band"
    # from 2 boots the run's own spread decides, whatever the model
    assert spread.choose("decode_tps", "cpu", (2, 2), run=(0.01, 2), unlike=why).kind == "default band"
    assert spread.choose("decode_tps", "cpu", (2, 2), run=(0.5, 2), unlike=why).kind == "run's boots"


def _run(size: dict[str, Any] | None) -> RunData:
    rng = np.random.default_rng(3)
    records: list[dict[str, Any]] = []
    for arm, centre in (("a", 100.0), ("b", 60.0)):
        records += measured_records(arm, (float(v) for v in rng.normal(centre, 2.0, 12)), replicate=1)
    meta: dict[str, Any] = {"settings": {"arms": [{"name": "a"}, {"name": "b"}], "seed": 0}, "plan": []}
    if size is not None:
        meta["model_size"] = size
    return RunData(path=Path("/nonexistent"), meta=meta, records=records)  # type: ignore[arg-type]


def test_a_one_boot_report_of_a_large_model_on_the_cpu_claims_nothing_the_widest_spread_would_not() -> None:
    """A 40% decode loss at one boot: worse with the CPU band on the model class it was measured on; on a 70B
    model, judged with the widest spread, inconclusive — delta and gate alike — and the first screen says why."""
    gate = "decode_tps[short@code]: b >= a * 0.97"
    small = _run({"parameters": 134_479_872, "source": "estimated"})
    report = build(small)
    (delta,) = [d for d in report["deltas"] if d["metric"] == "decode_tps"]
    assert delta["spread"]["kind"] == "default band" and delta["verdict"] == "worse"
    assert judge.judge(report, small, [gate]).gate_results[0]["outcome"] == "fail"

    large = _run({"parameters": 70_000_000_000, "source": "estimated from /m/config.json"})
    report = build(large)
    (delta,) = [d for d in report["deltas"] if d["metric"] == "decode_tps"]
    assert delta["spread"]["kind"] == "widest" and delta["verdict"] == "inconclusive"
    assert "unlike the band's models" in report["bands"]["unlike"]
    (result,) = judge.judge(report, large, [gate]).gate_results
    assert result["outcome"] == "inconclusive" and result["evidence"]["kind"] == "widest"
    assert "10B to 100B parameters" in result["evidence"]["text"]
