"""The grammars of the option values that are more than a word: a gate (``--kv-fail``), a latency SLO
(``--kv-capacity-slo``) and a GPU power limit (``--kv-gpu-power-limit``). Plain data and parsing, read by the
settings when an option is resolved and by the report, the capacity probe and the GPU code when they apply it.
No I/O."""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from pytest_kvcache.metrics import catalogue

# ------------------------------------------------------------------------------------------ gates

Op = Literal[">=", "<=", ">", "<"]
GateKind = Literal["between", "baseline", "absolute", "saved"]

NAME = r"[A-Za-z0-9][\w.\-]*"
NUM = r"\d+(?:\.\d+)?"
GATE = re.compile(r"^\s*(?P<metric>[^\[\s]+)\s*\[(?P<sel>[^\]]*)\]\s*:\s*(?P<cond>.*?)\s*$")
OP = r"(?P<op>>=|<=|>|<)"
BETWEEN = re.compile(
    rf"^(?P<arm>{NAME})\s*{OP}\s*(?P<arm2>{NAME})\s*(?:\*\s*(?P<factor>{NUM})|(?P<sign>[+-])\s*(?P<offset>{NUM}))?$"
)
SAVED = re.compile(rf"^{OP}\s*saved\s*(?:\*\s*(?P<factor>{NUM})|(?P<pct>[+-]{NUM})\s*%)?$")
BASELINE = re.compile(rf"^{OP}\s*(?P<pct>[+-]{NUM})\s*%$")
ABSOLUTE = re.compile(rf"^(?:(?P<arm>{NAME})\s*)?{OP}\s*(?P<num>-?{NUM})$")


class GateError(ValueError):
    """A malformed gate or one naming an unknown metric, probe or arm."""


@dataclass(frozen=True)
class Gate:
    text: str
    metric: str
    probe: str
    point: str | None
    kind: GateKind
    op: Op
    threshold: float
    arm: str | None = None
    other: str | None = None
    #: a between-arm gate on a difference, not a ratio (``retrieval_acc[retrieval@32k]: fp8 >= auto - 0.05``):
    #: ARM − ARM2 is held to ``offset`` (the threshold is then this offset); only for the metrics the catalogue
    #: compares as differences (accuracies)
    offset: float | None = None


OPS: dict[str, Op] = {">=": ">=", "<=": "<=", ">": ">", "<": "<"}


def _op(text: str) -> Op:
    return OPS[text]


def parse_gate(text: str, arms: Sequence[str] | None = None) -> Gate:
    """Read one gate; ``arms`` (when known) are checked. Errors point at the bad part."""
    m = GATE.match(text)
    if not m:
        raise GateError(f"gate {text!r}: expected METRIC[SELECTOR]: CONDITION, e.g. 'decode_tps[short]: >= -5%'")
    metric, sel, cond = m.group("metric"), m.group("sel").strip(), m.group("cond")
    probe, _, point = sel.partition("@")
    if not re.fullmatch(r"\w+", metric):
        raise GateError(f"gate {text!r}: a metric is a name like decode_tps, got {metric!r}")
    if not re.fullmatch(r"\w+", probe):
        raise GateError(f"gate {text!r}: a selector is PROBE or PROBE@POINT, got [{sel}]")
    if "@" in sel and not point:
        raise GateError(f"gate {text!r}: empty point after '@' in [{sel}]")

    def check_arm(name: str | None) -> None:
        if name is not None and arms is not None and name not in arms:
            raise GateError(f"gate {text!r}: unknown arm {name!r}; arms: {', '.join(arms)}")

    make = functools.partial(Gate, text=text.strip(), metric=metric, probe=probe, point=point or None)
    b = BETWEEN.match(cond)
    if b and b.group("arm2") != "saved" and not re.fullmatch(NUM, b.group("arm2")):
        check_arm(b.group("arm"))
        check_arm(b.group("arm2"))
        if b.group("offset") is not None:
            offset = float(b.group("offset")) * (-1 if b.group("sign") == "-" else 1)
            if not catalogue.additive(metric):
                raise GateError(
                    f"gate {text!r}: '{b.group('arm2')} {b.group('sign')} {b.group('offset')}' holds a difference, "
                    f"which only an accuracy takes ({', '.join(catalogue.additive_names())}); gate {metric} as a "
                    f"ratio ('{b.group('arm')} >= {b.group('arm2')} * 0.95')"
                )
            return make(
                kind="between",
                op=_op(b.group("op")),
                threshold=offset,
                arm=b.group("arm"),
                other=b.group("arm2"),
                offset=offset,
            )
        return make(
            kind="between",
            op=_op(b.group("op")),
            threshold=float(b.group("factor") or 1.0),
            arm=b.group("arm"),
            other=b.group("arm2"),
        )
    if s := SAVED.match(cond):
        factor = float(s.group("factor")) if s.group("factor") else 1.0 + float(s.group("pct") or 0) / 100
        return make(kind="saved", op=_op(s.group("op")), threshold=factor)
    if p := BASELINE.match(cond):
        return make(kind="baseline", op=_op(p.group("op")), threshold=1.0 + float(p.group("pct")) / 100)
    if a := ABSOLUTE.match(cond):
        check_arm(a.group("arm"))
        return make(kind="absolute", op=_op(a.group("op")), threshold=float(a.group("num")), arm=a.group("arm"))
    raise GateError(
        f"gate {text!r}: cannot read the condition {cond!r}; expected 'ARM >= ARM2 [* F | - D]', '<= +10%', "
        f"'>= 30', '[ARM] >= 30' or '<= saved [+P% | * F]'"
    )


