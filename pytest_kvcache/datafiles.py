"""Where the package's data files are: the embedded models' folders (bottom layer: imports only
``engines.trained_model``, which is itself plain Python over the machine's cache and imports only the bottom
layer)."""

from __future__ import annotations

from collections.abc import Callable
from importlib import resources
from pathlib import Path


def embedded_model_path() -> Path:
    """The random-weight tiny model's folder (``embedded:tiny-qwen3``; served with dummy weights)."""
    return Path(str(resources.files("pytest_kvcache") / "data" / "tiny-qwen3"))


#: embedded model name → the folder found for it (once per process)
FOLDERS: dict[str, Path] = {}


def embedded_folder(name: str, *, trained: bool, on_convert: Callable[[str], None] | None = None) -> Path:
    """The folder vLLM serves for the embedded model ``name``: the tiny one's, or (``trained``) the trained one
    converted from its GGUF (once per machine, cached; checked once per process). Raises TrainedModelError."""
    if name not in FOLDERS:
        if trained:
            from pytest_kvcache.engines.trained_model import ensure_folder

            FOLDERS[name] = ensure_folder(on_convert=on_convert).path
        else:
            FOLDERS[name] = embedded_model_path()
    return FOLDERS[name]
