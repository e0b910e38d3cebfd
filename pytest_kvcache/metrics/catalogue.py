"""The metric catalogue: every metric the plugin measures, declared once.

One :class:`Metric` per name says everything a reader needs: its band family (``report.bands`` and
``data/noise_bands.json``: metrics whose boot-to-boot spread is alike), its unit, which way is better, whether
it is compared between arms (deltas, gates) or only summarised, its axis label and its display format. The
probe registry takes its metric groups from here, the statistics their direction, the client the names it
measures, the report (tables, terminal, plots, bands) its units, labels and formats, the progress lines their
short labels. A new metric is one :func:`register` call (or one entry below)::

    from pytest_kvcache.metrics.catalogue import Metric, register

    register(Metric("tool_calls_per_s", family="decode rate", unit="calls/s", direction="higher"))

A name nobody declared (a user probe's own metric) is read from its suffix, as units are spelled in names:
``*_tps`` a rate (higher is better, the decode-rate family), ``*_s`` a time (lower, latency, shown in s/ms),
anything else lower-is-better, no family, two decimals. Plain Python: imports nothing of the package.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

Direction = Literal["higher", "lower"]
#: How a value is shown: ``seconds`` (``1.234 s`` / ``120 ms``), ``count`` (``12,345``), ``joules``
#: (``2.07 J`` / ``54.2 mJ``: three significant digits), ``decimal`` (``1,234.56``), ``percent`` (a share:
#: ``0.85`` → ``85%``).
Format = Literal["seconds", "count", "joules", "decimal", "percent"]
#: Which metrics travel together: ``client`` (every request record, ``Sample.measures``), ``engine``
#: (``/metrics`` deltas around a request), ``spec`` (speculative decoding), ``energy``, ``fidelity``,
#: ``count`` (token counts), ``trial`` (a concurrency trial's), ``capacity``, ``boot`` (a boot's evidence),
#: ``retrieval`` (the retrieval probe's accuracy), ``user`` (declared by a user, or read from a name).
Group = Literal[
    "client", "engine", "spec", "energy", "fidelity", "count", "trial", "capacity", "boot", "retrieval", "user"
]

#: The band families, in ``noise_bands.json``'s order. A metric of none of them (token counts) gets the widest
#: timing band when a band is needed (``report.bands``). ``capacity``: a search's knee, one whole number of
#: sessions per boot — its spread between boots is no timing's (``benchmarks/noise_bands.py`` derives it from a
#: capacity A/A, floored at one session's step at the knee).
FAMILIES = ("decode rate", "latency", "queueing", "prefill rate", "acceptance", "fidelity", "capacity")


@dataclass(frozen=True)
class Metric:
    """One metric: ``family`` its band family (None: none of its own); ``unit`` as a reader says it;
    ``direction`` which way is better; ``compared``: deltas and gates between arms (False: only summarised);
    ``label`` its axis label (default: the name, with ``(unit)`` for rates and times); ``format`` how a value
    is shown; ``short`` its name on a progress line (empty: not shown there); ``group`` what travels with it."""

    name: str
    family: str | None
    unit: str
    direction: Direction
    compared: bool = True
    label: str = ""
    format: Format = "decimal"
    short: str = ""
    group: Group = "user"
    #: compared between arms as a difference, not a ratio (an accuracy: ``fp8 >= auto - 0.05`` in points)
    additive: bool = False
    #: declared (False: read from the name's suffix)
    declared: bool = field(default=True, compare=False)

    def __post_init__(self) -> None:
        if self.family is not None and self.family not in FAMILIES:
            raise ValueError(f"metric {self.name}: family {self.family!r} is not one of {', '.join(FAMILIES)}")
        if self.direction not in ("higher", "lower"):
            raise ValueError(f"metric {self.name}: direction must be 'higher' or 'lower', got {self.direction!r}")
        if not self.label:
            object.__setattr__(self, "label", suffix_label(self.name))

    @property
    def higher_is_better(self) -> bool:
        return self.direction == "higher"

    def text(self, value: float | None) -> str:
        """``value`` in this metric's display format; ``–`` for none or NaN."""
        return show(value, self.format)


