"""Where the run store is: ``--kv-store`` read as a folder or a ``postgresql://`` URL, and where its baselines
are on this machine. Names and paths only, no I/O: the store (``store/``) opens what these name."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pytest_kvcache.config.options import pick
from pytest_kvcache.config.settings import OPTION_BY_NAME

POSTGRES_SCHEMES = ("postgresql://", "postgres://")


def is_url(location: str) -> bool:
    return location.startswith(POSTGRES_SCHEMES)


def redact(location: str) -> str:
    """A URL without its password, for messages."""
    if not is_url(location) or "@" not in location:
        return location
    scheme, rest = location.split("://", 1)
    auth, host = rest.rsplit("@", 1)
    user = auth.split(":", 1)[0]
    return f"{scheme}://{user}:***@{host}" if ":" in auth else location


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


def cache_dir(url: str, env: Mapping[str, str]) -> Path:
    """The local folder baselines of the store at ``url`` are unpacked into (one per store URL)."""
    cache = env.get("XDG_CACHE_HOME") or ""
    base = Path(cache) if cache and Path(cache).is_absolute() else Path.home() / ".cache"
    digest = hashlib.sha256(url.encode()).hexdigest()[:12]
    return base / "pytest-kvcache" / f"postgres-{digest}" / "baselines"


def baselines_dir_of(location: str, env: Mapping[str, str] | None = None) -> Path:
    """Where the store's baselines are on this machine (a cache folder for a URL)."""
    if is_url(location):
        return cache_dir(location, env if env is not None else os.environ)
    return Path(location) / "baselines"


def store_location(
    cli: Mapping[str, Any], env: Mapping[str, str], ini: Mapping[str, Any], rootdir: Path
) -> tuple[str, str]:
    """``--kv-store`` as a location (a folder made absolute against the rootdir, or a postgresql:// URL) and
    the name it was given by (``--kv-store`` when defaulted: ``$XDG_DATA_HOME/pytest-kvcache``)."""
    raw, origin = pick(OPTION_BY_NAME["store"], cli, env, ini)
    if raw is None:
        return default_location(env), "--kv-store"
    return normalise(str(raw), rootdir), origin
