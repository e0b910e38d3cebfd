"""The run store: named baselines and the history of every run, outside the workspace, so that a CI
checkout (``git clean -ffdx``) does not take them away. See docs/store.md.

``--kv-store=PATH`` (a folder; default ``$XDG_DATA_HOME/pytest-kvcache``, else
``~/.local/share/pytest-kvcache``) or a ``postgresql://`` URL. Run folders stay the source of truth:
``kvcache-report store rebuild RUN_DIR…`` re-creates the history from them.

Plain Python (no pytest): the configuration layer resolves names through it, the report pipeline records
each finished run, ``kvcache-report history`` reads it.
"""

from __future__ import annotations

from pathlib import Path

from pytest_kvcache.config.locations import is_url
from pytest_kvcache.store.base import BaselineEntry, Store, StoreError


def check(location: str) -> None:
    """What can be checked without connecting: a folder that is a file is an error (StoreError)."""
    if is_url(location):
        return
    from pytest_kvcache.store.sqlite import check_folder

    check_folder(Path(location))


def open_store(location: str) -> Store:
    """Open (and create) the store at ``location``; StoreError when it cannot be."""
    if is_url(location):
        from pytest_kvcache.store.postgres import PostgresStore

        return PostgresStore(location)
    from pytest_kvcache.store.sqlite import SqliteStore

    return SqliteStore(Path(location))


__all__ = [
    "BaselineEntry",
    "Store",
    "StoreError",
    "check",
    "open_store",
]
