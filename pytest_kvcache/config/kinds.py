"""What the settings ask of an engine kind, and the arms it resolves: the kind is looked up by name in the
registry at the bottom (:mod:`pytest_kvcache.kind_registry`), which the kinds in ``engines/kinds/`` register
into from above. The settings see a kind only as :class:`KindFacts`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol, cast

from pytest_kvcache import kind_registry
from pytest_kvcache.config.arms import Arm
from pytest_kvcache.config.constants import ARM_NAME, SettingsError
from pytest_kvcache.kind_registry import EngineKind

if TYPE_CHECKING:
    from pytest_kvcache.config.budget import Need
    from pytest_kvcache.config.embedded import EmbeddedModel
    from pytest_kvcache.config.kv_layout import KvPlan


class KindFacts(Protocol):
    """The part of a registered kind (``engines.kinds.base.Kind``) that option resolution reads."""

    name: str
    #: ``--kv-model`` is a file (a GGUF), and the usage error's words when it is not
    model_is_file: bool
    model_file_what: str
    #: vLLM's CPU build serves the embedded model by default
    cpu_build: bool
    #: the flag ``--kv-cache-bytes`` is passed as (None: it has no byte budget)
    budget_flag: str | None
    #: the dtypes the CPU build serves (``cpu_build``), and those that make the embedded model bfloat16
    cpu_dtypes: frozenset[str]
    half_kv_on_float32: frozenset[str]
    #: the flags that set its context length
    context_flags: tuple[str, ...]

    def resolve_arm(self, name: str, named: Mapping[str, Mapping[str, Any]]) -> Arm: ...

    def check(self, *, launcher: str, engine_cmd: object) -> None: ...

    # ``settings`` is the run's ``Settings``, which reads the kind through this module (typed loosely: no cycle)
    def kv_plan(self, settings: Any, arm: Arm, found: Need, budget: int | None) -> KvPlan | None: ...

    def embedded_context(self, spec: EmbeddedModel) -> int: ...


def engine_kind(name: str) -> KindFacts:
    """The registered engine kind that carries everything kind-specific about ``name``: its arms, the
    launchers it runs with, its model's shape, its KV budget."""
    try:
        return cast(KindFacts, kind_registry.get(name))
    except KeyError:
        raise SettingsError(f"unknown engine kind {name!r}; registered: {', '.join(kind_registry.names())}") from None


def resolve_arm(name: str, named: Mapping[str, Mapping[str, Any]], engine: EngineKind = "vllm") -> Arm:
    """Resolve one typed arm name: named arm > alias > raw dtype (the engine kind's own names)."""
    return engine_kind(engine).resolve_arm(name, named)


def resolve_arms(
    names: Sequence[str], named: Mapping[str, Mapping[str, Any]], engine: EngineKind = "vllm"
) -> tuple[Arm, ...]:
    """Resolve the arm list; a repeated name is an A/A comparison (``fp8,fp8`` → ``fp8``, ``fp8.2``)."""
    arms: list[Arm] = []
    seen: dict[str, int] = {}
    for name in names:
        if not ARM_NAME.match(name):
            raise SettingsError(f"arm name {name!r} must be letters, digits, '-' or '_'")
        arm = resolve_arm(name, named, engine)
        seen[name] = seen.get(name, 0) + 1
        if seen[name] > 1:
            arm = replace(arm, name=f"{name}.{seen[name]}")
        arms.append(arm)
    return tuple(arms)