def suffix_label(name: str) -> str:
    """The axis label a name gets from its unit suffix: ``x_tps (tokens/s)``, ``x_s (s)``, else the name."""
    if name.endswith("_tps"):
        return f"{name} (tokens/s)"
    if name.endswith("_s"):
        return f"{name} (s)"
    return name


def from_name(name: str) -> Metric:
    """An undeclared metric, read from its unit suffix (``*_tps`` a rate, ``*_s`` a time)."""
    if name.endswith("_tps"):
        return Metric(name, "decode rate", "tokens/s", "higher", declared=False)
    if name.endswith("_s"):
        return Metric(name, "latency", "s", "lower", format="seconds", declared=False)
    return Metric(name, None, "", "lower", declared=False)


def joules_text(value: float | None) -> str:
    """``2.07 J`` / ``54.2 mJ`` / ``9.90 kJ`` / ``–``: three significant digits, no exponent."""
    if value is None or value != value:
        return "–"
    for scale, unit in ((1e6, "MJ"), (1e3, "kJ"), (1.0, "J"), (1e-3, "mJ"), (1e-6, "µJ")):
        if abs(value) >= scale or scale == 1e-6:
            x = value / scale
            return f"{x:.0f} {unit}" if abs(x) >= 100 else f"{x:.1f} {unit}" if abs(x) >= 10 else f"{x:.2f} {unit}"
    return "–"  # pragma: no cover - the loop always returns


def show(value: float | None, how: Format) -> str:
    """A value in a display format; ``–`` for none or NaN."""
    if value is None or value != value:
        return "–"
    if how == "joules":
        return joules_text(float(value))
    if how == "seconds":
        return f"{value:.3f} s" if abs(value) >= 1 else f"{value * 1000:.0f} ms"
    if how == "count":
        return f"{value:,.0f}"
    if how == "percent":
        return f"{value * 100:.0f}%"
    return f"{value:,.2f}"


_TPS = "tokens/s"
STOCK: tuple[Metric, ...] = (
    # ---- every request record (``sample.Sample.measures``), in record order
    Metric(
        "ttft_s",
        "latency",
        "s",
        "lower",
        label="time to first token (s)",
        format="seconds",
        short="ttft",
        group="client",
    ),
    Metric("wall_tps", "decode rate", _TPS, "higher", group="client"),
    Metric("decode_tps", "decode rate", _TPS, "higher", short="decode tok/s", group="client"),
    Metric("prefill_tps", "prefill rate", _TPS, "higher", short="prefill tok/s", group="client"),
    # ---- engine-side timings: ``/metrics`` deltas around a request
    Metric("engine_ttft_s", "latency", "s", "lower", format="seconds", group="engine"),
    Metric("engine_prefill_s", "prefill rate", "s", "lower", format="seconds", group="engine"),
    Metric("engine_decode_s", "latency", "s", "lower", format="seconds", group="engine"),
    #: time in the engine's queue: near zero when idle, so its relative spread is no latency's
    Metric("engine_queue_s", "queueing", "s", "lower", format="seconds", group="engine"),
    # ---- speculative decoding per request (``metrics.spec_metrics``): present only when the engine drafted
    Metric(
        "acceptance_length",
        "acceptance",
        "tokens per step",
        "higher",
        label="acceptance length (tokens per step)",
        group="spec",
    ),
    Metric(
        "acceptance_rate",
        "acceptance",
        "share of drafts",
        "higher",
        label="acceptance rate (share of drafts)",
        group="spec",
    ),
    # ---- energy per token over a request's windows, on its boot's own cards (``report.energy``): J per output
    # token over the decode window (power over the decode rate: it inherits the rate's boot-to-boot spread), J
    # per prefilled prompt token over the prefill window
    Metric("energy_per_token", "decode rate", "J/token", "lower", format="joules", group="energy"),
    Metric("energy_per_prompt_token", "prefill rate", "J/prompt token", "lower", format="joules", group="energy"),
    # ---- fidelity per block of scored positions, each already a difference from the baseline arm
    Metric("logprob_drift", "fidelity", "nats/token", "lower", group="fidelity"),
    Metric("kl_topk", "fidelity", "nats/token", "lower", group="fidelity"),
    Metric("nll_delta", "fidelity", "nats/token", "lower", group="fidelity"),
    # ---- token counts: summarised, never compared as a delta or gated
    Metric(
        "prompt_tokens", None, "tokens", "lower", compared=False, label="prompt tokens", format="count", group="count"
    ),
    Metric("cached_tokens", None, "tokens", "lower", compared=False, format="count", group="count"),
    # ---- a concurrency trial (N simultaneous streams)
    Metric("aggregate_tps", "decode rate", _TPS, "higher", group="trial"),
    Metric("stream_tps_median", "decode rate", _TPS, "higher", group="trial"),
    Metric("ttft_p95_s", "latency", "s", "lower", format="seconds", group="trial"),
    # ---- the capacity probe: sessions an arm sustains under the SLO
    Metric("capacity", "capacity", "sessions", "higher", group="capacity"),
    # the KV-residency knee: the sessions whose prefixes the cache holds (prefix-cache hit rate at least half)
    Metric("kv_residency", "capacity", "sessions", "higher", label="KV-resident sessions", group="capacity"),
    # ---- the retrieval probe: the share of needles found (``report.retrieval``: Wilson intervals per cell, paired
    # differences in points between arms)
    Metric(
        "retrieval_acc",
        None,
        "share of needles",
        "higher",
        label="retrieval accuracy",
        format="percent",
        group="retrieval",
        additive=True,
    ),
    # ---- a boot's evidence, shown beside the metrics
    Metric("kv_cache_size_tokens", None, "tokens", "higher", compared=False, format="count", group="boot"),
)

