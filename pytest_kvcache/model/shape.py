"""A JSON value read back from a run folder checked against its model type (a ``TypedDict`` of this package,
``list[…]``, ``dict[str, …]``, a union, ``str``/``int``/``float``/``bool``, a ``Literal``): the first place
where it has another type, in words — ``'settings.arms[0]' must be an object, got a number``.

A run folder of another version, or edited by hand, is read by code that trusts these types; the report's
loader (``report.load``) checks each file with :func:`mismatch` first, so a wrong type is one line naming the
file and the field, not a traceback. Only types are checked: a key the type does not declare is not looked
at (a newer version may add some), and a missing key is not an error (an older version lacks some; readers
``.get`` them), nor is ``null`` (a value left out: readers take ``x.get(key) or default``, and a writer may
leave out what its type says it always has). ``Json`` and ``Any`` are anything; an integer is a number;
``true``/``false`` is not.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints, is_typeddict

from pytest_kvcache.model.base import Json

#: what a value holds checked, at a path: the problem in words, or None
Inside = Callable[[Any, str], "str | None"]


@dataclass(frozen=True)
class _Option:
    """One member of a type (a union has several): its name in messages, whether a value's own type is
    its type, and (for a container) the check of what the value holds."""

    name: str
    fits: Callable[[Any], bool]
    inside: Inside | None = None
    #: a plain type (a string, a number …): the exact Python types that are it, for a fast check of a list
    exact: frozenset[type] = frozenset()
    #: a list of plain types: the exact Python types of its items (a list of lists of numbers is checked fast)
    items_exact: frozenset[type] = frozenset()


def mismatch(value: Any, hint: Any, where: str = "") -> str | None:
    """Where ``value`` (parsed JSON) is not a ``hint``, in words (the field as ``where``'s dotted path); None
    when it is one."""
    return _check(value, _compile(hint), where)


def _check(value: Any, options: tuple[_Option, ...] | None, where: str) -> str | None:
    if options is None or value is None:  # null is a value left out, as a missing key is
        return None
    for option in options:
        if option.fits(value):
            return option.inside(value, where) if option.inside is not None else None
    expected = " or ".join(dict.fromkeys(option.name for option in options))
    return f"{where!r} must be {expected}, got {_kind(value)}" if where else f"expected {expected}, got {_kind(value)}"


@functools.cache
def _compile(hint: Any) -> tuple[_Option, ...] | None:
    """``hint``'s members, or None for anything (``Any``, ``Json``, a type this checker does not know)."""
    if hint is Any or hint is Json:
        return None
    if get_origin(hint) in (Union, types.UnionType):
        members = [_compile(arg) for arg in get_args(hint)]
        if any(m is None for m in members):
            return None
        return tuple(option for m in members if m is not None for option in m)
    option = _option(hint)
    return None if option is None else (option,)


def _option(hint: Any) -> _Option | None:
    if hint is None or hint is types.NoneType:
        return _Option("null", lambda value: value is None, exact=frozenset({types.NoneType}))
    if is_typeddict(hint):
        return _Option("an object", _is_dict, functools.partial(_typed_dict, hint))
    origin, args = get_origin(hint), get_args(hint)
    if origin is Literal:
        kinds = {type(arg) for arg in args}
        named = [o for o in (_option(kind) for kind in kinds) if o is not None]
        return _Option(" or ".join(o.name for o in named), lambda value: any(o.fits(value) for o in named))
    if origin is list:
        items = _compile(args[0]) if args else None
        if items is None:
            return _Option("a list", _is_list)
        exact = _exact(items)
        return _Option("a list", _is_list, functools.partial(_items, items, exact), items_exact=exact)
    if origin is dict:
        values = _compile(args[1]) if len(args) == 2 else None
        return _Option("an object", _is_dict, None if values is None else functools.partial(_values, values))
    return _PLAIN.get(hint)


def _typed_dict(typed: Any, value: dict[str, Any], where: str) -> str | None:
    for key, options in _fields(typed):
        if key in value and options is not None:
            problem = _check(value[key], options, f"{where}.{key}" if where else key)
            if problem is not None:
                return problem
    return None


def _items(options: tuple[_Option, ...], exact: frozenset[type], value: list[Any], where: str) -> str | None:
    if exact and {type(item) for item in value} <= exact:  # a list of numbers (or strings), checked fast
        return None
    inner = options[0].items_exact if len(options) == 1 else frozenset()
    if inner and {type(item) for item in value} <= {list} and {type(x) for item in value for x in item} <= inner:
        return None  # a list of lists of numbers, likewise
    for i, item in enumerate(value):
        problem = _check(item, options, f"{where}[{i}]")
        if problem is not None:
            return problem
    return None


def _exact(options: tuple[_Option, ...]) -> frozenset[type]:
    """The exact Python types of plain ``options`` (empty when one of them is a container)."""
    if any(not option.exact for option in options):
        return frozenset()
    return frozenset({types.NoneType, *(t for option in options for t in option.exact)})


def _values(options: tuple[_Option, ...], value: dict[str, Any], where: str) -> str | None:
    for key, item in value.items():
        problem = _check(item, options, f"{where}.{key}" if where else str(key))
        if problem is not None:
            return problem
    return None


@functools.cache
def _fields(typed: Any) -> tuple[tuple[str, tuple[_Option, ...] | None], ...]:
    return tuple((key, _compile(hint)) for key, hint in get_type_hints(typed).items())


def _is_dict(value: Any) -> bool:
    return isinstance(value, dict)


def _is_list(value: Any) -> bool:
    return isinstance(value, list)


_PLAIN: dict[Any, _Option] = {
    str: _Option("a string", lambda value: isinstance(value, str), exact=frozenset({str})),
    int: _Option(
        "an integer", lambda value: isinstance(value, int) and not isinstance(value, bool), exact=frozenset({int})
    ),
    float: _Option(
        "a number",
        lambda value: isinstance(value, (int, float)) and not isinstance(value, bool),
        exact=frozenset({int, float}),
    ),
    bool: _Option("true or false", lambda value: isinstance(value, bool), exact=frozenset({bool})),
}


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true or false"
    if isinstance(value, (int, float)):
        return "a number"
    named: dict[type, str] = {str: "a string", list: "a list", dict: "an object"}
    return named.get(type(value), type(value).__name__)
