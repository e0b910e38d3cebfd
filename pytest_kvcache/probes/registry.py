"""The probe registry: one :class:`ProbeSpec` per probe, read by every layer.

The plugin registers its markers and orders tests by it, the report takes each probe's metrics, primary
metric, axis, pairing, curve and title from it, and gates check their ``METRIC[PROBE]`` against it. The
stock probes register here; a user's probe registers a spec in its own test file::

    from pytest_kvcache.probes.registry import ProbeSpec, register

    register(ProbeSpec(name="oneline", title="One-line answers", metrics=("decode_tps", "ttft_s"),
                       primary_metric="decode_tps"))

    @pytest.mark.oneline
    def test_oneline(kv_server, kv_client, kv_record): ...

and is then summarised, plotted, delta'd and gateable (``--kv-fail="decode_tps[oneline]: >= -5%"``) like
a stock probe. Every spec a run used is written into ``run.json``, so a stored run re-renders (and can be
gated) without the user's file. Plain Python: no pytest.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal, cast

from pytest_kvcache.metrics import catalogue
from pytest_kvcache.model.evidence import ProbeSpecData

PointKind = Literal["shape", "depth", "turn"]
CurveX = Literal["depth", "prompt_tokens"]
Label = Literal["shape", "at", "plain"]

# The metric groups, as the catalogue declares them (``metrics.catalogue``: each metric's family, unit,
# direction, label and format are there).
#: Metrics every request record carries (``Sample.measures``): a user's probe may use any of them.
CLIENT_METRICS = catalogue.names("client")
#: Engine-side timings (``/metrics`` deltas around a request) a record may carry.
ENGINE_METRICS = catalogue.names("engine")
#: Speculative decoding per request, from the ``/metrics`` deltas (``metrics.spec_metrics``): present only
#: when the engine drafted; higher is better.
SPEC_METRICS = catalogue.names("spec")
#: Fidelity per block of scored positions, each already a difference from the baseline arm
#: (``probes.fidelity``): lower is better, gated as absolutes (``logprob_drift[fidelity@32k]: int8 <= 0.05``).
FIDELITY_METRICS = catalogue.names("fidelity")
#: Energy per token over a request's windows, on its boot's own cards (``report.energy``): J per output token
#: over the decode window, J per prefilled prompt token over the prefill window; lower is better. Present only
#: where NVML metered the cards and a point's windows were long enough for the counter's steps.
ENERGY_METRICS = catalogue.names("energy")
#: Token counts: summarised, never compared as a delta or gated.
COUNT_METRICS = catalogue.names("count")


def depth_label(depth: int) -> str:
    """A depth as a point's name: ``10000`` → ``10k``, ``1500`` → ``1500``."""
    return f"{depth // 1000}k" if depth % 1000 == 0 else str(depth)


def level_label(streams: int) -> str:
    """A concurrency level as a point's name: ``4`` → ``c4``."""
    return f"c{streams}"


#: Output tokens of a fresh-prefill request (``probes.prefill.MAX_TOKENS``).
PREFILL_OUTPUT_TOKENS = 16
#: A retrieval request's answer: a few greedy tokens (``probes.retrieval.answer_tokens``).
RETRIEVAL_OUTPUT_TOKENS = 24
#: A fidelity request scores its prompt and generates one token.
FIDELITY_OUTPUT_TOKENS = 1


@dataclass(frozen=True)
class Axis:
    """A probe's own parametrization: a test that takes ``fixture`` runs once per value (and per boot), named
    ``ids(value)``. The values are those of the option ``option`` (a ``Settings`` field: ``--kv-depths`` is
    ``depths``), 1..N where the option is a ``count`` (``--kv-sessions``), or what ``values(settings)`` returns (a
    probe from outside the package, whose option is its own). ``points``: the values name the probe's report
    points too, so a gate on another point is refused before any boot."""

    fixture: str
    option: str
    ids: Callable[[Any], str] = str
    count: bool = False
    points: bool = False
    values: Callable[[Any], Sequence[Any]] | None = None

    def of(self, settings: object) -> tuple[Any, ...]:
        """The axis's values for a run's settings."""
        if self.values is not None:
            return tuple(self.values(settings))
        value = getattr(settings, self.option)
        return tuple(range(1, value + 1)) if self.count else tuple(value)


