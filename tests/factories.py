"""Builders the tests share, one of each (issue 35: test builders in one place)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pytest_kvcache.config.settings import Settings, resolve
from pytest_kvcache.config.stored import Stored, open_stored, store_location

# ------------------------------------------------------------------------------------------------ settings


def open_run(
    tmp_path: Path,
    cli: Mapping[str, Any] | None = None,
    *,
    arms: str | None = None,
    env: Mapping[str, str] | None = None,
    ini: Mapping[str, Any] | None = None,
    named: Mapping[str, Any] | None = None,
    fp8_kv_unsupported: str | None = None,
    lanes: int = 1,
    **options: Any,
) -> tuple[Settings, Stored | None]:
    """What the plugin does at configure, before any boot: the options resolved (``cli`` and ``options``,
    both by option name as the CLI gives them; ``arms`` first), then the run store checked and the stored
    runs ``--kv-compare``/``--kv-noise`` name loaded. Raises the SettingsError either step raises; the
    Stored is None for inactive settings."""
    given = {**({"arms": arms} if arms is not None else {}), **(cli or {}), **options}
    environ = dict(env or {})
    settings = resolve(
        given, environ, dict(ini or {}), dict(named or {}), tmp_path, fp8_kv_unsupported=fp8_kv_unsupported, lanes=lanes
    )
    if not settings.active:
        return settings, None
    _, origin = store_location(given, environ, dict(ini or {}), tmp_path)
    return settings, open_stored(settings, environ, origin)


def make_settings(
    tmp_path: Path,
    cli: Mapping[str, Any] | None = None,
    *,
    arms: str | None = None,
    env: Mapping[str, str] | None = None,
    ini: Mapping[str, Any] | None = None,
    named: Mapping[str, Any] | None = None,
    fp8_kv_unsupported: str | None = None,
    lanes: int = 1,
    **options: Any,
) -> Settings:
    """Settings resolved (and their stored runs checked) as for a run: :func:`open_run`'s settings."""
    settings, _ = open_run(
        tmp_path,
        cli,
        arms=arms,
        env=env,
        ini=ini,
        named=named,
        fp8_kv_unsupported=fp8_kv_unsupported,
        lanes=lanes,
        **options,
    )
    return settings
