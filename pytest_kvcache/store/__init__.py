"""The run store: named baselines and the history of every run, outside the workspace, so that a CI
checkout (``git clean -ffdx``) does not take them away. See docs/store.md.

``--kv-store=PATH`` (a folder; default ``$XDG_DATA_HOME/pytest-kvcache``, else
``~/.local/share/pytest-kvcache``) or a ``postgresql://`` URL. Run folders stay the source of truth:
``kvcache-report store rebuild RUN_DIR…`` re-creates the history from them.

Plain Python (no pytest): the configuration layer resolves names through it, the report pipeline records
each finished run, ``kvcache-report history`` reads it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from pytest_kvcache.store.base import BaselineEntry, Store, StoreError

POSTGRES_SCHEMES = ("postgresql://", "postgres://")


def is_url(location: str) -> bool:
    return location.startswith(POSTGRES_SCHEMES)


def default_location(env: Mapping[str, str]) -> str:
    """``$XDG_DATA_HOME/pytest-kvcache``, else ``~/.local/share/pytest-kvcache``."""
    data = env.get("XDG_DATA_HOME") or ""
    base = Path(data).expanduser() if data and Path(data).expanduser().is_absolute() else None
    return str((base or Path.home() / ".local" / "share") / "pytest-kvcache")


def normalise(raw: str, rootdir: Path) -> str:
    """A folder made absolute (relative to ``rootdir``), or a URL as given."""
    text = raw.strip()
    if is_url(text):
        return text
    path = Path(text).expanduser()
    return str(path if path.is_absolute() else rootdir / path)


def check(location: str) -> None:
    """What can be checked without connecting: a folder that is a file is an error (StoreError)."""
    if is_url(location):
        return
    from pytest_kvcache.store.sqlite import check_folder

    check_folder(Path(location))


def baselines_dir_of(location: str, env: Mapping[str, str] | None = None) -> Path:
    """Where the store's baselines are on this machine (a cache folder for a URL). No I/O."""
    if is_url(location):
        from pytest_kvcache.store.postgres import cache_dir

        return cache_dir(location, env if env is not None else os.environ)
    return Path(location) / "baselines"


def open_store(location: str) -> Store:
    """Open (and create) the store at ``location``; StoreError when it cannot be."""
    if is_url(location):
        from pytest_kvcache.store.postgres import PostgresStore

        return PostgresStore(location)
    from pytest_kvcache.store.sqlite import SqliteStore

    return SqliteStore(Path(location))


def redact(location: str) -> str:
    """A URL without its password, for messages."""
    if not is_url(location) or "@" not in location:
        return location
    scheme, rest = location.split("://", 1)
    auth, host = rest.rsplit("@", 1)
    user = auth.split(":", 1)[0]
    return f"{scheme}://{user}:***@{host}" if ":" in auth else location


__all__ = [
    "BaselineEntry",
    "Store",
    "StoreError",
    "baselines_dir_of",
    "check",
    "default_location",
    "is_url",
    "normalise",
    "open_store",
    "redact",
]