def unusable(
    gate: Gate, arms: Sequence[str], points: Mapping[str, Sequence[str]] | None = None, *, relative: bool = False
) -> str | None:
    """Why ``gate`` cannot be evaluated in a run of ``arms`` (the baseline first), or None. ``points``: the points
    each probe has in the run (its depths, levels …), where known; ``relative``: the gate's probe measures every
    other arm against the baseline already (it has no figures of its own for the baseline)."""
    if gate.kind == "baseline" and len(arms) < 2:
        return (
            f"it compares every other arm with the baseline arm {arms[0]!r}, and the run has no second arm; give "
            f"one (--kv-arms={arms[0]},OTHER) or gate an absolute value ('{gate.metric}[{gate.probe}]: <= N')"
        )
    if relative and gate.kind == "absolute" and gate.arm is None and len(arms) < 2:
        return (
            f"{gate.probe} measures every other arm against the baseline arm {arms[0]!r}, and the run has no "
            "second arm to measure"
        )
    if relative and gate.kind == "absolute" and gate.arm == arms[0]:
        return (
            f"{gate.probe} measures every other arm against the baseline arm {arms[0]!r}: the baseline has no figures"
        )
    known = (points or {}).get(gate.probe)
    if gate.point is not None and known is not None and gate.point not in known:
        have = ", ".join(known) if known else "none"
        return f"{gate.probe} has no point {gate.point} in this run (its points: {have})"
    return None


# ------------------------------------------------------------------------------------------ SLO

SloMetric = Literal["ttft", "itl"]


@dataclass(frozen=True)
class SloTerm:
    """One bound of an SLO: the ``quantile``-th percentile of a turn measure ``metric`` at most ``limit_s``."""

    metric: SloMetric
    quantile: int
    limit_s: float

    @property
    def name(self) -> str:
        return f"{self.metric}_p{self.quantile}"

    def text(self) -> str:
        limit = f"{self.limit_s:g}s" if self.limit_s >= 1 else f"{self.limit_s * 1000:g}ms"
        return f"{self.name}<={limit}"


@dataclass(frozen=True)
class Slo:
    """A latency SLO over a trial's measured turns, e.g. ``ttft_p95<=2s,itl_p95<=60ms``."""

    terms: tuple[SloTerm, ...]

    def text(self) -> str:
        return ",".join(t.text() for t in self.terms)

    def to_dict(self) -> dict[str, float]:
        return {t.name: t.limit_s for t in self.terms}

    def limit(self, metric: SloMetric) -> float:
        """The tightest limit on ``metric`` (a single turn above it does not meet the SLO); inf: unbounded."""
        return min((t.limit_s for t in self.terms if t.metric == metric), default=math.inf)


SLO_TERM = re.compile(r"^\s*(ttft|itl)_p(\d{1,2})\s*<=\s*(\d+(?:\.\d+)?)\s*(ms|s)?\s*$")


