"""JSON files, read and written, and a file's sha256: the bottom of the package (config, engines, store and run
all use it).

Plain Python: imports nothing of pytest-kvcache.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def write_json(path: Path, data: Any) -> None:
    """Write JSON atomically (temp file + rename), so a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with tmp.open("w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=2, sort_keys=False, default=str)
        fh.write("\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def read_json(path: Path) -> Any:
    with path.open(encoding="utf-8") as fh:
        return json.load(fh)


def iter_run_folders(root: Path) -> Iterator[Path]:
    """The run folders under ``root`` (a folder with a ``run.json``; the ``latest`` link skipped), sorted."""
    if not root.is_dir():
        return
    for child in sorted(root.iterdir()):
        if child.is_dir() and not child.is_symlink() and (child / "run.json").exists():
            yield child


def file_sha256(path: Path) -> str:
    """A file's sha256, read in 1 MiB blocks (the pinned GGUFs, the llama.cpp sdist, the converted model's files)."""
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