@dataclass(frozen=True)
class ProbeSpec:
    """What the report needs to know of one probe.

    ``metrics`` in table order; ``primary_metric`` drives adaptive sampling and the per-boot table;
    ``point`` says which record field is the probe's axis (``shape``, ``depth`` → ``10k``, ``turn`` →
    ``turnN``); ``own_section``: the probe's metrics are differences from the baseline arm already
    (fidelity), so it gets no ratio deltas, crossovers or generic table and plot, only its own report
    section; ``paired_by`` names the record fields that make a request the same prompt in every arm
    (within a replicate), only for records whose shape is in ``paired_shapes`` when given; ``curve`` the
    metrics drawn and tested for a crossover against ``curve_x``; ``markers`` the extra markers the probe's
    tests carry (``depth``).
    """

    name: str
    title: str
    metrics: tuple[str, ...]
    primary_metric: str
    marker: str = ""
    marker_help: str = ""
    order: int = 100
    point: PointKind = "shape"
    paired_by: tuple[str, ...] | None = None
    paired_shapes: tuple[str, ...] | None = None
    curve: tuple[str, ...] = ()
    curve_x: CurveX | None = None
    exclude_first_point: bool = False
    markers: tuple[str, ...] = ()
    label: Label = "plain"
    trials: bool = False
    own_section: bool = False
    #: each boot's records at a point are one search (the capacity probe's): ``report.capacity`` turns them
    #: into one frame row per boot and point, whose metrics carry their own bootstrap (``frame.compare``)
    search: bool = False
    #: the ``Settings`` field that says how many measured requests a point plans (``runs``, ``depth_runs``,
    #: ``turns``); run-time only (not stored with the spec), as are the fields below
    requests_option: str | None = None
    #: its own parametrization (``kv_depth`` over ``--kv-depths``): the plugin parametrizes every test that takes
    #: the fixture
    axis: Axis | None = None
    #: the ``Settings`` field that holds its depths (prompts of that many tokens), and the tokens each of its
    #: requests generates beyond its prompt (a count, or the ``Settings`` field that says it): what decides whether
    #: a depth fits the model's context (:meth:`fits`) — a default depth that cannot is left out, a given one is
    #: a usage error
    depths: str | None = None
    output_tokens: int | str = 0
    #: its line in the boot plan when its tests are selected (None: it adds none)
    plan: Callable[[Any], str | None] | None = None

    def __post_init__(self) -> None:
        if not self.name.isidentifier():
            raise ValueError(f"probe name {self.name!r} must be an identifier (it is a marker and a gate selector)")
        if self.primary_metric not in self.metrics:
            raise ValueError(f"probe {self.name}: primary_metric {self.primary_metric!r} is not in its metrics")
        if self.curve and self.curve_x is None:
            raise ValueError(f"probe {self.name}: a curve needs curve_x ('depth' or 'prompt_tokens')")
        if not self.marker:
            object.__setattr__(self, "marker", self.name)

    @property
    def compared_metrics(self) -> tuple[str, ...]:
        """The metrics that get deltas and gates (the catalogue's ``compared``: token counts are only
        summarised)."""
        return tuple(m for m in self.metrics if catalogue.compared(m))

    def output(self, settings: object) -> int | None:
        """The tokens one of its requests generates beyond its prompt (None: the option leaves it to each request)."""
        if isinstance(self.output_tokens, int):
            return self.output_tokens
        value = getattr(settings, self.output_tokens)
        return value if isinstance(value, int) else None

    def fits(self, depth: int, context: int, settings: object = None) -> bool:
        """Whether a request at ``depth`` prompt tokens, and what it generates, fits a context of ``context``."""
        return depth + (self.output(settings) or 0) <= context

    def planned_points(self, settings: object) -> tuple[str, ...] | None:
        """The points its settings give it (its depths, or its axis's values where they are its points); None
        where they do not follow from the settings."""
        if self.depths is not None:
            return tuple(map(depth_label, getattr(settings, self.depths)))
        if self.axis is not None and self.axis.points:
            return tuple(map(self.axis.ids, self.axis.of(settings)))
        return None

    def planned_requests(self, settings: object) -> int | None:
        """How many measured requests one point of this probe plans (progress's ``i/N``): the value of the
        option ``requests_option`` names on ``settings`` (a resolved ``Settings``); None when the spec names
        none (a search, a trial's streams, a user's probe)."""
        if self.requests_option is None:
            return None
        value = getattr(settings, self.requests_option, None)
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    def to_dict(self) -> ProbeSpecData:
        return {
            "name": self.name,
            "marker": self.marker,
            "title": self.title,
            "metrics": list(self.metrics),
            "primary_metric": self.primary_metric,
            "order": self.order,
            "point": self.point,
            "paired_by": list(self.paired_by) if self.paired_by is not None else None,
            "paired_shapes": list(self.paired_shapes) if self.paired_shapes is not None else None,
            "curve": list(self.curve),
            "curve_x": self.curve_x,
            "exclude_first_point": self.exclude_first_point,
            "markers": list(self.markers),
            "label": self.label,
            "trials": self.trials,
            "own_section": self.own_section,
            "search": self.search,
        }

    @classmethod
    def from_dict(cls, data: ProbeSpecData) -> ProbeSpec:
        """A spec stored in a run folder (a user's probe, as the run saw it)."""
        paired, shapes = data.get("paired_by"), data.get("paired_shapes")
        return cls(
            name=data["name"],
            title=data.get("title") or data["name"],
            metrics=tuple(data.get("metrics") or CLIENT_METRICS),
            primary_metric=data.get("primary_metric") or "decode_tps",
            marker=data.get("marker") or data["name"],
            order=int(data.get("order", 100)),
            point=cast(PointKind, data.get("point") or "shape"),
            paired_by=tuple(paired) if paired is not None else None,
            paired_shapes=tuple(shapes) if shapes is not None else None,
            curve=tuple(data.get("curve") or ()),
            curve_x=cast("CurveX | None", data.get("curve_x")),
            exclude_first_point=bool(data.get("exclude_first_point")),
            markers=tuple(data.get("markers") or ()),
            label=cast(Label, data.get("label") or "plain"),
            trials=bool(data.get("trials")),
            own_section=bool(data.get("own_section")),
            search=bool(data.get("search")),
        )