_DECLARED: dict[str, Metric] = {m.name: m for m in STOCK}


def register(metric: Metric) -> Metric:
    """Declare (or redeclare, for the same name) a metric; every reader sees it at once. Returns it."""
    if not metric.name.isidentifier():
        raise ValueError(f"metric name {metric.name!r} must be an identifier (a record key and a gate's metric)")
    _DECLARED[metric.name] = metric
    return metric


def unregister(name: str) -> None:
    """Forget a declared metric (a test's toy); a stock one goes back to its :data:`STOCK` entry, in its place."""
    stock = {m.name: m for m in STOCK}
    if name in stock:
        _DECLARED[name] = stock[name]
    else:
        _DECLARED.pop(name, None)


def get(name: str) -> Metric:
    """The declared metric, else the one its name's suffix describes."""
    return _DECLARED.get(name) or from_name(name)


def declared() -> tuple[Metric, ...]:
    return tuple(_DECLARED.values())


def names(*groups: Group) -> tuple[str, ...]:
    """Declared metrics of the groups, in declaration order."""
    return tuple(m.name for m in _DECLARED.values() if m.group in groups)


def families() -> dict[str, tuple[str, ...]]:
    """Band family → its declared metrics (the families with none left out)."""
    out = {name: tuple(m.name for m in _DECLARED.values() if m.family == name) for name in FAMILIES}
    return {name: found for name, found in out.items() if found}


def family(name: str) -> str | None:
    return get(name).family


def higher_is_better(name: str) -> bool:
    return get(name).higher_is_better


def direction(name: str) -> Direction:
    return get(name).direction


def compared(name: str) -> bool:
    return get(name).compared


def text(value: float | None, name: str) -> str:
    """``value`` shown in the format of metric ``name``."""
    return get(name).text(value)


def label(name: str) -> str:
    """Metric ``name``'s axis label with its unit."""
    return get(name).label


def additive(name: str) -> bool:
    """Compared between arms as a difference (an accuracy), not a ratio."""
    return get(name).additive


def additive_names() -> tuple[str, ...]:
    return tuple(m.name for m in _DECLARED.values() if m.additive)


def undeclared(found: Iterable[str]) -> list[str]:
    """The names among ``found`` the catalogue does not declare."""
    return [name for name in found if name not in _DECLARED]
