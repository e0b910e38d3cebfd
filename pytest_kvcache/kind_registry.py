"""Engine kinds by name: the registry every ``--kv-engine`` value is looked up in. It knows no kind.

The kinds register into it from above (``engines/kinds/``: ``register_kind``); the settings look a kind up by
name from below (``config/kinds.py``). The package's own kinds are found the way pytest finds its built-in
plugins: by module name (:data:`BUILTIN`), imported the first time a kind is asked for. Other packages' kinds
come from their ``pytest_kvcache.engine_kinds`` entry points (``engines.kinds.load_entry_points``).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping

#: A registered kind's name (:func:`names` lists them).
EngineKind = str

#: The kinds the package ships, in ``--kv-engine``'s order, and the module that registers each.
BUILTIN: Mapping[EngineKind, str] = {
    "vllm": "pytest_kvcache.engines.kinds.vllm",
    "llamacpp": "pytest_kvcache.engines.kinds.llamacpp",
    "openai": "pytest_kvcache.engines.kinds.openai",
}

_KINDS: dict[str, object] = {}
_IMPORTED: list[bool] = []


def add(name: str, kind: object) -> None:
    """Register ``kind`` as ``--kv-engine=name`` (a later one replaces it)."""
    _KINDS[name] = kind


def remove(name: str) -> None:
    """Forget a registered kind (a test's own toy kind, after the test)."""
    _KINDS.pop(name, None)


def _builtin() -> None:
    if not _IMPORTED:
        _IMPORTED.append(True)
        for module in BUILTIN.values():
            importlib.import_module(module)


def names() -> tuple[str, ...]:
    """The registered kinds' names: the built-in ones first, then the others as they were registered."""
    _builtin()
    first = [name for name in BUILTIN if name in _KINDS]
    return (*first, *(name for name in _KINDS if name not in first))


def get(name: str) -> object:
    """The kind registered as ``name``; KeyError when there is none."""
    _builtin()
    return _KINDS[name]


def find(name: object) -> object | None:
    """The kind registered as ``name`` (e.g. read from a stored evidence dict), or None."""
    _builtin()
    return _KINDS.get(name) if isinstance(name, str) else None