STOCK: tuple[ProbeSpec, ...] = (
    ProbeSpec(
        name="short",
        title="Short-context probes",
        metrics=("wall_tps", "decode_tps", "ttft_s", *SPEC_METRICS, "energy_per_token"),
        primary_metric="decode_tps",
        marker_help="short-context probe (one short prompt, long decode) — narrative and code shapes.",
        order=0,
        label="shape",
        requests_option="runs",
        output_tokens="max_tokens",
    ),
    ProbeSpec(
        name="prefill",
        title="Fresh-prefill probes",
        metrics=(
            "prefill_tps",
            "ttft_s",
            "engine_prefill_s",
            *SPEC_METRICS,
            "energy_per_prompt_token",
            "prompt_tokens",
        ),
        primary_metric="prefill_tps",
        marker_help="fresh-prefill probe at exact depths (--kv-depths), every request proven cold.",
        order=1,
        point="depth",
        paired_by=("depth", "index"),
        curve=("prefill_tps", "ttft_s", "acceptance_length"),
        curve_x="depth",
        markers=("depth",),
        label="at",
        requests_option="depth_runs",
        axis=Axis("kv_depth", "depths", depth_label),
        depths="depths",
        output_tokens=PREFILL_OUTPUT_TOKENS,
    ),
    ProbeSpec(
        name="agentic",
        title="Agentic decode-at-depth",
        metrics=("decode_tps", "ttft_s", *SPEC_METRICS, *ENERGY_METRICS, "prompt_tokens", "cached_tokens"),
        primary_metric="decode_tps",
        marker_help="multi-turn coding-assistant session growing its context (--kv-sessions, --kv-turns).",
        order=2,
        point="turn",
        paired_by=("session", "turn"),
        paired_shapes=("replay",),
        curve=("decode_tps", "ttft_s", "acceptance_length"),
        curve_x="prompt_tokens",
        exclude_first_point=True,
        markers=("depth",),
        label="at",
        requests_option="turns",
        axis=Axis("kv_agentic_session", "sessions", lambda n: f"s{n}", count=True),
        output_tokens="agentic_max_tokens",
    ),
    ProbeSpec(
        name="concurrency",
        title="Concurrency (per trial: aggregate TPS, median per-stream decode TPS, p95 TTFT)",
        metrics=("aggregate_tps", "stream_tps_median", "ttft_p95_s", "energy_per_token"),
        primary_metric="aggregate_tps",
        marker_help="N simultaneous streams per arm (--kv-concurrency), aggregate and per-stream speed.",
        order=3,
        trials=True,
        requests_option="runs",
        axis=Axis("kv_concurrency", "concurrency", level_label, points=True),
        output_tokens="concurrency_max_tokens",
    ),
    ProbeSpec(
        name="fidelity",
        title="Fidelity at depth (teacher-forced prompt logprobs against the baseline arm)",
        metrics=FIDELITY_METRICS,
        primary_metric="logprob_drift",
        marker_help="fidelity probe: fixed long texts scored teacher-forced at --kv-fidelity-depths, "
        "|Δ logprob| and top-k KL against the baseline arm.",
        order=4,
        point="depth",
        label="at",
        own_section=True,
        axis=Axis("kv_fidelity_text", "fidelity_texts"),
        depths="fidelity_depths",
        output_tokens=FIDELITY_OUTPUT_TOKENS,
    ),
    ProbeSpec(
        name="capacity",
        title="Capacity (sessions sustained under the SLO, per depth)",
        metrics=catalogue.names("capacity"),
        primary_metric="capacity",
        marker_help="capacity probe: how many concurrent sessions of --kv-capacity-depths tokens each arm sustains "
        "under --kv-slo (stepped up, then bisected).",
        order=5,
        point="depth",
        label="at",
        search=True,
        axis=Axis("kv_capacity_depth", "capacity_depths", depth_label),
        depths="capacity_depths",
        output_tokens="capacity_max_tokens",
    ),
    ProbeSpec(
        name="retrieval",
        title="Retrieval at depth (needles found per depth and position, paired against the baseline arm)",
        metrics=catalogue.names("retrieval"),
        primary_metric="retrieval_acc",
        marker_help="retrieval probe: needles (numbers, word pairs) at --kv-retrieval-depths and "
        "--kv-retrieval-positions, recalled greedily; accuracy per cell with Wilson CIs, paired against the baseline.",
        order=6,
        point="depth",
        label="at",
        own_section=True,
        axis=Axis("kv_retrieval_depth", "retrieval_depths", depth_label),
        depths="retrieval_depths",
        output_tokens=RETRIEVAL_OUTPUT_TOKENS,
    ),
)