def parse_slo(text: str) -> Slo:
    """``ttft_p95<=2s,itl_p95<=60ms`` → :class:`Slo`; ValueError naming the bad part. A bare number is seconds."""
    terms: list[SloTerm] = []
    for part in str(text).split(","):
        m = SLO_TERM.match(part)
        if not m:
            raise ValueError(
                f"expected an SLO like ttft_p95<=2s,itl_p95<=60ms (ttft or itl, a percentile p1–p99, a limit in s "
                f"or ms); bad part {part.strip()!r}"
            )
        quantile = int(m.group(2))
        if not 1 <= quantile <= 99:
            raise ValueError(f"an SLO percentile is p1 to p99; got {part.strip()!r}")
        value = float(m.group(3)) / (1000.0 if m.group(4) == "ms" else 1.0)
        if value <= 0:
            raise ValueError(f"an SLO limit must be positive; got {part.strip()!r}")
        terms.append(SloTerm(metric=m.group(1), quantile=quantile, limit_s=value))  # type: ignore[arg-type]
    names = [t.name for t in terms]
    if len(set(names)) != len(names):
        raise ValueError(f"each SLO term once; got {text!r}")
    return Slo(tuple(terms))


# ------------------------------------------------------------------------------------------ power limit

_WATTS = re.compile(r"(?i)^(\d+(?:\.\d+)?)\s*w?$")


@dataclass(frozen=True)
class PowerPlan:
    """A parsed ``--kv-gpu-power-limit``: watts for every card, per NVML index, or per UUID prefix (which cards
    they are: ``gpu.power.plan_targets``).

    ``verify_only`` plans (``verify:…``) never set anything; they only check the limits in place.
    """

    spec: str
    verify_only: bool = False
    all_w: float | None = None
    by_index: Mapping[int, float] = field(default_factory=dict)
    by_uuid_prefix: Mapping[str, float] = field(default_factory=dict)


def _parse_watts(text: str, part: str) -> float:
    m = _WATTS.match(text.strip())
    if not m or float(m.group(1)) <= 0:
        raise ValueError(f"power limit {part!r}: {text.strip()!r} is not a positive number of watts")
    return float(m.group(1))


def parse_power_limit(spec: str) -> PowerPlan:
    """Parse ``300`` | ``0:300,1:250`` | ``GPU-abc…:300`` | ``verify:`` + any of those.

    Indices are NVML indices (``nvidia-smi -i``), not CUDA's renumbering after ``CUDA_VISIBLE_DEVICES``.
    Raises ValueError naming the bad part.
    """
    text = spec.strip()
    verify = False
    if text.lower().startswith("verify:"):
        verify, text = True, text[len("verify:") :].strip()
    if not text:
        raise ValueError(f"power limit {spec!r}: nothing after {'verify:' if verify else 'the option'}")
    if ":" not in text and "," not in text:
        return PowerPlan(spec=spec, verify_only=verify, all_w=_parse_watts(text, text))
    by_index: dict[int, float] = {}
    by_uuid: dict[str, float] = {}
    for raw in text.split(","):
        part = raw.strip()
        key, sep, value = part.rpartition(":")
        key = key.strip()
        if not sep or not key:
            raise ValueError(
                f"power limit {spec!r}: {part!r} needs the form INDEX:WATTS or GPU-UUID:WATTS "
                "(a bare number applies to all cards and must stand alone)"
            )
        watts = _parse_watts(value, part)
        if re.fullmatch(r"\d+", key):
            if int(key) in by_index:
                raise ValueError(f"power limit {spec!r}: GPU index {key} is given twice")
            by_index[int(key)] = watts
        elif re.fullmatch(r"(?i)GPU-[0-9a-f][0-9a-f-]*", key):
            if key.lower() in (k.lower() for k in by_uuid):
                raise ValueError(f"power limit {spec!r}: {key} is given twice")
            by_uuid[key] = watts
        else:
            raise ValueError(f"power limit {spec!r}: {key!r} in {part!r} is neither a GPU index nor a GPU-… UUID")
    return PowerPlan(spec=spec, verify_only=verify, by_index=by_index, by_uuid_prefix=by_uuid)
