"""Counting prompt tokens here, with the model's own tokenizer and chat template, for a server that has no
tokenizer endpoint (``--kv-engine=openai``): exact-depth prefill then costs no request at all.

``transformers`` renders the chat template exactly as the model's server-side template would
(``apply_chat_template`` with the generation prompt), so the count is the server's ``usage.prompt_tokens``
when the server serves that model with that template; the depth check (±1%) verifies it on every sample.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pytest_kvcache.config.settings import Settings
from pytest_kvcache.datafiles import embedded_folder
from pytest_kvcache.engines.trained_model import TrainedModelError

Messages = list[dict[str, Any]]


class TokenizerError(RuntimeError):
    """No local tokenizer could be loaded (no folder, or ``transformers`` missing)."""


def tokenizer_dir(settings: Settings) -> Path:
    """``--kv-tokenizer``, else ``--kv-model`` when it is a folder, else the embedded model's (when embedded)."""
    if settings.tokenizer:
        return Path(settings.tokenizer)
    if settings.model is not None:
        path = Path(settings.model)
        if path.is_dir():
            return path
        raise TokenizerError(f"--kv-model {settings.model!r} is not a local folder; give --kv-tokenizer=DIR")

    try:
        return embedded_folder(settings.embedded_model, trained=settings.embedded_spec.trained)
    except TrainedModelError as exc:
        raise TokenizerError(str(exc)) from None


@functools.cache
def load_tokenizer(folder: str) -> Any:
    """``folder``'s tokenizer (transformers), loaded once per folder."""
    try:
        from transformers import AutoTokenizer
    except ImportError as exc:
        raise TokenizerError(f"counting tokens locally needs 'transformers' ({exc})") from None
    try:
        return AutoTokenizer.from_pretrained(folder)
    except (OSError, ValueError) as exc:
        raise TokenizerError(f"cannot load the tokenizer in {folder}: {exc}") from None


def local_counter(folder: Path) -> Callable[[Messages], int]:
    """A function that counts a message list's chat-rendered prompt tokens with ``folder``'s tokenizer."""
    tokenizer = load_tokenizer(str(folder))

    def count(messages: Messages) -> int:
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "keys"):  # transformers 5 returns a BatchEncoding
            ids = ids["input_ids"]
        return len(ids)

    count(messages=[{"role": "user", "content": "probe"}])  # fail now, not mid-probe
    return count
