"""Arms: a named arm from ``[tool.pytest_kvcache.arms.NAME]``, an alias (``fp8`` → ``fp8_e4m3``) or an engine's
cache dtype, resolved into an :class:`Arm`."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pytest_kvcache.config.constants import SettingsError
from pytest_kvcache.config.values import args as split_args
from pytest_kvcache.model.evidence import ArmData


@dataclass(frozen=True)
class Arm:
    """One serving variant. ``kv_cache_dtype`` is what is passed as ``--kv-cache-dtype`` (None: not passed)."""

    name: str
    kv_cache_dtype: str | None
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    image: str | None = None
    source: str = "dtype"  # "alias" | "dtype" | "pyproject"
    typed_as: str = ""
    #: What this arm declares it changes (None: everything it sets — dtype, args, env, image). A named
    #: arm's ``knobs`` narrows it; anything else that differs between arms is a confound.
    knobs: tuple[str, ...] | None = None

    @property
    def expected_cache_dtype(self) -> str:
        """The ``cache_dtype`` label the engine must report for this arm."""
        return self.kv_cache_dtype or "auto"

    def to_dict(self) -> ArmData:
        return {
            "name": self.name,
            "typed_as": self.typed_as or self.name,
            "kv_cache_dtype": self.kv_cache_dtype,
            "args": list(self.args),
            "env": dict(self.env),
            "image": self.image,
            "source": self.source,
            "knobs": list(self.knobs) if self.knobs is not None else None,
        }


def _named_arm(name: str, table: Mapping[str, Any], aliases: Mapping[str, str], dtypes: Sequence[str]) -> Arm:
    """A ``[tool.pytest_kvcache.arms.NAME]`` table; its ``kv_cache_dtype`` is one of the engine kind's ``dtypes`` or
    ``aliases``."""
    known = {"kv_cache_dtype", "args", "env", "image", "knobs"}
    unknown = sorted(set(table) - known)
    where = f"[tool.pytest_kvcache.arms.{name}]"
    if unknown:
        raise SettingsError(f"{where}: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    dtype = table.get("kv_cache_dtype")
    if dtype is not None:
        if not isinstance(dtype, str):
            raise SettingsError(f"{where}: kv_cache_dtype must be a string")
        dtype = aliases.get(dtype, dtype)
        if dtype not in dtypes:
            raise SettingsError(
                f"{where}: unknown kv_cache_dtype {table['kv_cache_dtype']!r}; valid: {', '.join(dtypes)}"
            )
    args = table.get("args", [])
    if isinstance(args, str):
        try:
            args = split_args(args)
        except SettingsError as exc:
            raise SettingsError(f"{where}: args: {exc}") from None
    if not isinstance(args, list | tuple) or not all(isinstance(a, str) for a in args):
        raise SettingsError(f"{where}: args must be a list of strings or one string")
    env = table.get("env", {})
    if not isinstance(env, dict) or not all(isinstance(k, str) for k in env):
        raise SettingsError(f"{where}: env must be a table of NAME = value")
    image = table.get("image")
    if image is not None and not isinstance(image, str):
        raise SettingsError(f"{where}: image must be a string")
    knobs = table.get("knobs")
    if knobs is not None and (not isinstance(knobs, list) or not all(isinstance(k, str) and k for k in knobs)):
        raise SettingsError(f"{where}: knobs must be a list of names (kv_cache_dtype, image, an arg or env name)")
    return Arm(
        name=name,
        kv_cache_dtype=dtype,
        args=tuple(args),
        env=tuple((k, str(v)) for k, v in env.items()),
        image=image,
        source="pyproject",
        typed_as=name,
        knobs=tuple(knobs) if knobs is not None else None,
    )


def _typed_arm(
    name: str, named: Mapping[str, object], aliases: Mapping[str, str], dtypes: Sequence[str], what: str
) -> Arm:
    """An alias or a raw cache dtype of the engine, or a usage error that lists every valid arm."""
    if name in aliases:
        return Arm(name=name, kv_cache_dtype=aliases[name], source="alias", typed_as=name)
    if name in dtypes:
        return Arm(name=name, kv_cache_dtype=name, source="dtype", typed_as=name)
    valid = [*sorted(named), *aliases, *dtypes]
    raise SettingsError(f"unknown {what} {name!r}; valid arms: {', '.join(valid)}")


def looks_like_path(model: str) -> bool:
    """A model value that names a local folder (as opposed to a hub id like ``org/name``)."""
    return model.startswith(("/", "./", "../", "~")) or model in {".", ".."} or os.path.isdir(model)
