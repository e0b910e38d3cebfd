"""Plan against engine on real vLLM (CPU build): the KV tokens and concurrency the plugin plans before the boot
(config.kv_layout, engines/kinds/vllm_kv.py) against what vLLM reports, for reduced-size shapes of the layouts
the unit data cannot pin down alone (tests/data/kv_layouts/: the same configs, measured by
fixtures/kv_layouts.py). One boot a shape (30-40 s each on 2 cores, the whole plugin run), through the plugin:
the plan in run.json, the engine's figures in the boot's evidence, both side by side in report.json's
``kv_plan``."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

from tests.engine.conftest import ROOT, run_pytest, vllm_processes

DATA = ROOT / "tests" / "data" / "kv_layouts"
TOKENIZER = ROOT / "pytest_kvcache" / "data" / "tiny-qwen3"
#: sliding windows with a padded group (Gemma 3); alternating windows with attention sinks (gpt-oss); latent
#: attention with the CPU MLA kernel's 16-token blocks (DeepSeek-V2)
SHAPES = ("gemma3", "gpt-oss", "deepseek-v2-mla")

BOOT_PROBE = """
import pytest

pytestmark = pytest.mark.kvboot


def test_the_engine_answers(kv_server, kv_openai):
    reply = kv_openai.completions.create(model=kv_server.model, prompt="KV", max_tokens=1, temperature=0)
    assert reply.choices
"""
PYPROJECT = """
[tool.pytest.ini_options]
markers = ["kvboot: boot the engine and ask it once"]
"""


@pytest.mark.parametrize("shape", SHAPES)
def test_the_planned_kv_cache_is_what_vllm_allocates(shape: str, tmp_path: Path) -> None:
    record = json.loads((DATA / f"{shape}.json").read_text())
    folder = tmp_path / shape
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(record["config"], indent=2))
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copy(TOKENIZER / name, folder / name)
    workdir = tmp_path / "run"
    workdir.mkdir()
    (workdir / "test_boot.py").write_text(BOOT_PROBE)
    (workdir / "pyproject.toml").write_text(PYPROJECT)
    started = time.monotonic()
    run = run_pytest(
        workdir,
        f"--kv-model={folder}",
        "--kv-arms=auto",
        "-m",
        "kvboot",
        f"--kv-cache-bytes={record['kv_cache_bytes']}",
        "--kv-no-self-check",
        engine_args=f"--load-format dummy --enforce-eager --max-model-len {record['max_model_len']}",
    )
    wall_s = time.monotonic() - started
    assert run.returncode == 0, run.output[-4000:]
    assert not vllm_processes(run.tag)
    report = json.loads((run.folder / "report.json").read_text())
    (row,) = report["kv_plan"]
    assert row["planned_tokens"] is not None, row
    assert row["reported_tokens"] == pytest.approx(row["planned_tokens"], rel=0.01), row
    assert row["reported_concurrency"] == pytest.approx(row["planned_concurrency"], abs=0.011), row
    assert row["reported_tokens"] == record["reported"]["kv_cache_size_tokens"]  # as measured by hand
    assert row["flag"] is None
    assert f"{row['planned_tokens']:,} tokens" in run.output  # the boot plan said it before the boot
    ready_s = round(float(run.evidence("auto").get("ready_s") or 0), 1)
    print(
        f"{shape}: planned {row['planned_tokens']:,}, reported {row['reported_tokens']:,}; ready {ready_s} s, ", end=""
    )
    print(f"the whole run {wall_s:.0f} s")
