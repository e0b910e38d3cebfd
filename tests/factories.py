"""Builders the tests share, one of each (issue 35: test builders in one place)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from pytest_kvcache.config.locations import store_location
from pytest_kvcache.config.resolve import resolve
from pytest_kvcache.config.settings import Settings
from pytest_kvcache.stored import Stored, open_stored

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


def make_settings(tmp_path: Path, cli: Mapping[str, Any] | None = None, **kwargs: Any) -> Settings:
    """Settings resolved (and their stored runs checked) as for a run: :func:`open_run`'s settings (the same
    arguments)."""
    return open_run(tmp_path, cli, **kwargs)[0]


# ------------------------------------------------------------------------------------------ records


def measured_records(
    arm: str,
    values: Iterable[float],
    *,
    boot: str | Callable[[int], str] | None = None,
    replicate: int | None = None,
    probe: str = "short",
    shape: str = "code",
    metrics: Callable[[float], dict[str, float]] = lambda v: {"decode_tps": v},
) -> list[dict[str, Any]]:
    """Measured, successful records of one arm as ``requests.jsonl`` holds them, one per value: ``index`` counts
    from 0, ``metrics`` maps each value to the record's metrics (default: ``decode_tps``), ``boot`` is the boot
    id (default: the arm's name) or a function of the index, and ``replicate`` is written when given."""
    out: list[dict[str, Any]] = []
    for i, v in enumerate(values):
        record: dict[str, Any] = {"arm": arm, "boot": boot(i) if callable(boot) else (boot or arm)}
        if replicate is not None:
            record["replicate"] = replicate
        record.update(
            {
                "probe": probe,
                "shape": shape,
                "phase": "measured",
                "index": i,
                "ok": True,
                "excluded_reason": None,
                "metrics": metrics(v),
                "sample": {},
            }
        )
        out.append(record)
    return out


def fake_llamacpp_sdist(folder: Path, monkeypatch: Any) -> Path:
    """A llama-cpp-python sdist of one CMakeLists.txt in ``folder``, taken by ``llamacpp_build`` as the pinned one
    (its sha256 and the sdist variable patched): a build test runs a fake cmake over it."""
    import hashlib
    import io
    import tarfile

    from pytest_kvcache.engines import llamacpp_build as build

    folder.mkdir(parents=True, exist_ok=True)
    sdist = folder / build.SDIST_NAME
    with tarfile.open(sdist, "w:gz") as tar:
        data = b"project(llama.cpp)\n"
        info = tarfile.TarInfo(f"llama_cpp_python-{build.SDIST_VERSION}/vendor/llama.cpp/CMakeLists.txt")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    monkeypatch.setattr(build, "SDIST_SHA256", hashlib.sha256(sdist.read_bytes()).hexdigest())
    monkeypatch.setenv(build.SDIST_ENV, str(sdist))
    return sdist
