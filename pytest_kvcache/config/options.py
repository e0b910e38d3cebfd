"""An option is one declaration: :func:`option` on a ``Settings`` field.

The declaration names the option (``--kv-NAME``, ini ``kv_NAME``, env ``PYTEST_KVCACHE_NAME``), its help,
its parser, its default — or its default on the embedded CPU default, which is the embedded model's own —
and the ``Settings`` field it sets (the field it is declared on; its annotation is the value's type). The
flag, the ini key, the environment variable, the field's value in :meth:`Settings.to_dict` and its
resolution all follow from it: a new option is one declaration plus its docs line (docs/configuration.md,
which ``tests/unit/test_docs.py`` enforces).

An option whose value depends on others (``--kv-arms``, ``--kv-model``, ``--kv-order`` …) is declared the same
way without a parser, and :func:`pytest_kvcache.config.resolve.resolve` resolves it by hand.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_kvcache.config.constants import SettingsError

if TYPE_CHECKING:
    from pytest_kvcache.config.embedded import EmbeddedModel

#: The field metadata key that holds a field's :class:`OptionSpec`.
OPTION = "kv_option"
#: The field metadata key that holds how a field is serialised by ``to_dict``: a callable
#: ``(value, settings) -> {key: json value}``, or None: left out.
TO_DICT = "kv_to_dict"
NOT_SERIALISED: Mapping[str, Any] = {TO_DICT: None}


@dataclass(frozen=True)
class OptionSpec:
    name: str
    help: str
    metavar: str | None = None
    flag: bool = False  # a CLI switch (store_true)
    repeatable: bool = False  # CLI action="append"; ini linelist
    #: the ``Settings`` field it sets (None: none — ``--kv-rerender``, ``--kv-no-self-check``)
    field: str | None = None
    #: raw value (CLI, env or ini) → the field's value, raising SettingsError; None: resolved by hand
    parse: Callable[[Any], Any] | None = None
    #: the value when the option is not given (a callable: called at resolution)
    default: Any = None
    #: the value when it is not given and an embedded model is served on the CPU (None: ``default``)
    cpu_default: Callable[[EmbeddedModel], Any] | None = None

    @property
    def cli(self) -> str:
        return "--kv-" + self.name.replace("_", "-")

    @property
    def dest(self) -> str:
        return "kv_" + self.name

    @property
    def ini(self) -> str:
        return "kv_" + self.name

    @property
    def env(self) -> str:
        return "PYTEST_KVCACHE_" + self.name.upper()

    def default_for(self, embedded: EmbeddedModel | None) -> Any:
        """The default value; ``embedded``: the model served on the CPU default (its own sizes), else None."""
        if embedded is not None and self.cpu_default is not None:
            return self.cpu_default(embedded)
        return self.default() if callable(self.default) else self.default


def option(
    name: str | None = None,
    *,
    help: str,
    metavar: str | None = None,
    flag: bool = False,
    repeatable: bool = False,
    parse: Callable[[Any], Any] | None = None,
    default: Any = None,
    cpu_default: Callable[[EmbeddedModel], Any] | None = None,
    unset: Any = dataclasses.MISSING,
    required: bool = False,
) -> Any:
    """Declare the option that sets this ``Settings`` field (``name``: the option's, when it differs).

    The field's own default (an inactive ``Settings(arms=())``) is ``default``, or ``unset`` where the two
    differ (``hf_cache``: None until resolved); a callable ``default`` is called for each instance. ``metavar`` is
    the parser's own where it has one (``values.count``: N, ``values.positive``: S) and none is given."""
    spec = OptionSpec(
        name="",  # filled in from the field name by options_of when not given
        help=help,
        metavar=metavar or getattr(parse, "metavar", None),
        flag=flag,
        repeatable=repeatable,
        parse=parse,
        default=default,
        cpu_default=cpu_default,
    )
    metadata = {OPTION: (name, spec)}
    if required:
        return dataclasses.field(kw_only=True, metadata=metadata)
    value = default if unset is dataclasses.MISSING else unset
    if callable(value):  # a factory (dict, a home-relative path): called for each instance
        return dataclasses.field(default_factory=value, metadata=metadata)
    return dataclasses.field(default=value, metadata=metadata)


def options_of(cls: type) -> tuple[OptionSpec, ...]:
    """The options declared on a settings dataclass's fields, in field order, each bound to its field."""
    found = []
    for f in dataclasses.fields(cls):
        declared = f.metadata.get(OPTION)
        if declared is None:
            continue
        name, spec = declared
        found.append(dataclasses.replace(spec, name=name or f.name, field=f.name))
    return tuple(found)


#: Options that set no field of their own.
UNBOUND: tuple[OptionSpec, ...] = (
    OptionSpec("rerender", "rebuild the report (and gates) of a stored run folder; boots nothing.", "RUN_DIR"),
    OptionSpec("no_self_check", "skip the measuring-client self-check at the start of the run.", flag=True),
)


def serialise(value: Any) -> Any:
    """A field's value as JSON: tuples as lists, paths as strings, mappings as dicts, an object with a
    ``to_dict`` (an arm) as what it returns."""
    if hasattr(value, "to_dict"):
        return value.to_dict()
    if isinstance(value, tuple | list):
        return [serialise(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, Mapping):
        return {k: serialise(v) for k, v in value.items()}
    return value


def to_dict(encode: Callable[[Any, Any], Mapping[str, Any]]) -> Mapping[str, Any]:
    """Field metadata: serialise this field with ``encode(value, settings) -> {key: value}``."""
    return {TO_DICT: encode}


def pick(spec: OptionSpec, cli: Mapping[str, Any], env: Mapping[str, str], ini: Mapping[str, Any]) -> tuple[Any, str]:
    """Return (raw value, where it came from) by precedence, or (None, "default")."""
    value = cli.get(spec.name)
    if value not in (None, [], False):
        return value, spec.cli
    if env.get(spec.env, "") != "":
        raw = env[spec.env]
        return ([raw] if spec.repeatable else raw), spec.env
    value = ini.get(spec.name)
    if value not in (None, "", [], False):
        return value, spec.ini
    return None, "default"


def parse_as(raw: Any, origin: str, parse: Callable[[Any], Any]) -> Any:
    try:
        return parse(raw)
    except SettingsError as exc:
        raise SettingsError(f"{origin}: {exc}") from None