#: Markers that group probes rather than name one.
GROUP_MARKERS = {"depth": "depth: the long-context probes (prefill and agentic); -m depth selects exactly those."}

_SPECS: dict[str, ProbeSpec] = {spec.name: spec for spec in STOCK}
_LISTENERS: list[Callable[[ProbeSpec], None]] = []


def register(spec: ProbeSpec) -> ProbeSpec:
    """Add (or replace, for the same name) a probe's spec; returns it. Listeners (the plugin's marker
    registration) are told at once."""
    _SPECS[spec.name] = spec
    for listener in list(_LISTENERS):
        listener(spec)
    return spec


def on_embedded_cpu(settings: Any) -> bool:
    """Whether the run serves the embedded model itself (not an external endpoint): where the probes' CPU sizes
    apply, which their plan lines name."""
    return bool(settings.embedded and settings.launcher != "external")


def sized_for_cpu(settings: Any, probe: str, sizes: str, otherwise: str) -> str | None:
    """A plan line for the sizes a probe takes on the embedded model on the CPU (``otherwise``: what it takes
    elsewhere); None elsewhere."""
    return f"{probe} sized for the CPU: {sizes} ({otherwise})" if on_embedded_cpu(settings) else None


def with_plan(name: str, plan: Callable[[Any], str | None]) -> ProbeSpec:
    """Give a registered probe its boot-plan line (the stock probes' modules give theirs at import)."""
    return register(replace(_SPECS[name], plan=plan))


def add_listener(listener: Callable[[ProbeSpec], None]) -> None:
    _LISTENERS.append(listener)


def remove_listener(listener: Callable[[ProbeSpec], None]) -> None:
    if listener in _LISTENERS:
        _LISTENERS.remove(listener)


def get(name: str) -> ProbeSpec | None:
    return _SPECS.get(name)


def specs() -> tuple[ProbeSpec, ...]:
    return tuple(sorted(_SPECS.values(), key=lambda s: (s.order, s.name)))


def resolve(stored: Iterable[ProbeSpecData] = ()) -> dict[str, ProbeSpec]:
    """The specs a report uses: the ones a stored run wrote (as that run saw them), then the registry's."""
    found: dict[str, ProbeSpec] = {}
    for data in stored:
        spec = ProbeSpec.from_dict(data)
        found[spec.name] = spec
    for spec in specs():
        found.setdefault(spec.name, spec)
    return found


def user_spec(name: str) -> ProbeSpec:
    """The spec for records of a probe nobody registered: the client metrics, by shape."""
    return ProbeSpec(name=name, title=name, metrics=CLIENT_METRICS, primary_metric="decode_tps", order=99)
