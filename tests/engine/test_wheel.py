"""The installed wheel carries what the plugin needs at run time (model folder, stock suite)."""

from __future__ import annotations

import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def test_wheel_installs_in_a_fresh_venv_and_collects_the_suite(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(ROOT)],
        check=True,
        capture_output=True,
    )
    (wheel,) = dist.glob("pytest_kvcache-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for needed in (
        "pytest_kvcache/data/tiny-qwen3/config.json",
        "pytest_kvcache/data/tiny-qwen3/tokenizer.json",
        "pytest_kvcache/suite/test_short.py",
        "pytest_kvcache/suite/test_fidelity.py",
        *(
            f"pytest_kvcache/data/fidelity/{name}-v1.txt{end}"
            for name in ("prose", "code", "data", "markup")
            for end in ("", ".sha256")
        ),
        "pytest_kvcache/data/fidelity/LICENSE-UNICODE.txt",
        "pytest_kvcache/report/outputs/templates/report.html.j2",
        "pytest_kvcache/py.typed",
    ):
        assert needed in names
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python = env_dir / "bin" / "python"
    install = subprocess.run([str(python), "-m", "pip", "install", "-q", str(wheel)], capture_output=True, text=True)
    assert install.returncode == 0, install.stderr[-3000:]
    project = tmp_path / "project"  # a user's project: no checkout, no conftest
    project.mkdir()
    result = subprocess.run(
        [str(python), "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "--kv-arms=auto,bf16"],
        cwd=project,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    # short 2 + prefill 2 depths + agentic 1 session (the CPU default) + concurrency 3 levels + fidelity 4 texts
    # + capacity 2 depths; the embedded trained model's wheel is not in this venv: collecting needs none of it
    assert "1. auto (baseline): kv_cache_dtype=auto — 16 test(s)" in result.stdout
    assert "model embedded:smollm2-135m" in result.stdout and "context 8,192 tokens" in result.stdout
    assert "test_short[auto-narrative]" in result.stdout and "test_short[bf16-code]" in result.stdout
    model = subprocess.run(
        [str(python), "-c", "from pytest_kvcache.datafiles import embedded_model_path as p; print(p())"],
        capture_output=True,
        text=True,
        check=True,
        cwd=project,
    ).stdout.strip()
    assert model.startswith(str(env_dir)) and (Path(model) / "config.json").is_file()
