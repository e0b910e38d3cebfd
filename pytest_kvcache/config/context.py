"""The model's context before any boot, and the probe points that cannot fit it.

A request whose prompt tokens plus ``max_tokens`` exceed the engine's context (vLLM's ``max_model_len``,
llama-server's per-slot ``n_ctx``) gets HTTP 400: it is never sent. Where the context is known before
any boot — the embedded model's, a model folder's ``config.json``, a GGUF's metadata, ``--max-model-len``
or ``--ctx-size`` in the engine arguments — a depth given explicitly beyond it is a usage error now, and a
default depth beyond it is left out and said so (the boot plan, the report). Where it is known only once
an engine answers, :func:`check_at_boot` does the same at the first boot, before any request.

Plain Python: no pytest.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_kvcache.config.budget import flag_value
from pytest_kvcache.config.constants import CPU_RETRIEVAL_DEPTHS, RETRIEVAL_DEPTHS, SettingsError
from pytest_kvcache.config.kinds import engine_kind
from pytest_kvcache.config.model_files import read
from pytest_kvcache.config.settings import OPTION_BY_NAME
from pytest_kvcache.probes import registry as probe_registry
from pytest_kvcache.probes.registry import RETRIEVAL_OUTPUT_TOKENS, depth_label

if TYPE_CHECKING:
    from pytest_kvcache.config.settings import Settings

#: A default retrieval depth this close below the model's limit gives way to it (``retrieval_defaults``).
NEAR_LIMIT = 0.9
#: Config keys that hold a model's context, in the order they are tried (text_config first for VLMs).
CONFIG_KEYS = ("max_position_embeddings", "max_sequence_length", "seq_length", "n_positions", "max_seq_len")


def _int(value: str | None) -> int | None:
    if value is None:
        return None
    text = value.strip().lower()
    try:
        return int(float(text[:-1]) * 1024) if text.endswith("k") else int(text)
    except ValueError:
        return None


def config_context(folder: Path) -> int | None:
    """A model folder's context from its ``config.json`` (None when it has none, or names no context);
    :class:`~pytest_kvcache.config.model_files.ModelFileError` (a usage error) when it is not a JSON object or
    a field has the wrong type (``config/model_files.py``, the one reader of a model's metadata)."""
    config = read(folder)
    if config is None:
        return None
    for scope in (config.get("text_config") or {}, config):
        for key in CONFIG_KEYS:
            value = scope.get(key)
            if isinstance(value, int) and value > 0:
                return value
    return None


def gguf_context(path: Path) -> int | None:
    """A GGUF's trained context (``<arch>.context_length``), read with the ``gguf`` package when installed."""
    try:
        from gguf import GGUFReader
    except ImportError:
        return None
    try:
        reader = GGUFReader(str(path))
        arch_field = reader.get_field("general.architecture")
        if arch_field is None:
            return None
        arch = bytes(arch_field.parts[arch_field.data[0]]).decode()
        field = reader.get_field(f"{arch}.context_length")
        return int(field.parts[field.data[0]][0]) if field is not None else None
    except Exception:  # an unreadable GGUF: llama-server says why when it loads it
        return None


def known_context(settings: Settings) -> tuple[int | None, str | None]:
    """The smallest context any arm's engine will have, and where that comes from; (None, None) when only
    a booted engine can tell (a hub id, an external server)."""
    if settings.launcher == "external":
        return None, None

    kind = engine_kind(settings.engine)
    found: list[tuple[int, str]] = []
    if settings.embedded:
        spec = settings.embedded_spec
        tokens = kind.embedded_context(spec)
        found.append((tokens, f"the embedded {spec.name}'s context"))
    elif settings.model is not None and Path(settings.model).is_dir():
        tokens_or_none = config_context(Path(settings.model))
        if tokens_or_none:
            found.append((tokens_or_none, f"{Path(settings.model).name}/config.json"))
    elif settings.model is not None and Path(settings.model).is_file():
        tokens_or_none = gguf_context(Path(settings.model))
        if tokens_or_none:
            found.append((tokens_or_none, f"{Path(settings.model).name}'s GGUF metadata"))
    flags = kind.context_flags
    for arm in settings.arms:
        value = _int(flag_value((*settings.engine_args, *arm.args), *flags))
        if value:
            where = f"{flags[0]} {value}" + (f" (arm {arm.name})" if flag_value(arm.args, *flags) else "")
            found.append((value, where))
    if not found:
        return None, None
    return min(found)


def retrieval_defaults(kept: tuple[int, ...], context: int) -> tuple[int, ...]:
    """The retrieval probe's default depths for a known context: the GPU defaults that fit (``kept``) and the
    model's own limit (the context less an answer's tokens), so "does it still find it at the end of its context"
    is asked. A default within 10% below the limit gives way to it (a 32K model: 8k and 32,744, not 32k as well);
    where that leaves one depth, the CPU defaults that fit below it are added, so there is a shallow depth to
    compare with (an 8K model: 1k, 4k and 8,168)."""
    limit = context - RETRIEVAL_OUTPUT_TOKENS
    if limit < 64:
        return kept
    depths = [d for d in kept if d < NEAR_LIMIT * limit]
    if not depths:
        depths = [d for d in CPU_RETRIEVAL_DEPTHS if d < NEAR_LIMIT * limit]
    return tuple(sorted({*depths, limit}))


def planned_points(settings: Settings) -> dict[str, tuple[str, ...]]:
    """The points the probes whose points follow from the settings will have (their depths and levels, after the
    defaults that cannot fit were left out): a gate on another point is a usage error before any boot."""
    return {spec.name: found for spec in probe_registry.specs() if (found := spec.planned_points(settings)) is not None}


def agentic_target(spec: str, context: int | None, max_tokens: int) -> int | None:
    """The last agentic turn's prompt tokens ``--kv-agentic-depth`` asks for: a count, a share of the context
    less the turn's output; None for ``fit`` and ``stock`` (and a share with the context unknown)."""
    if spec in ("fit", "stock"):
        return None
    if spec.endswith("%"):
        return int(float(spec[:-1]) / 100 * context) - max_tokens if context else None
    return int(spec)


def problems(settings: Settings, context: int, source: str) -> tuple[list[str], list[str], dict[str, Any]]:
    """(errors for explicit values that cannot fit, notes for defaults left out, the fields to change)."""
    errors: list[str] = []
    notes: list[str] = []
    changes: dict[str, Any] = {}
    where = f"the context of {context:,} tokens ({source})"
    explicit = settings.explicit

    # every probe's depths, one rule (the probe's own ``fits``): a depth given explicitly whose prompt and output
    # tokens cannot fit is a usage error naming the option, the depth and the context; a default one is left out
    # and said so
    for spec in probe_registry.specs():
        if spec.depths is None:
            continue
        field, flag, probe, output = spec.depths, OPTION_BY_NAME[spec.depths].cli, spec.name, spec.output(settings) or 0
        output_flag = OPTION_BY_NAME[spec.output_tokens].cli if isinstance(spec.output_tokens, str) else None
        given: tuple[int, ...] = getattr(settings, field)
        over = [d for d in given if not spec.fits(d, context, settings)]
        if not over:
            continue
        tokens = f"{output} output token{'' if output == 1 else 's'}" + (f" ({output_flag})" if output_flag else "")
        if field in explicit:
            errors.append(
                f"{flag}: {', '.join(map(depth_label, over))} + {tokens} cannot fit {where}; give depths up to "
                f"{context - output:,}"
            )
        else:
            changes[field] = tuple(d for d in given if d not in over)
            notes.extend(f"{probe}@{depth_label(d)}: left out, {d:,} + {output} tokens exceed {where}" for d in over)

    # the retrieval probe's GPU default reaches the model's own limit too
    if "retrieval_depths" not in explicit and settings.retrieval_depths == RETRIEVAL_DEPTHS:
        kept = changes.get("retrieval_depths", settings.retrieval_depths)
        changes["retrieval_depths"] = retrieval_defaults(kept, context)

    target = agentic_target(settings.agentic_depth, context, settings.agentic_max_tokens)
    if target is not None and (target + settings.agentic_max_tokens > context or target < 1):
        errors.append(
            f"--kv-agentic-depth={settings.agentic_depth}: a last turn of {target:,} prompt tokens + "
            f"{settings.agentic_max_tokens} output tokens cannot fit {where}"
        )
    # an output length given explicitly that cannot fit is a usage error; a default one only leaves its probe's
    # requests out (each is counted before it is sent), so a probe that is not selected never stops the run
    for spec in probe_registry.specs():
        if not isinstance(spec.output_tokens, str):
            continue
        field, probe, value = spec.output_tokens, spec.name, spec.output(settings)
        flag = OPTION_BY_NAME[field].cli
        if value is None or value < context:
            continue
        if field in explicit:
            errors.append(f"{flag}={value} cannot fit {where}" + (" (with a prompt)" if field == "max_tokens" else ""))
        else:
            notes.append(f"{probe}: every request left out, its {value:,} output tokens ({flag}) exceed {where}")
    return errors, notes, changes


def fit_context(settings: Settings) -> Settings:
    """``settings`` with the context known before any boot, its default depths that cannot fit left out
    (``context_notes``); SettingsError (a usage error) for an explicit value that cannot fit."""
    if not settings.active:
        return settings
    context, source = known_context(settings)
    if context is None or source is None:
        return settings
    errors, notes, changes = problems(settings, context, source)
    if errors:
        raise SettingsError("; ".join(errors))
    return replace(settings, context_tokens=context, context_source=source, context_notes=tuple(notes), **changes)


def check_at_boot(settings: Settings, max_model_len: int | None, boot_id: str) -> tuple[str | None, list[str]]:
    """At a boot whose engine holds less context than was known before (or none was known): the error for
    an explicit value that cannot fit the engine's ``max_model_len`` (the boot fails before any request),
    and the notes for defaults that probes will leave out."""
    if not max_model_len or (settings.context_tokens is not None and max_model_len >= settings.context_tokens):
        return None, []
    errors, notes, _ = problems(settings, int(max_model_len), f"max_model_len of {boot_id}'s engine")
    return ("; ".join(errors) if errors else None), notes
