"""Settings: every ``--kv-…`` option, declared once on the field it sets, resolved once, frozen.

Precedence is CLI > environment (``PYTEST_KVCACHE_…``) > ini/pyproject (``kv_…``) > default. Each field
declared with :func:`~pytest_kvcache.config.options.option` is an option: its flag, ini key, environment
variable, help, parser, default and serialisation follow from that one declaration (``config/options.py``).
Resolution (``config/resolve.py``) reads configuration only; the run store and stored runs are opened after
it (``stored.py``, after the report), and the boot plan is built from the result once (``config/plan.py``).

Each name is imported from where it lives (this module re-exports nothing): ``config/constants.py`` (data),
``config/options.py`` (the declaration), ``config/values.py`` and ``config/grammars.py`` (value parsers),
``config/arms.py`` and ``config/kinds.py`` (arms), ``config/plan.py`` (the boot plan), ``config/resolve.py``.

This module is plain Python (no pytest): the plugin feeds it the raw values it read.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, TypedDict

from pytest_kvcache.config import embedded as embedded_models
from pytest_kvcache.config.arms import Arm
from pytest_kvcache.config.budget import arm_budget
from pytest_kvcache.config.kinds import engine_kind
from pytest_kvcache.config.options import NOT_SERIALISED, TO_DICT, UNBOUND, OptionSpec, option, options_of, serialise
from pytest_kvcache.config.probing import ProbeOptions
from pytest_kvcache.config.serving import ServingOptions
from pytest_kvcache.model.options import ReportOptions


class ClientLimits(TypedDict):
    """The measuring client's limits, as ``Client`` takes them."""

    request_timeout_s: float
    stall_timeout_s: float
    first_token_floor_s: float | None
    min_prefill_tps: float


@dataclass(frozen=True)
class Settings(ProbeOptions, ServingOptions):
    """The resolved options of a run. Every field declared with ``option(…)`` is an option (one declaration:
    flag, ini key, env variable, help, parser, default, serialisation); the rest are derived by resolution."""

    arms: tuple[Arm, ...] = option(
        help=(
            "comma-separated arms; the first is the baseline. An arm is a named arm from "
            "[tool.pytest_kvcache.arms.NAME], an alias (fp8, e5m2, int8, bf16) or a vLLM --kv-cache-dtype value. "
            "Without arms the plugin does nothing."
        ),
        metavar="A,B[,C...]",
        default=(),
        required=True,
    )
    #: Parallel lanes (pytest-xdist workers) the blocks of boots are placed on; 1 without pytest-xdist.
    lanes: int = 1
    #: The context (tokens one request may fill) known before any boot: the embedded model's, a model
    #: folder's config, ``--max-model-len``/``--ctx-size`` in the engine arguments; None: known at boot.
    context_tokens: int | None = None
    #: where ``context_tokens`` came from, in words
    context_source: str | None = None
    #: default probe points left out before any boot because they cannot fit ``context_tokens``
    context_notes: tuple[str, ...] = ()
    #: Where the run store's baselines are on this machine (``config.locations.baselines_dir_of``: no I/O).
    store_baselines: Path | None = field(default=None, metadata=NOT_SERIALISED)
    #: the options given explicitly (CLI, environment or ini), by name: an explicit depth that cannot fit
    #: is an error, a default one is left out and said so
    explicit: frozenset[str] = field(default=frozenset(), metadata=NOT_SERIALISED)

    @property
    def active(self) -> bool:
        return bool(self.arms)

    @property
    def baseline(self) -> Arm:
        return self.arms[0]

    @property
    def embedded(self) -> bool:
        return self.model is None

    @property
    def embedded_spec(self) -> embedded_models.EmbeddedModel:
        """The embedded model served when ``model`` is None."""
        return embedded_models.EMBEDDED[self.embedded_model]

    @property
    def embedded_dtype(self) -> str | None:
        """The weights dtype vLLM serves the embedded trained model in (None: the tiny model, dummy weights):
        float32, or bfloat16 for every arm of a run where an arm has a float16 or bfloat16 KV cache —
        vLLM 0.32's CPU build returns garbage with those on float32 weights."""
        if not self.embedded_spec.trained:
            return None
        return (
            "bfloat16"
            if any(a.kv_cache_dtype in engine_kind(self.engine).half_kv_on_float32 for a in self.arms)
            else "float32"
        )

    @property
    def rounds(self) -> int:
        """Boots per arm the plan holds: ``--kv-replicates``, and up to the boot budget ``--kv-max-replicates``
        when rounds may be added (an undecided gate, or a CI wider than ``--kv-target-ci``; see
        :func:`boot_budget`). Rounds past ``--kv-replicates`` are adaptive: booted only while needed."""
        return max(self.replicates, self.max_replicates or 0)

    def lane_cards(self, lane: int) -> str | None:
        """The cards lane ``lane``'s engines see (its ``--kv-gpu-groups`` group), or None: not pinned."""
        return self.gpu_groups[lane] if self.gpu_groups and lane < len(self.gpu_groups) else None

    def to_dict(self) -> dict[str, Any]:
        """The settings as run.json stores them: each field by its name (or its own ``to_dict`` encoder)."""
        out: dict[str, Any] = {}
        for f in sorted(fields(self), key=lambda f: f.name != "arms"):  # the arms first, as always
            value = getattr(self, f.name)
            if TO_DICT not in f.metadata:
                out[f.name] = serialise(value)
            elif (encode := f.metadata[TO_DICT]) is not None:
                out.update(encode(value, self))
        return out

    def client_kwargs(self) -> ClientLimits:
        """The measuring client's limits (``Client(url, **settings.client_kwargs())``)."""
        return {
            "request_timeout_s": self.request_timeout_s,
            "stall_timeout_s": self.stall_timeout_s,
            "first_token_floor_s": self.first_token_floor_s,
            "min_prefill_tps": self.min_prefill_tps,
        }

    def kv_budget(self, arm: Arm) -> int | None:
        """``arm``'s KV budget in bytes (its own ``--kv-cache-memory-bytes``, else ``--kv-cache-bytes``)."""

        return arm_budget(self.engine_args, arm.args, self.cache_bytes, engine_kind(self.engine).budget_flag)

    @property
    def baselines_dir(self) -> Path:
        return self.store_baselines if self.store_baselines is not None else self.report_dir.parent / "baselines"

    def _stored(self, name: str) -> Path:
        """A stored run by name: in the store, or the old workspace folder it could not be imported from."""
        path = self.baselines_dir / name
        legacy = self.report_dir.parent / "baselines" / name
        return path if path.exists() or not legacy.exists() else legacy

    def report_options(self) -> ReportOptions:
        base = self.baselines_dir
        return ReportOptions(
            gates=self.gates,
            inconclusive=self.inconclusive,
            compare=self._stored(self.compare) if self.compare else None,
            noise=self._stored(self.noise) if self.noise else None,
            allow_diff=self.allow_diff,
            save_as=base / self.save if self.save else None,
        )


#: Every option: the ones declared on ``Settings`` fields, in field order, then those that set no field.
OPTIONS: tuple[OptionSpec, ...] = tuple(sorted((*options_of(Settings), *UNBOUND), key=lambda o: o.name != "arms"))
OPTION_BY_NAME: Mapping[str, OptionSpec] = {spec.name: spec for spec in OPTIONS}
