"""Settings: every ``--kv-…`` option, its ini key and environment variable, resolved once.

Precedence is CLI > environment (``PYTEST_KVCACHE_…``) > ini/pyproject (``kv_…``) > default. Arms are
checked here, before anything boots: an arm is a named arm from ``[tool.pytest_kvcache.arms.NAME]``,
an alias (``fp8`` → ``fp8_e4m3``) or a known vLLM ``--kv-cache-dtype`` value.

This module is plain Python (no pytest): the plugin feeds it the raw values it read.
"""

from __future__ import annotations

import os
import random
import re
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, TypedDict

from pytest_kvcache.config import embedded as embedded_models
from pytest_kvcache.config.engine_kinds import ENGINE_KINDS, LLAMACPP_ALIASES, LLAMACPP_CACHE_TYPES, EngineKind
from pytest_kvcache.model import ArmData
from pytest_kvcache.report.options import ReportOptions

#: The capacity probe's default SLOs (``probes.capacity``; docs/probes/capacity.md says where they come from):
#: on the embedded CPU default (the tiny model answers a cached 2K-token turn in ~30–130 ms on 2 busy cores and
#: prefills it from scratch in ~150–300 ms), and elsewhere (an interactive agent's bound on a GPU).
CPU_SLO = "ttft_p95<=200ms,itl_p95<=100ms"
GPU_SLO = "ttft_p95<=2s,itl_p95<=60ms"

#: Every value vLLM's ``--kv-cache-dtype`` accepts (vLLM 0.32's ``CacheDType``), in one place.
KV_CACHE_DTYPES: tuple[str, ...] = (
    "auto",
    "float16",
    "bfloat16",
    "fp8",
    "fp8_e4m3",
    "fp8_e5m2",
    "fp8_inc",
    "fp8_ds_mla",
    "nvfp4_ds_mla",
    "turboquant_k8v4",
    "turboquant_4bit_nc",
    "turboquant_k3v4_nc",
    "turboquant_3bit_nc",
    "ultraquant_4bit",
    "int4_per_token_head",
    "int8_per_token_head",
    "fp8_per_token_head",
    "nvfp4",
    "nvfp4_4over6",
)

#: What vLLM's CPU attention backend serves: the only dtypes the embedded CPU default allows
#: (fp8 ones need AVX-512 or AMX: ``hostcpu.py``; float16 was seen to serve the bf16 tiny model).
CPU_KV_CACHE_DTYPES: frozenset[str] = frozenset({"auto", "bfloat16", "float16", "fp8", "fp8_e4m3", "fp8_e5m2"})

#: KV dtypes vLLM 0.32's CPU build serves wrongly on float32 weights (garbage text; bf16 weights are fine):
#: a run with such an arm serves the embedded trained model in bfloat16 (``Settings.embedded_dtype``).
HALF_KV_ON_FLOAT32: frozenset[str] = frozenset({"float16", "bfloat16"})

#: Short names users type. ``fp8`` resolves explicitly to e4m3, as the seed's engine resolved it.
ALIASES: Mapping[str, str] = {
    "fp8": "fp8_e4m3",
    "e4m3": "fp8_e4m3",
    "e5m2": "fp8_e5m2",
    "int8": "int8_per_token_head",
    "int8-pth": "int8_per_token_head",
    "bf16": "auto",
}

LauncherKind = Literal["process", "docker", "external"]
Sampling = Literal["greedy", "sampled"]
AgenticMode = Literal["replay", "live"]
Order = Literal["sequential", "abba", "random"]
SelfCheck = Literal["quick", "full", "off"]
Progress = Literal["auto", "lines", "off"]
HostCpuAction = Literal["flag", "exclude", "off"]

#: The seed's depth probes (GPU): fresh prefill at 10K and 90K tokens, 2 agentic sessions of all 15 turns.
SEED_DEPTHS = (10_000, 90_000)
#: The fidelity probe's depths (GPU). An embedded model's CPU sizes, depths included, are its own
#: (``config/embedded.py``).
FIDELITY_DEPTHS = (1_000, 8_000, 32_000)
FIDELITY_TEXTS = ("prose", "code")
#: The capacity probe's defaults (docs/probes/capacity.md): depths, mean think time, measured window per
#: trial, tokens per turn, most sessions tried — on a GPU, and on the embedded CPU default (2 cores).
CAPACITY_DEPTHS = (16_000, 32_000)
CPU_CAPACITY_DEPTHS = (2_000, 4_000)
CAPACITY_THINK_S, CPU_CAPACITY_THINK_S = 2.0, 1.0
CAPACITY_WINDOW_S, CPU_CAPACITY_WINDOW_S = 30.0, 5.0
CAPACITY_MAX_TOKENS, CPU_CAPACITY_MAX_TOKENS = 64, 16
CAPACITY_MAX_SESSIONS, CPU_CAPACITY_MAX_SESSIONS = 256, 32

ARM_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_\-]*$")


class ClientLimits(TypedDict):
    """The measuring client's limits, as ``Client`` takes them."""

    request_timeout_s: float
    stall_timeout_s: float
    first_token_floor_s: float | None
    min_prefill_tps: float


class SettingsError(ValueError):
    """A bad option value or arm: the plugin turns it into a usage error (exit 4)."""


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


@dataclass(frozen=True)
class Boot:
    """One boot of one arm. ``boot_id`` names it in test ids and folders: the arm's name with one boot
    per arm (``fp8``), ``fp8.r1``, ``fp8.r2`` … with replicates. ``index`` is its position in the run's
    boot order; ``extra`` marks an adaptive round, booted only while ``--kv-target-ci`` is not reached."""

    arm: Arm
    index: int
    replicate: int = 1
    replicates: int = 1
    extra: bool = False
    #: The lane it runs on under pytest-xdist (worker, its GPU group and host); 0 in a single-process run.
    lane: int = 0

    @property
    def boot_id(self) -> str:
        return self.arm.name if self.replicates == 1 else f"{self.arm.name}.r{self.replicate}"

    @property
    def block(self) -> int:
        """The block (one boot of every arm, run back to back on one lane) this boot belongs to."""
        return self.replicate


def boot_order(
    arms: Sequence[Arm], rounds: int, order: Order, seed: int = 0, planned: int | None = None
) -> tuple[Boot, ...]:
    """The run's boots: ``rounds`` rounds of every arm, each round ordered by ``order``.

    ``sequential``: every round in the declared order (A B A B); ``abba``: the declared order, then
    reversed, alternately (A B B A A B …), so drift over time and "the second boot is faster" cancel;
    ``random``: each round shuffled by a generator seeded with ``seed``. ``planned`` (≤ ``rounds``) is the
    number of rounds that always run; later rounds are adaptive extras.
    """
    rng = random.Random(seed)
    boots: list[Boot] = []
    for r in range(1, rounds + 1):
        round_arms = list(arms)
        if order == "abba" and r % 2 == 0:
            round_arms.reverse()
        elif order == "random":
            rng.shuffle(round_arms)
        for arm in round_arms:
            extra = planned is not None and r > planned
            boots.append(Boot(arm=arm, index=len(boots), replicate=r, replicates=rounds, extra=extra))
    return tuple(boots)


def lane_order(
    arms: Sequence[Arm], rounds: int, lanes: int, order: Order, seed: int = 0, planned: int | None = None
) -> tuple[Boot, ...]:
    """The run's boots placed on ``lanes`` parallel lanes (pytest-xdist workers, each with its GPU group).

    A block is one boot of every arm, run back to back on one lane; block ``r`` runs on lane
    ``(r - 1) % lanes`` as that lane's ``(r - 1) // lanes``-th block. The arms of a block are the declared
    order rotated by ``lane + position`` (``abba``, the default: with two arms every lane runs A B B A …, and
    lanes start on different arms), by ``lane`` alone (``sequential``) or shuffled (``random``). The result
    is a Latin square over time: at every slot the lanes run as many different arms as there are, so what
    the lanes share (host CPU, PCIe, memory bandwidth, power) loads every arm alike. ``index`` is the boot's
    position in time (slot, then lane).
    """
    if lanes <= 1:
        return boot_order(arms, rounds, order, seed, planned)
    rng = random.Random(seed)
    k = len(arms)
    placed: list[tuple[int, int, int, Arm, int]] = []  # (slot, lane, block, arm, ...)
    for r in range(1, rounds + 1):
        lane, position = (r - 1) % lanes, (r - 1) // lanes
        shift = (lane + position if order == "abba" else lane if order == "sequential" else 0) % k
        block_arms = [*arms[shift:], *arms[:shift]]
        if order == "random":
            rng.shuffle(block_arms)
        for i, arm in enumerate(block_arms):
            placed.append((position * k + i, lane, r, arm, i))
    placed.sort(key=lambda p: (p[0], p[1]))
    return tuple(
        Boot(
            arm=arm,
            index=index,
            replicate=r,
            replicates=rounds,
            extra=planned is not None and r > planned,
            lane=lane,
        )
        for index, (_, lane, r, arm, _) in enumerate(placed)
    )


#: With gates, the boots per arm a run may grow to by default while a gate is undecided (``--kv-max-replicates``).
GATE_BOOT_BUDGET = 3


def boot_budget(
    given: int | None, replicates: int, *, gates: bool, target_ci: float | None, launcher: str
) -> int | None:
    """``--kv-max-replicates``, resolved: the most boots per arm a run grows to, one counterbalanced round of
    every arm at a time, while something is undecided — a gate (``--kv-fail``), or with ``--kv-target-ci`` and
    2+ replicates a CI wider than the target. None: no adaptive rounds (the run boots what it was asked).

    Default: with gates, :data:`GATE_BOOT_BUDGET` (never fewer than ``--kv-replicates``); with
    ``--kv-target-ci`` and 2+ replicates, 2 × replicates; the larger when both apply. ``1`` (or the number of
    replicates) turns it off. Against external endpoints nothing is booted, so no rounds are added by default.
    """
    adaptive = gates or (target_ci is not None and replicates >= 2)
    if given is not None:
        if not gates and target_ci is None:
            raise SettingsError(
                "--kv-max-replicates adds boots only to decide a gate (--kv-fail) or to reach --kv-target-ci"
            )
        if given < replicates:
            raise SettingsError(f"--kv-max-replicates ({given}) must be at least --kv-replicates ({replicates})")
        return given if adaptive and given > replicates else None
    budget = 0
    if gates and launcher != "external":
        budget = max(budget, GATE_BOOT_BUDGET)
    if target_ci is not None and replicates >= 2:
        budget = max(budget, 2 * replicates)
    return budget if budget > replicates else None


def parse_gpu_groups(raw: str) -> tuple[str, ...]:
    """``0,1;2,3`` → ``("0,1", "2,3")``: one group of cards (indices or UUIDs) per lane; no card twice."""
    groups = tuple(g.strip().replace(" ", "") for g in str(raw).split(";") if g.strip())
    if not groups:
        raise SettingsError(f"expected GPU groups like 0,1;2,3 (one group per worker), got {raw!r}")
    seen: set[str] = set()
    for group in groups:
        if not re.fullmatch(r"[A-Za-z0-9\-]+(,[A-Za-z0-9\-]+)*", group):
            raise SettingsError(f"GPU group {group!r}: expected comma-separated GPU indices/UUIDs like 0,1")
        cards = group.split(",")
        twice = sorted({c for c in cards if c in seen or cards.count(c) > 1})
        if twice:
            raise SettingsError(f"GPU group {group!r}: card(s) {', '.join(twice)} in more than one group")
        seen.update(cards)
    return groups


@dataclass(frozen=True)
class Settings:
    arms: tuple[Arm, ...]
    launcher: LauncherKind = "process"
    #: which kind of server every arm is (``--kv-engine``): request fields, token counting, evidence
    engine: EngineKind = "vllm"
    model: str | None = None  # None: an embedded model (``embedded_model``)
    #: which embedded model serves when ``model`` is None (``--kv-model=embedded:NAME``; config/embedded.py)
    embedded_model: str = embedded_models.DEFAULT
    #: a local tokenizer folder for servers without a tokenizer endpoint (None: the model's, or the embedded one)
    tokenizer: str | None = None
    engine_args: tuple[str, ...] = ()
    engine_cmd: tuple[str, ...] = ()
    endpoints: Mapping[str, str] = field(default_factory=dict)
    port: int | None = None
    startup_timeout_s: float = 600.0
    request_timeout_s: float = 600.0
    stall_timeout_s: float = 120.0
    warmups: int = 3
    runs: int = 5
    max_tokens: int | None = None
    sampling: Sampling = "greedy"
    report_dir: Path = Path(".kvcache/runs")
    suite: bool = True
    seed: int = 0
    depths: tuple[int, ...] = (10_000, 90_000)
    depth_warmups: int = 1
    depth_runs: int = 3
    sessions: int = 2
    turns: int | None = None
    agentic_mode: AgenticMode = "replay"
    agentic_max_tokens: int = 600
    gates: tuple[str, ...] = ()
    inconclusive: Literal["fail", "warn"] = "warn"
    save: str | None = None
    compare: str | None = None
    image: str | None = None
    hf_cache: Path | None = None
    compile_cache: str = "auto"
    gpus: str | None = None
    pull: bool = False
    shm_size: str | None = None
    gpu_power_limit: str | None = None
    gpu_require_idle: bool = False
    gpu_settle: tuple[float, float] | None = None
    gpu_hz: float = 4.0
    gpu_max_temp: float | None = None
    replicates: int = 1
    order: Order = "sequential"
    order_seed: int = 0
    target_ci_pct: float | None = None
    max_runs: int | None = None
    max_replicates: int | None = None
    noise: str | None = None
    #: The run store (``--kv-store``): a folder or a postgresql:// URL; None only for inactive settings.
    store: str | None = None
    #: Where its baselines are on this machine, and what resolving them did (an import of an old
    #: ``.kvcache/baselines/NAME``), said once at the start of the run.
    store_baselines: Path | None = None
    store_notes: tuple[str, ...] = ()
    allow_diff: tuple[str, ...] = ()
    agreement: bool = True
    allow_unproven_cold: bool = False
    self_check: SelfCheck = "quick"
    concurrency: tuple[int, ...] = (1, 4, 16)
    concurrency_max_tokens: int = 128
    #: worker processes of the many-stream client (`pytest_kvcache.fanout`); None: one per 64 streams
    client_procs: int | None = None
    #: a trial whose client process used more than this % of a core is saturated (None: not judged)
    client_max_cpu_pct: float | None = 85.0
    #: a trial whose client event loop lagged more than this (p99) is saturated (None: not judged)
    client_max_lag_ms: float | None = 5.0
    fidelity_depths: tuple[int, ...] = FIDELITY_DEPTHS
    fidelity_texts: tuple[str, ...] = FIDELITY_TEXTS
    fidelity_top_k: int = 5
    fidelity_window: int = 512
    #: every vLLM arm's KV budget in bytes (``--kv-cache-memory-bytes``); None: each engine sizes its own
    cache_bytes: int | None = None
    #: the capacity probe's SLO (``probes.capacity.parse_slo``'s text)
    slo: str = "ttft_p95<=2s,itl_p95<=60ms"
    capacity_depths: tuple[int, ...] = CAPACITY_DEPTHS
    capacity_think_s: float = CAPACITY_THINK_S
    capacity_window_s: float = CAPACITY_WINDOW_S
    capacity_max_tokens: int = CAPACITY_MAX_TOKENS
    capacity_max_sessions: int = CAPACITY_MAX_SESSIONS
    capacity_start: int = 1
    first_token_floor_s: float = 120.0
    min_prefill_tps: float = 500.0
    progress: Progress = "auto"
    host_cpu_max_pct: float | None = 50.0
    host_cpu_action: HostCpuAction = "flag"
    #: ``--kv-gpu-groups``: one group of cards per lane (pytest-xdist worker); empty: lanes share the cards.
    gpu_groups: tuple[str, ...] = ()
    #: Parallel lanes (pytest-xdist workers) the blocks of boots are placed on; 1 without pytest-xdist.
    lanes: int = 1
    #: ``--kv-agentic-depth``: fit (default), stock, a token count or a share of the context (``75%``)
    agentic_depth: str = "fit"
    #: The context (tokens one request may fill) known before any boot: the embedded model's, a model
    #: folder's config, ``--max-model-len``/``--ctx-size`` in the engine arguments; None: known at boot.
    context_tokens: int | None = None
    #: where ``context_tokens`` came from, in words
    context_source: str | None = None
    #: the options given explicitly (CLI, environment or ini), by name: an explicit depth that cannot fit
    #: is an error, a default one is left out and said so
    explicit: frozenset[str] = frozenset()
    #: default probe points left out before any boot because they cannot fit ``context_tokens``
    context_notes: tuple[str, ...] = ()

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
        return "bfloat16" if any(a.kv_cache_dtype in HALF_KV_ON_FLOAT32 for a in self.arms) else "float32"

    @property
    def rounds(self) -> int:
        """Boots per arm the plan holds: ``--kv-replicates``, and up to the boot budget ``--kv-max-replicates``
        when rounds may be added (an undecided gate, or a CI wider than ``--kv-target-ci``; see
        :func:`boot_budget`). Rounds past ``--kv-replicates`` are adaptive: booted only while needed."""
        return max(self.replicates, self.max_replicates or 0)

    def boots(self) -> tuple[Boot, ...]:
        return lane_order(self.arms, self.rounds, self.lanes, self.order, self.order_seed, planned=self.replicates)

    def lane_cards(self, lane: int) -> str | None:
        """The cards lane ``lane``'s engines see (its ``--kv-gpu-groups`` group), or None: not pinned."""
        return self.gpu_groups[lane] if self.gpu_groups and lane < len(self.gpu_groups) else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "arms": [a.to_dict() for a in self.arms],
            "launcher": self.launcher,
            "engine": self.engine,
            "model": self.model,
            "tokenizer": self.tokenizer,
            "embedded_model": self.embedded,
            "embedded_name": self.embedded_model if self.embedded else None,
            "engine_args": list(self.engine_args),
            "engine_cmd": list(self.engine_cmd),
            "endpoints": dict(self.endpoints),
            "port": self.port,
            "startup_timeout_s": self.startup_timeout_s,
            "request_timeout_s": self.request_timeout_s,
            "stall_timeout_s": self.stall_timeout_s,
            "warmups": self.warmups,
            "runs": self.runs,
            "max_tokens": self.max_tokens,
            "sampling": self.sampling,
            "report_dir": str(self.report_dir),
            "suite": self.suite,
            "seed": self.seed,
            "depths": list(self.depths),
            "depth_warmups": self.depth_warmups,
            "depth_runs": self.depth_runs,
            "sessions": self.sessions,
            "turns": self.turns,
            "agentic_mode": self.agentic_mode,
            "agentic_max_tokens": self.agentic_max_tokens,
            "gates": list(self.gates),
            "inconclusive": self.inconclusive,
            "save": self.save,
            "compare": self.compare,
            "image": self.image,
            "hf_cache": str(self.hf_cache) if self.hf_cache else None,
            "compile_cache": self.compile_cache,
            "gpus": self.gpus,
            "pull": self.pull,
            "shm_size": self.shm_size,
            "gpu_power_limit": self.gpu_power_limit,
            "gpu_require_idle": self.gpu_require_idle,
            "gpu_settle": list(self.gpu_settle) if self.gpu_settle else None,
            "gpu_hz": self.gpu_hz,
            "gpu_max_temp": self.gpu_max_temp,
            "replicates": self.replicates,
            "order": self.order,
            "order_seed": self.order_seed,
            "target_ci_pct": self.target_ci_pct,
            "max_runs": self.max_runs,
            "max_replicates": self.max_replicates,
            "noise": self.noise,
            "store": self.store,
            "allow_diff": list(self.allow_diff),
            "agreement": self.agreement,
            "allow_unproven_cold": self.allow_unproven_cold,
            "self_check": self.self_check,
            "concurrency": list(self.concurrency),
            "concurrency_max_tokens": self.concurrency_max_tokens,
            "client_procs": self.client_procs,
            "client_max_cpu_pct": self.client_max_cpu_pct,
            "client_max_lag_ms": self.client_max_lag_ms,
            "fidelity_depths": list(self.fidelity_depths),
            "fidelity_texts": list(self.fidelity_texts),
            "fidelity_top_k": self.fidelity_top_k,
            "fidelity_window": self.fidelity_window,
            "cache_bytes": self.cache_bytes,
            "slo": self.slo,
            "capacity_depths": list(self.capacity_depths),
            "capacity_think_s": self.capacity_think_s,
            "capacity_window_s": self.capacity_window_s,
            "capacity_max_tokens": self.capacity_max_tokens,
            "capacity_max_sessions": self.capacity_max_sessions,
            "capacity_start": self.capacity_start,
            "first_token_floor_s": self.first_token_floor_s,
            "min_prefill_tps": self.min_prefill_tps,
            "progress": self.progress,
            "host_cpu_max_pct": self.host_cpu_max_pct,
            "host_cpu_action": self.host_cpu_action,
            "gpu_groups": list(self.gpu_groups),
            "lanes": self.lanes,
            "agentic_depth": self.agentic_depth,
            "context_tokens": self.context_tokens,
            "context_source": self.context_source,
            "context_notes": list(self.context_notes),
        }

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
        from pytest_kvcache.config.budget import arm_budget

        return arm_budget(self.engine_args, arm.args, self.cache_bytes)

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


# --------------------------------------------------------------------------------------------------
# Value parsers: each takes the raw string (CLI, env or ini) and raises SettingsError.


def _positive_float(raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise SettingsError(f"expected a number of seconds, got {raw!r}") from None
    if value <= 0:
        raise SettingsError(f"expected a positive number, got {raw!r}")
    return value


def _count(minimum: int) -> Callable[[str], int]:
    def parse(raw: str) -> int:
        try:
            value = int(raw)
        except ValueError:
            raise SettingsError(f"expected a whole number, got {raw!r}") from None
        if value < minimum:
            raise SettingsError(f"expected a whole number >= {minimum}, got {raw!r}")
        return value

    return parse


def _port(raw: str) -> int:
    value = _count(1)(raw)
    if value > 65535:
        raise SettingsError(f"expected a TCP port (1-65535), got {raw!r}")
    return value


def _tokenizer_dir(rootdir: Path) -> Callable[[Any], str]:
    def parse(raw: Any) -> str:
        path = Path(str(raw)).expanduser()
        path = path if path.is_absolute() else rootdir / path
        if not (path / "tokenizer.json").is_file() and not (path / "tokenizer_config.json").is_file():
            raise SettingsError(f"{raw!r} is not a tokenizer folder (no tokenizer.json or tokenizer_config.json)")
        return str(path.resolve())

    return parse


def _choice(*choices: str) -> Callable[[str], str]:
    def parse(raw: str) -> str:
        if raw not in choices:
            raise SettingsError(f"expected one of {', '.join(choices)}; got {raw!r}")
        return raw

    return parse


def _args(raw: str) -> tuple[str, ...]:
    try:
        return tuple(shlex.split(raw))
    except ValueError as exc:
        raise SettingsError(f"cannot split {raw!r} into arguments: {exc}") from None


def _names(raw: str) -> tuple[str, ...]:
    names = tuple(part.strip() for part in raw.split(","))
    if not raw.strip() or any(not n for n in names):
        raise SettingsError(f"expected a comma-separated list of arm names, got {raw!r}")
    return names


def _bool(raw: str) -> bool:
    lowered = raw.strip().lower()
    if lowered in {"1", "true", "yes", "on"}:
        return True
    if lowered in {"0", "false", "no", "off", ""}:
        return False
    raise SettingsError(f"expected true or false, got {raw!r}")


DEPTH = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kK]?)\s*$")


def parse_depths(raw: str) -> tuple[int, ...]:
    """``"10k,90k"`` → (10000, 90000). Raises ValueError naming the bad part."""
    depths = []
    for part in raw.split(","):
        m = DEPTH.match(part)
        if not m:
            raise ValueError(f"expected depths like 2k,8k,90k or 12000; bad part {part.strip()!r}")
        value = float(m.group(1)) * (1000 if m.group(2) else 1)
        if value < 64 or value != int(value):
            raise ValueError(f"a depth must be a whole number of tokens >= 64; got {part.strip()!r}")
        depths.append(int(value))
    if len(set(depths)) != len(depths):
        raise ValueError(f"depths must be distinct; got {raw!r}")
    return tuple(depths)


#: The fewest positions a fidelity window may hold (one block of the probe's CIs).
BLOCK_MIN = 32


def _texts(raw: Any) -> tuple[str, ...]:
    names = [p.strip() for p in (raw if isinstance(raw, list | tuple) else str(raw).split(",")) if p.strip()]
    unknown = [n for n in names if n not in FIDELITY_TEXTS]
    if not names or unknown:
        raise SettingsError(f"expected fidelity texts from {', '.join(FIDELITY_TEXTS)}; got {raw!r}")
    if len(set(names)) != len(names):
        raise SettingsError(f"fidelity texts must be distinct; got {raw!r}")
    return tuple(names)


def _agentic_depth(raw: Any) -> str:
    """``fit``, ``stock``, a token count (``6k``, ``6000``) or a share of the context (``75%``)."""
    text = str(raw).strip().lower()
    if text in ("fit", "stock"):
        return text
    if text.endswith("%"):
        try:
            share = float(text[:-1])
        except ValueError:
            share = -1.0
        if not 0 < share <= 100:
            raise SettingsError(f"expected fit, stock, a token count like 6k or a share like 75%; got {raw!r}")
        return f"{share:g}%"
    try:
        (tokens,) = parse_depths(text)
    except ValueError:
        raise SettingsError(f"expected fit, stock, a token count like 6k or a share like 75%; got {raw!r}") from None
    return str(tokens)


def _depths(raw: Any) -> tuple[int, ...]:
    try:
        return parse_depths(",".join(raw) if isinstance(raw, list | tuple) else str(raw))
    except ValueError as exc:
        raise SettingsError(str(exc)) from None


def _gates(raw: Any, arms: list[str] | None) -> tuple[str, ...]:
    from pytest_kvcache.report.gates import GateError, parse

    texts = [raw] if isinstance(raw, str) else list(raw)
    for text in texts:
        try:
            parse(text, arms=arms)
        except GateError as exc:
            raise SettingsError(str(exc)) from None
    return tuple(texts)


def _power_limit(raw: Any) -> str:
    from pytest_kvcache.gpu.power import parse_power_limit

    try:
        parse_power_limit(str(raw))
    except ValueError as exc:
        raise SettingsError(str(exc)) from None
    return str(raw)


def _compile_cache(raw: Any) -> str:
    text = str(raw).strip()
    if not text:
        raise SettingsError("expected auto, off or a directory")
    if text in ("auto", "off"):
        return text
    return str(Path(text).expanduser().resolve())


def _gpus(raw: Any) -> str:
    value = str(raw).strip()
    if value != "all" and not re.fullmatch(r"[A-Za-z0-9\-]+(,[A-Za-z0-9\-]+)*", value):
        raise SettingsError(f"expected all or comma-separated GPU indices/UUIDs, got {raw!r}")
    return value


def _settle(raw: Any) -> tuple[float, float]:
    temp, sep, power = str(raw).partition(":")
    if not sep:
        raise SettingsError(f"expected TEMP_C:POWER_W like 45:150, got {raw!r}")
    return _positive_float(temp), _positive_float(power)


def _baseline_name(raw: Any) -> str:
    name = str(raw).strip()
    if not ARM_NAME.match(name):
        raise SettingsError(f"a baseline name must be letters, digits, '-' or '_'; got {name!r}")
    return name


def _order(raw: Any) -> tuple[Order, int | None]:
    """``sequential``, ``abba``, ``random`` or ``random:SEED``."""
    text = str(raw).strip()
    name, sep, seed = text.partition(":")
    if name not in ("sequential", "abba", "random") or (sep and name != "random"):
        raise SettingsError(f"expected sequential, abba, random or random:SEED; got {text!r}")
    if not sep:
        return name, None  # type: ignore[return-value]
    return "random", _count(0)(seed)


def _pct(raw: Any) -> float:
    text = str(raw).strip().removesuffix("%")
    try:
        value = float(text)
    except ValueError:
        raise SettingsError(f"expected a percentage like 2 or 2.5%, got {raw!r}") from None
    if not 0 < value < 100:
        raise SettingsError(f"expected a percentage between 0 and 100, got {raw!r}")
    return value


def _procs(raw: Any) -> int | None:
    text = str(raw).strip().lower()
    if text == "auto":
        return None
    try:
        value = int(text)
    except ValueError:
        raise SettingsError(f"expected a number of processes or 'auto', got {raw!r}") from None
    if not 1 <= value <= 256:
        raise SettingsError(f"expected 1 to 256 client processes, got {raw!r}")
    return value


def _positive_or_off(raw: Any) -> float | None:
    text = str(raw).strip().lower()
    return None if text == "off" else _positive_float(text)


def _pct_or_off(raw: Any) -> float | None:
    text = str(raw).strip().rstrip("%")
    if text.lower() == "off":
        return None
    try:
        value = float(text)
    except ValueError:
        raise SettingsError(f"expected a percentage (0-100) or 'off', got {raw!r}") from None
    if not 0 < value <= 100:
        raise SettingsError(f"expected a percentage between 0 and 100, got {raw!r}")
    return value


def _levels(raw: Any) -> tuple[int, ...]:
    text = ",".join(raw) if isinstance(raw, list | tuple) else str(raw)
    levels = []
    for part in text.split(","):
        try:
            value = int(part.strip())
        except ValueError:
            raise SettingsError(f"expected stream counts like 1,4,16; bad part {part.strip()!r}") from None
        if not 1 <= value <= 1024:
            raise SettingsError(f"a stream count must be between 1 and 1024; got {value}")
        levels.append(value)
    if len(set(levels)) != len(levels):
        raise SettingsError(f"stream counts must be distinct; got {text!r}")
    return tuple(levels)


def _size(raw: Any) -> int:
    from pytest_kvcache.config.budget import parse_bytes

    try:
        return parse_bytes(str(raw))
    except ValueError as exc:
        raise SettingsError(str(exc)) from None


def _slo(raw: Any) -> str:
    from pytest_kvcache.probes.capacity import parse_slo

    try:
        return parse_slo(str(raw)).text()
    except ValueError as exc:
        raise SettingsError(str(exc)) from None


def check_budgets(settings: Settings) -> None:
    """Every arm's KV budget holds one request of its ``max_model_len`` at its bytes per token (computed from the
    model's config.json and the arm's KV dtype); a budget only where the plugin can apply one (vLLM it boots)."""
    from pytest_kvcache.config.budget import embedded_model, need, refusal

    budgets = {a.name: settings.kv_budget(a) for a in settings.arms}
    if settings.cache_bytes is not None and settings.engine != "vllm":
        raise SettingsError(
            f"--kv-cache-bytes sets vLLM's --kv-cache-memory-bytes; a {settings.engine} server sizes its KV cache "
            "itself (llama.cpp: --ctx-size tokens, in each arm's args)"
        )
    if settings.cache_bytes is not None and settings.launcher == "external":
        raise SettingsError("--kv-cache-bytes cannot size the KV cache of a server you started (external launcher)")
    folder = Path(settings.model) if settings.model is not None else embedded_model()
    for arm in settings.arms:
        budget = budgets[arm.name]
        if budget is None or not folder.is_dir():
            continue
        found = need(folder, arm.kv_cache_dtype, settings.engine_args, arm.args)
        if found is not None and (why := refusal(arm.name, budget, found, arm.kv_cache_dtype)):
            raise SettingsError(why)


DOTTED = re.compile(r"^[A-Za-z0-9_\-]+(\.[A-Za-z0-9_\-]+)*$")


def _dotted(raw: Any) -> tuple[str, ...]:
    texts = [raw] if isinstance(raw, str) else list(raw)
    keys = []
    for text in texts:
        for key in (k.strip() for k in str(text).split(",")):
            if not DOTTED.match(key):
                raise SettingsError(f"expected a dotted evidence path like cache_config.block_size, got {key!r}")
            keys.append(key)
    return tuple(keys)


@dataclass(frozen=True)
class _StoreRef:
    """The run store a name resolves in, and the old per-workspace baselines folder imported from."""

    location: str
    baselines: Path
    legacy: Path
    notes: list[str] = field(default_factory=list)


def store_of(cli: Mapping[str, Any], env: Mapping[str, str], ini: Mapping[str, Any], rootdir: Path) -> str:
    """``--kv-store`` (a folder, relative to the rootdir, or a postgresql:// URL, connected to now);
    default ``$XDG_DATA_HOME/pytest-kvcache``."""
    from pytest_kvcache import store

    raw, origin = _pick("store", cli, env, ini)
    location = store.normalise(str(raw), rootdir) if raw is not None else store.default_location(env)
    try:
        store.check(location)
        if store.is_url(location):  # a remote store is reached now, before anything boots
            store.open_store(location).close()
    except store.StoreError as exc:
        raise SettingsError(f"{origin if raw is not None else '--kv-store'}: {exc}") from None
    return location


def _from_store(option: str, name: str, ref: _StoreRef) -> Path | None:
    """Baseline ``name`` in the store; an old ``<report_dir>/../baselines/NAME`` the store lacks is
    validated and imported (said once); None when neither has it."""
    from pytest_kvcache import store
    from pytest_kvcache.report.load import RunFolderError, load

    where = store.redact(ref.location)
    try:
        with store.open_store(ref.location) as opened:
            found = opened.baseline(name)
            legacy = ref.legacy / name
            if found is not None or not legacy.exists():
                return found
            try:
                load(legacy, f"stored run ({option})")
            except RunFolderError as exc:
                raise SettingsError(f"{option}: {exc}") from None
            try:
                imported = opened.save_baseline(name, legacy)
            except (OSError, store.StoreError) as exc:
                ref.notes.append(f"could not import baseline {name!r} into the store {where} ({exc}); using {legacy}")
                return legacy
    except store.StoreError as exc:
        raise SettingsError(f"{option}: the run store: {exc}") from None
    ref.notes.append(f"imported baseline {name!r} from {legacy} into the store {where}")
    return imported


def _stored_run(
    option: str, name: str, baselines: Path, hint: str, noun: str = "stored run", ref: _StoreRef | None = None
) -> Path:
    """A stored run folder named by ``--kv-compare``/``--kv-noise``, checked now, before anything boots."""
    from pytest_kvcache.report.load import RunFolderError, load

    path = baselines / name
    if ref is not None:
        path = _from_store(option, name, ref) or path
    if not path.exists():
        also = f" or {ref.legacy}" if ref is not None and ref.legacy != baselines else ""
        raise SettingsError(f"{option}: no {noun} {name!r} in {baselines}{also} ({hint})")
    try:
        load(path, f"stored run ({option})")  # every file it holds, read and validated now
    except RunFolderError as exc:
        raise SettingsError(f"{option}: {exc}") from None
    return path


def _noise_run(name: str, baselines: Path, ref: _StoreRef | None = None) -> Path:
    """A stored A/A run: its arms are one arm typed twice or more (``fp8,fp8``)."""
    from pytest_kvcache.jsonio import read_json

    hint = f"store an A/A run with --kv-arms=X,X --kv-save={name}"
    path = _stored_run("--kv-noise", name, baselines, hint, ref=ref)
    arms = (read_json(path / "run.json").get("settings") or {}).get("arms") or []
    typed = {a.get("typed_as") or a.get("name") for a in arms}
    if len(arms) < 2 or len(typed) != 1:
        names = ", ".join(str(a.get("name")) for a in arms)
        raise SettingsError(
            f"--kv-noise: stored run {name!r} is not an A/A run (its arms: {names}); save one made with --kv-arms=X,X"
        )
    return path


def _store_baselines(location: str, env: Mapping[str, str]) -> Path:
    from pytest_kvcache.store import baselines_dir_of

    return baselines_dir_of(location, env)


def _endpoints(values: Sequence[str]) -> dict[str, str]:
    """``ARM=URL`` pairs, one URL per arm. A URL ending in ``/v1`` (the OpenAI SDK's base URL) is taken
    as the server's root: the plugin asks ``/v1/models``, ``/metrics``, ``/tokenize`` … below it."""
    endpoints: dict[str, str] = {}
    for value in values:
        for item in (part.strip() for part in value.split(",")):
            name, sep, url = item.partition("=")
            name = name.strip()
            if not sep or not name or not url.strip():
                raise SettingsError(f"expected ARM=URL, got {item!r}")
            url = url.strip().rstrip("/")
            if not re.match(r"^https?://[^/\s]+", url):
                raise SettingsError(f"expected an http(s) URL for arm {name!r}, got {url!r}")
            if url.endswith("/v1"):
                url = url[: -len("/v1")]
            if name in endpoints and endpoints[name] != url:
                raise SettingsError(
                    f"arm {name!r} is given two endpoints ({endpoints[name]} and {url}); give one URL per arm"
                )
            endpoints[name] = url
    return endpoints


# --------------------------------------------------------------------------------------------------
# The option table: one entry drives the CLI flag, the ini key, the environment variable and the help.


@dataclass(frozen=True)
class OptionSpec:
    name: str
    help: str
    metavar: str | None = None
    flag: bool = False  # a CLI switch (store_true)
    repeatable: bool = False  # CLI action="append"; ini linelist

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


OPTIONS: tuple[OptionSpec, ...] = (
    OptionSpec(
        "arms",
        "comma-separated arms; the first is the baseline. An arm is a named arm from "
        "[tool.pytest_kvcache.arms.NAME], an alias (fp8, e5m2, int8, bf16) or a vLLM --kv-cache-dtype "
        "value. Without arms the plugin does nothing.",
        "A,B[,C...]",
    ),
    OptionSpec("launcher", "how each arm's engine is started: process (default), docker or external.", "KIND"),
    OptionSpec(
        "engine",
        "which server every arm is: vllm (default), llamacpp (llama-server; arms are its cache types f16, "
        "q8_0, q4_0 …) or openai (any other OpenAI-compatible server: no vLLM-only request field is sent).",
        "KIND",
    ),
    OptionSpec(
        "tokenizer",
        "local tokenizer folder (tokenizer.json + chat template) that counts prompt tokens for a server "
        "without a tokenizer endpoint (--kv-engine=openai; default: --kv-model's folder, else the embedded model's).",
        "DIR",
    ),
    OptionSpec(
        "model",
        "model path or id served by every arm, or an embedded model: embedded:smollm2-135m (the default: "
        "SmolLM2-135M-Instruct, trained weights, 8K context) or embedded:tiny-qwen3 (random weights).",
        "MODEL",
    ),
    OptionSpec("engine_args", "extra engine arguments appended for every arm (one shell-quoted string).", "ARGS"),
    OptionSpec(
        "engine_cmd",
        "command that starts the engine for the process launcher "
        "(default: '<this python> -m vllm.entrypoints.openai.api_server'; for llamacpp: llama-server on PATH, "
        "else one built once from the llama-cpp-python sdist's llama.cpp and cached).",
        "CMD",
    ),
    OptionSpec(
        "endpoint",
        "ARM=URL of an already running server (repeatable; requires --kv-launcher=external and one per arm).",
        "ARM=URL",
        repeatable=True,
    ),
    OptionSpec("port", "fixed port for the process launcher (default: a free port per boot).", "PORT"),
    OptionSpec("startup_timeout", "seconds an engine may take to answer /v1/models (default 600).", "S"),
    OptionSpec("request_timeout", "seconds one request may take end to end (default 600).", "S"),
    OptionSpec("stall_timeout", "seconds without a streamed chunk before a request fails (default 120).", "S"),
    OptionSpec(
        "first_token_floor",
        "before the first byte a request may wait this floor plus prompt tokens / --kv-min-prefill-tps "
        "(default 120 s): vLLM sends nothing until prefill ends, and a deep prefill takes minutes.",
        "S",
    ),
    OptionSpec(
        "min_prefill_tps",
        "the slowest prefill rate (tokens/s) the first-token limit allows for (default 500: a 90K prompt may "
        "take 120 + 180 s before its first token).",
        "TPS",
    ),
    OptionSpec(
        "progress",
        "progress lines during the run: auto (a live line on a terminal, plain lines otherwise; default), "
        "lines (always plain lines) or off.",
        "MODE",
    ),
    OptionSpec(
        "host_cpu_max",
        "a sample whose window saw more than this share (%) of the host's CPU busy outside the engine and "
        "the client is disturbed (default 50; off: no sampling; see docs/host-cpu.md).",
        "PCT",
    ),
    OptionSpec(
        "host_cpu",
        "what a disturbed sample gets: flag (default: counted in the report) or exclude (left out of the statistics).",
        "ACTION",
    ),
    OptionSpec("warmups", "unmeasured warmup requests per probe shape (default 3).", "N"),
    OptionSpec("runs", "measured requests per probe shape (default 5).", "N"),
    OptionSpec("max_tokens", "override every short probe's max_tokens.", "N"),
    OptionSpec(
        "sampling",
        "greedy (default: temperature 0, ignore_eos, identical tokens across arms) or sampled "
        "(the seed's temperature 0.6, top_p 0.95, top_k 20).",
        "MODE",
    ),
    OptionSpec("report_dir", "folder that holds run folders (default .kvcache/runs).", "DIR"),
    OptionSpec("no_suite", "do not collect the stock probe tests; run only your own.", flag=True),
    OptionSpec("seed", "run seed: salts and ordering derive from it (default 0).", "N"),
    OptionSpec("depths", "prefill depths in prompt tokens, 'k' = 1000 (default 10k,90k).", "D1,D2"),
    OptionSpec("depth_warmups", "unmeasured prefill requests per depth (default 1).", "N"),
    OptionSpec("depth_runs", "measured prefill requests per depth (default 3).", "N"),
    OptionSpec("sessions", "independent agentic sessions per arm (default 2).", "N"),
    OptionSpec("turns", "run only the first N turns of the agentic fixture (default: all).", "N"),
    OptionSpec(
        "agentic_mode",
        "replay (default: prompts from the fixture alone, identical in every arm, greedy) or live "
        "(the model's own replies and tool calls are appended, as the seed did).",
        "MODE",
    ),
    OptionSpec(
        "agentic_max_tokens", "max_tokens per agentic turn (default 600; 64 on the embedded trained model).", "N"
    ),
    OptionSpec(
        "agentic_depth",
        "how deep the agentic session's last turn goes: fit (default: the stock fixture, its tool results scaled "
        "down when its last turn cannot fit the context), stock (as it is: turns that cannot fit are left out), "
        "a token count like 6k, or a share of the context like 75%. Scaling keeps the turns and their growth.",
        "fit|stock|N|PCT",
    ),
    OptionSpec(
        "fail",
        "a regression gate 'METRIC[PROBE[@POINT]]: CONDITION' (repeatable), e.g. "
        "'decode_tps[short]: int8 >= fp8 * 1.20', 'ttft_s[prefill]: <= +10%', 'decode_tps[agentic@turn15]: >= 30', "
        "'ttft_s[prefill]: <= saved +5%'. Failed gates exit 1.",
        "EXPR",
        repeatable=True,
    ),
    OptionSpec("inconclusive", "what an inconclusive gate does: warn (default) or fail.", "MODE"),
    OptionSpec("save", "store this run as the baseline NAME in the run store (--kv-store).", "NAME"),
    OptionSpec("compare", "compare this run with the stored baseline NAME (and enable 'saved' gates).", "NAME"),
    OptionSpec(
        "store",
        "the run store: named baselines and the history of every run, outside the workspace (a folder; default "
        "$XDG_DATA_HOME/pytest-kvcache, else ~/.local/share/pytest-kvcache), or a postgresql:// URL.",
        "PATH|URL",
    ),
    OptionSpec("rerender", "rebuild the report (and gates) of a stored run folder; boots nothing.", "RUN_DIR"),
    OptionSpec(
        "image", "the docker launcher's image (e.g. vllm/vllm-openai:v0.25.1); a named arm may set its own.", "IMAGE"
    ),
    OptionSpec("hf_cache", "host HF cache mounted at /root/.cache/huggingface (default ~/.cache/huggingface).", "DIR"),
    OptionSpec(
        "compile_cache",
        "vLLM's torch.compile cache shared by every boot: auto (default: the engine's own, ~/.cache/vllm, "
        "mounted into containers), a DIR (VLLM_CACHE_ROOT), or off (each boot compiles).",
        "auto|DIR|off",
    ),
    OptionSpec("gpus", "GPUs for containers: all, or indices/UUIDs like 0,1,2,3 (default: none).", "GPUS"),
    OptionSpec(
        "gpu_groups",
        "with pytest-xdist (-n N or --tx): one group of cards per worker, ';'-separated, like 0,1;2,3;4,5;6,7. "
        "Each worker's engines see only its group (CUDA_VISIBLE_DEVICES, or the container's device ids) and "
        "its GPU state covers only those cards; over ssh gateways, each host's own cards.",
        "G1;G2",
    ),
    OptionSpec(
        "pull", "let the docker launcher pull a missing image (default: a missing image is an error).", flag=True
    ),
    OptionSpec("shm_size", "container shared memory (e.g. 16g) instead of --ipc=host.", "SIZE"),
    OptionSpec(
        "gpu_power_limit",
        "pin GPU power caps before the first arm, verify them around every arm, restore them at the end: "
        "'300' (all cards, W), '0:300,1:250' (by index), 'GPU-ab12:300' (by UUID prefix); 'verify:300' only "
        "checks. Setting needs root.",
        "SPEC",
    ),
    OptionSpec(
        "gpu_require_idle", "refuse to boot an arm while a foreign process holds a GPU or it is busy.", flag=True
    ),
    OptionSpec("gpu_settle", "between arms, wait until every GPU is at or below TEMP_C:POWER_W (e.g. 45:150).", "T:W"),
    OptionSpec("gpu_hz", "GPU sampling rate during the run (default 4 Hz).", "HZ"),
    OptionSpec("gpu_max_temp", "exclude samples whose window saw a GPU above this temperature (°C).", "C"),
    OptionSpec(
        "replicates",
        "boots per arm (default 1). Each boot runs every selected probe; with 3 or more the report's CIs are "
        "computed over boots (boots, then samples within a boot).",
        "N",
    ),
    OptionSpec(
        "order",
        "the boot order: sequential (A B A B), abba (A B B A A B …; the default with 2+ replicates) or "
        "random[:SEED] (each round shuffled; default seed: --kv-seed).",
        "MODE",
    ),
    OptionSpec(
        "target_ci",
        "adaptive sampling: add measured requests within a boot until the probe's CI half-width is below PCT "
        "of its mean (up to --kv-max-runs); with 2+ replicates, also add rounds of boots until every delta's "
        "CI half-width is below PCT (up to --kv-max-replicates).",
        "PCT",
    ),
    OptionSpec("max_runs", "with --kv-target-ci: measured requests per probe shape at most (default 4 × runs).", "N"),
    OptionSpec(
        "max_replicates",
        "the boot budget: boots per arm a run may grow to, one counterbalanced round at a time, while a gate is "
        "undecided (default with --kv-fail: 3) or a CI is wider than --kv-target-ci (with 2+ replicates: "
        "2 × replicates); 1 turns it off.",
        "N",
    ),
    OptionSpec(
        "noise",
        "a stored A/A run (--kv-arms=X,X --kv-save=NAME) whose deltas are the noise band: verdicts and gates "
        "count a difference only beyond it.",
        "NAME",
    ),
    OptionSpec(
        "allow_diff",
        "an evidence path (e.g. cache_config.block_size, engine_version, argv.--max-num-seqs) allowed to differ "
        "between boots without marking the A/B CONFOUNDED (repeatable; a prefix allows everything below it).",
        "KEY",
        repeatable=True,
    ),
    OptionSpec("no_agreement", "skip the output-agreement requests (greedy token ids per short shape).", flag=True),
    OptionSpec(
        "allow_unproven_cold",
        "keep prefill samples nothing proves cold (no /metrics prefix-cache hits, no usage cached_tokens); "
        "default: excluded.",
        flag=True,
    ),
    OptionSpec(
        "self_check",
        "run the full measuring-client self-check against a calibrated stream at the start "
        "(default: a ~1 s quick one).",
        flag=True,
    ),
    OptionSpec("no_self_check", "skip the measuring-client self-check at the start of the run.", flag=True),
    OptionSpec("concurrency", "simultaneous streams per level of the concurrency probe (default 1,4,16).", "N1,N2"),
    OptionSpec("concurrency_max_tokens", "max_tokens of each concurrency-probe stream (default 128).", "N"),
    OptionSpec(
        "client_procs",
        "worker processes (one event loop each) that read the concurrency probe's streams (default auto: one per "
        "64 streams, at most half the cores).",
        "N|auto",
    ),
    OptionSpec(
        "client_max_cpu",
        "a concurrency trial whose client process used more than this share of a core is saturated: its figures "
        "are the client's, and are excluded (default 85%; 'off').",
        "PCT|off",
    ),
    OptionSpec(
        "client_max_lag_ms",
        "a concurrency trial whose client event loop lagged more than this (99th percentile) is saturated and "
        "excluded (default 5; 'off').",
        "MS|off",
    ),
    OptionSpec(
        "fidelity_depths",
        "depths at which the fidelity probe compares prompt logprobs with the baseline arm, 'k' = 1000 "
        "(default 1k,8k,32k; 1k,4k on the embedded CPU default).",
        "D1,D2",
    ),
    OptionSpec("fidelity_texts", "the fidelity probe's committed texts (default prose,code).", "T1,T2"),
    OptionSpec(
        "fidelity_topk", "top-k logprobs per position for the fidelity probe's KL estimate; 0: none (default 5).", "K"
    ),
    OptionSpec("fidelity_window", "positions scored before each fidelity depth (default 512).", "N"),
    OptionSpec(
        "cache_bytes",
        "the KV-cache budget of every vLLM arm (its --kv-cache-memory-bytes; VLLM_CPU_KVCACHE_SPACE is then left "
        "unset): 512MiB, 2GiB, 2G or bytes. It must hold one request of max_model_len at the arm's dtype (default: "
        "each engine sizes its own).",
        "SIZE",
    ),
    OptionSpec(
        "slo",
        "the capacity probe's latency SLO over a trial's measured turns, e.g. ttft_p95<=2s,itl_p95<=60ms "
        "(default that; ttft_p95<=200ms,itl_p95<=100ms on the embedded CPU default).",
        "TERMS",
    ),
    OptionSpec(
        "capacity_depths",
        "the capacity probe's session contexts in tokens, 'k' = 1000 (default 16k,32k; 2k,4k on the embedded CPU "
        "default).",
        "D1,D2",
    ),
    OptionSpec(
        "capacity_think",
        "mean think time between a session's turns, in seconds (each drawn uniform 0.5–1.5 × it; default 2, 1 on "
        "the embedded CPU default).",
        "S",
    ),
    OptionSpec(
        "capacity_window",
        "seconds each capacity trial is measured for, after its sessions are warm (default 30; 5 on the embedded "
        "CPU default).",
        "S",
    ),
    OptionSpec(
        "capacity_max_tokens", "tokens each capacity turn decodes (default 64; 16 on the embedded CPU default).", "N"
    ),
    OptionSpec(
        "capacity_max_sessions",
        "the most concurrent sessions the capacity search tries (default 256; 32 on the embedded CPU default).",
        "N",
    ),
    OptionSpec("capacity_start", "the capacity search's first number of sessions (default 1).", "N"),
)

OPTION_BY_NAME: Mapping[str, OptionSpec] = {spec.name: spec for spec in OPTIONS}


def _pick(name: str, cli: Mapping[str, Any], env: Mapping[str, str], ini: Mapping[str, Any]) -> tuple[Any, str]:
    """Return (raw value, where it came from) by precedence, or (None, "default")."""
    spec = OPTION_BY_NAME[name]
    value = cli.get(name)
    if value not in (None, [], False):
        return value, spec.cli
    if env.get(spec.env, "") != "":
        raw = env[spec.env]
        return ([raw] if spec.repeatable else raw), spec.env
    value = ini.get(name)
    if value not in (None, "", [], False):
        return value, spec.ini
    return None, "default"


def _parse(name: str, raw: Any, origin: str, parse: Callable[[Any], Any]) -> Any:
    try:
        return parse(raw)
    except SettingsError as exc:
        raise SettingsError(f"{origin}: {exc}") from None


# --------------------------------------------------------------------------------------------------
# Arms


def _named_arm(name: str, table: Mapping[str, Any]) -> Arm:
    known = {"kv_cache_dtype", "args", "env", "image", "knobs"}
    unknown = sorted(set(table) - known)
    where = f"[tool.pytest_kvcache.arms.{name}]"
    if unknown:
        raise SettingsError(f"{where}: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    dtype = table.get("kv_cache_dtype")
    if dtype is not None:
        if not isinstance(dtype, str):
            raise SettingsError(f"{where}: kv_cache_dtype must be a string")
        dtype = ALIASES.get(dtype, dtype)
        if dtype not in KV_CACHE_DTYPES:
            raise SettingsError(
                f"{where}: unknown kv_cache_dtype {table['kv_cache_dtype']!r}; valid: {', '.join(KV_CACHE_DTYPES)}"
            )
    args = table.get("args", [])
    if isinstance(args, str):
        try:
            args = _args(args)
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


def resolve_arm(name: str, named: Mapping[str, Mapping[str, Any]], engine: EngineKind = "vllm") -> Arm:
    """Resolve one typed arm name: named arm > alias > raw dtype (vLLM's, or llama.cpp's cache types)."""
    if engine == "llamacpp":
        return _llamacpp_arm(name, named)
    if name in named:
        return _named_arm(name, named[name])
    return _typed_arm(name, named, ALIASES, KV_CACHE_DTYPES, "arm")


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


def _llamacpp_arm(name: str, named: Mapping[str, Mapping[str, Any]]) -> Arm:
    """A llama.cpp arm: its ``kv_cache_dtype`` is a ``--cache-type-k/-v`` value (f16 when unset)."""
    if name in named:
        table = dict(named[name])
        raw = table.pop("kv_cache_dtype", None)
        arm = _named_arm(name, table)
        if raw is None:
            return replace(arm, kv_cache_dtype="f16")
        if not isinstance(raw, str) or LLAMACPP_ALIASES.get(raw, raw) not in LLAMACPP_CACHE_TYPES:
            raise SettingsError(
                f"[tool.pytest_kvcache.arms.{name}]: unknown llama.cpp kv_cache_dtype {raw!r}; "
                f"valid: {', '.join(LLAMACPP_CACHE_TYPES)}"
            )
        return replace(arm, kv_cache_dtype=LLAMACPP_ALIASES.get(raw, raw))
    return _typed_arm(name, named, LLAMACPP_ALIASES, LLAMACPP_CACHE_TYPES, "llama.cpp arm")


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


def looks_like_path(model: str) -> bool:
    """A model value that names a local folder (as opposed to a hub id like ``org/name``)."""
    return model.startswith(("/", "./", "../", "~")) or model in {".", ".."} or os.path.isdir(model)


# --------------------------------------------------------------------------------------------------


def report_dir_of(
    cli: Mapping[str, Any], env: Mapping[str, str], ini: Mapping[str, Any], rootdir: Path, *, writable: bool = False
) -> Path:
    """``--kv-report-dir`` as a path; with ``writable`` (a run: it writes there) one it cannot write is refused."""
    raw, origin = _pick("report_dir", cli, env, ini)
    path = Path(str(raw) if raw is not None else ".kvcache/runs").expanduser()
    path = path if path.is_absolute() else rootdir / path
    if path.exists() and not path.is_dir():
        raise SettingsError(f"{origin if raw is not None else '--kv-report-dir'}: {path} is a file, not a folder")
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise SettingsError(f"--kv-report-dir: {path} is under {parent}, which is a file")
            break
    problem = unwritable_folder(path) if writable else None
    if problem is not None:
        raise SettingsError(f"{origin if raw is not None else '--kv-report-dir'}: {problem}")
    return path


def unwritable_folder(path: Path) -> str | None:
    """Why ``path`` cannot be a folder to write in (``cannot create …`` / ``cannot write in …``), or None.

    Found by doing it, since ``os.access`` says yes to root however the folder is made (sysfs, a read-only
    mount): a file is made and removed in ``path``, or, where it does not exist yet, a uniquely named folder in
    its nearest existing parent (where creating it would begin). Nothing is left behind, and no name another
    process may be creating at the same time (pytest-xdist workers) is touched."""
    import tempfile

    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    try:
        if existing == path:
            with tempfile.TemporaryFile(dir=path):
                pass
        else:
            os.rmdir(tempfile.mkdtemp(prefix=".kvcache-check-", dir=existing))
    except OSError as exc:
        return f"cannot {'write in' if existing == path else 'create'} {path}: {exc.strerror or exc}"
    return None


def report_options(
    cli: Mapping[str, Any],
    env: Mapping[str, str],
    ini: Mapping[str, Any],
    rootdir: Path,
    *,
    arms: Sequence[str] | None = None,
    notes: list[str] | None = None,
    store_location: str | None = None,
) -> ReportOptions:
    """``--kv-fail``, ``--kv-inconclusive``, ``--kv-compare``, ``--kv-noise``, ``--kv-allow-diff`` and
    ``--kv-save`` by the same precedence as every option (CLI > env > ini); stored runs are checked now.
    ``arms`` (a run's, when known) are checked against the gates. Names resolve in the run store
    (``--kv-store``); what resolving did (an import) is appended to ``notes``."""

    def get(name: str, parse: Callable[[Any], Any], default: Any) -> Any:
        raw, origin = _pick(name, cli, env, ini)
        return default if raw is None else _parse(name, raw, origin, parse)

    from pytest_kvcache import store

    location = store_location if store_location is not None else store_of(cli, env, ini, rootdir)
    baselines = store.baselines_dir_of(location, env)
    legacy = report_dir_of(cli, env, ini, rootdir).parent / "baselines"
    ref = _StoreRef(location=location, baselines=baselines, legacy=legacy, notes=notes if notes is not None else [])
    compare = get("compare", _baseline_name, None)
    noise = get("noise", _baseline_name, None)
    save = get("save", _baseline_name, None)
    if save and not store.is_url(location):  # found now, not when the run is over (exit 3)
        problem = unwritable_folder(baselines)
        if problem is not None:
            raise SettingsError(f"--kv-save: the run store: {problem}")
    hint = "store one with --kv-save=NAME"
    return ReportOptions(
        gates=get("fail", lambda raw: _gates(raw, list(arms) if arms is not None else None), ()),
        inconclusive=get("inconclusive", _choice("fail", "warn"), "warn"),
        compare=_stored_run("--kv-compare", compare, baselines, hint, "stored baseline", ref) if compare else None,
        noise=_noise_run(noise, baselines, ref) if noise else None,
        allow_diff=get("allow_diff", _dotted, ()),
        save_as=baselines / save if save else None,
    )


def resolve(
    cli: Mapping[str, Any],
    env: Mapping[str, str],
    ini: Mapping[str, Any],
    named_arms: Mapping[str, Mapping[str, Any]],
    rootdir: Path,
    fp8_kv_unsupported: str | None = None,
) -> Settings:
    """Resolve all raw values into one frozen Settings, or raise SettingsError naming the bad input."""

    explicit: set[str] = set()

    def get(name: str, parse: Callable[[Any], Any], default: Any) -> Any:
        raw, origin = _pick(name, cli, env, ini)
        if raw is None:
            return default
        explicit.add(name)
        return _parse(name, raw, origin, parse)

    def joined(raw: Any) -> str:
        return ",".join(raw) if isinstance(raw, list | tuple) else str(raw)

    names = get("arms", lambda raw: _names(joined(raw)), ())
    if not names:
        return Settings(arms=())
    engine = get("engine", _choice(*ENGINE_KINDS), "vllm")
    arms = resolve_arms(names, named_arms, engine)

    launcher = get("launcher", _choice("process", "docker", "external"), "process")
    if engine != "vllm" and launcher == "docker":
        raise SettingsError(f"--kv-engine={engine} runs with the process or external launcher, not docker")
    if engine == "openai" and launcher == "process" and not get("engine_cmd", lambda raw: raw, None):
        raise SettingsError("--kv-engine=openai with the process launcher needs --kv-engine-cmd (the server to start)")
    model = get("model", lambda raw: str(raw).strip(), None) or None
    embedded_name = embedded_models.DEFAULT
    if model is not None:
        try:
            named = embedded_models.parse(model)
        except ValueError as exc:
            raise SettingsError(f"--kv-model: {exc}") from None
        if named is not None:
            embedded_name, model = named, None
    if model is not None and looks_like_path(model):
        path = Path(model).expanduser()
        if not path.is_absolute():
            path = (rootdir / path) if not path.exists() else path.resolve()
        if engine == "llamacpp":
            if not path.is_file():
                raise SettingsError(f"--kv-model: llama.cpp serves a GGUF file; {model!r} is not a file")
        elif path.is_file():
            raise SettingsError(f"--kv-model: {model!r} is a file; give the model's folder (config.json and weights)")
        elif not path.is_dir():
            raise SettingsError(f"--kv-model: model folder {model!r} does not exist")
        model = str(path.resolve())

    endpoints = get("endpoint", lambda raw: _endpoints([raw] if isinstance(raw, str) else list(raw)), {})
    arm_names = [a.name for a in arms]
    if endpoints and launcher != "external":
        raise SettingsError("--kv-endpoint requires --kv-launcher=external")
    if launcher == "external":
        stray = sorted(set(endpoints) - set(arm_names))
        if stray:
            raise SettingsError(
                f"--kv-endpoint names arm(s) not in --kv-arms: {', '.join(stray)} (arms: {', '.join(arm_names)})"
            )
        missing = [n for n in arm_names if n not in endpoints]
        if missing:
            raise SettingsError(f"--kv-launcher=external needs --kv-endpoint ARM=URL for: {', '.join(missing)}")

    if launcher == "docker":
        image = get("image", lambda raw: str(raw).strip(), None)
        without = [a.name for a in arms if not (a.image or image)]
        if without:
            raise SettingsError(
                f"--kv-launcher=docker needs an image: give --kv-image or an 'image' in the arm's table "
                f"(missing for: {', '.join(without)})"
            )

    if model is None and launcher != "external" and engine == "vllm":
        gpu_only = [a for a in arms if a.kv_cache_dtype is not None and a.kv_cache_dtype not in CPU_KV_CACHE_DTYPES]
        if gpu_only:
            listed = ", ".join(f"{a.name} ({a.kv_cache_dtype})" for a in gpu_only)
            raise SettingsError(
                f"arm(s) {listed} need a GPU: the embedded CPU default serves only "
                f"{', '.join(sorted(CPU_KV_CACHE_DTYPES))}. Give --kv-model (and a GPU engine) to test them."
            )
        fp8 = [a for a in arms if (a.kv_cache_dtype or "").startswith("fp8")]
        if fp8 and fp8_kv_unsupported:
            listed = ", ".join(f"{a.name} ({a.kv_cache_dtype})" for a in fp8)
            raise SettingsError(f"arm(s) {listed} cannot run on the embedded CPU default here: {fp8_kv_unsupported}")

    # An embedded model on the CPU: the seed's 90K depths, 15-turn sessions and 1000-token decodes take many
    # minutes an arm there (the trained model prefills 40-190 tok/s and decodes ~20-140), so its probes get
    # the sizes config/embedded.py gives it (the boot plan says so).
    cpu_default = model is None and launcher != "external"
    spec = embedded_models.EMBEDDED[embedded_name]
    engine_cmd = get("engine_cmd", lambda raw: _args(joined(raw)), ())
    engine_args = get("engine_args", lambda raw: _args(" ".join(raw) if isinstance(raw, list) else raw), ())
    report_dir = report_dir_of(cli, env, ini, rootdir, writable=True)
    store_notes: list[str] = []
    store_location = store_of(cli, env, ini, rootdir)  # checked (a URL: connected to) once, before anything boots
    judged = report_options(
        cli, env, ini, rootdir, arms=[a.name for a in arms], notes=store_notes, store_location=store_location
    )
    compare = judged.compare.name if judged.compare else None

    replicates = get("replicates", lambda raw: _count(1)(str(raw)), 1)
    seed = get("seed", lambda raw: _count(0)(str(raw)), 0)
    target_ci = get("target_ci", _pct, None)
    runs = get("runs", lambda raw: _count(1)(str(raw)), spec.runs if cpu_default else 5)
    max_runs = get("max_runs", lambda raw: _count(1)(str(raw)), None)
    max_replicates = get("max_replicates", lambda raw: _count(1)(str(raw)), None)
    if target_ci is None and max_runs is not None:
        raise SettingsError("--kv-max-runs only applies with --kv-target-ci")
    if max_runs is not None and max_runs < runs:
        raise SettingsError(f"--kv-max-runs ({max_runs}) must be at least --kv-runs ({runs})")
    max_replicates = boot_budget(
        max_replicates, replicates, gates=bool(judged.gates), target_ci=target_ci, launcher=launcher
    )
    rounds = max(replicates, max_replicates or 0)
    order, order_seed = get("order", _order, ("abba" if rounds >= 2 else "sequential", None))
    noise = judged.noise.name if judged.noise else None
    max_sessions = get(
        "capacity_max_sessions",
        lambda raw: _count(1)(str(raw)),
        CPU_CAPACITY_MAX_SESSIONS if cpu_default else CAPACITY_MAX_SESSIONS,
    )
    start = get("capacity_start", lambda raw: _count(1)(str(raw)), 1)
    if start > max_sessions:
        raise SettingsError(f"--kv-capacity-start ({start}) is above --kv-capacity-max-sessions ({max_sessions})")
    full_check = get("self_check", lambda raw: raw if isinstance(raw, bool) else _bool(str(raw)), False)
    no_check = get("no_self_check", lambda raw: raw if isinstance(raw, bool) else _bool(str(raw)), False)
    if full_check and no_check:
        raise SettingsError("--kv-self-check and --kv-no-self-check contradict each other")

    settings = Settings(
        arms=arms,
        launcher=launcher,
        engine=engine,
        model=model,
        embedded_model=embedded_name,
        tokenizer=get("tokenizer", _tokenizer_dir(rootdir), None),
        engine_args=engine_args,
        engine_cmd=engine_cmd,
        endpoints=endpoints,
        port=get("port", lambda raw: _port(str(raw)), None),
        startup_timeout_s=get("startup_timeout", lambda raw: _positive_float(str(raw)), 600.0),
        request_timeout_s=get("request_timeout", lambda raw: _positive_float(str(raw)), 600.0),
        stall_timeout_s=get("stall_timeout", lambda raw: _positive_float(str(raw)), 120.0),
        first_token_floor_s=get("first_token_floor", lambda raw: _positive_float(str(raw)), 120.0),
        min_prefill_tps=get(
            "min_prefill_tps", lambda raw: _positive_float(str(raw)), spec.min_prefill_tps if cpu_default else 500.0
        ),
        progress=get("progress", _choice("auto", "lines", "off"), "auto"),
        host_cpu_max_pct=get("host_cpu_max", _pct_or_off, 50.0),
        host_cpu_action=get("host_cpu", _choice("flag", "exclude", "off"), "flag"),
        warmups=get("warmups", lambda raw: _count(0)(str(raw)), spec.warmups if cpu_default else 3),
        runs=runs,
        max_tokens=get("max_tokens", lambda raw: _count(1)(str(raw)), spec.short_max_tokens if cpu_default else None),
        sampling=get("sampling", _choice("greedy", "sampled"), "greedy"),
        report_dir=report_dir,
        suite=not get("no_suite", lambda raw: raw if isinstance(raw, bool) else _bool(str(raw)), False),
        seed=seed,
        depths=get("depths", _depths, spec.depths if cpu_default else SEED_DEPTHS),
        depth_warmups=get("depth_warmups", lambda raw: _count(0)(str(raw)), 1),
        depth_runs=get("depth_runs", lambda raw: _count(1)(str(raw)), 3),
        sessions=get("sessions", lambda raw: _count(1)(str(raw)), spec.sessions if cpu_default else 2),
        turns=get("turns", lambda raw: _count(1)(str(raw)), spec.turns if cpu_default else None),
        agentic_mode=get("agentic_mode", _choice("replay", "live"), "replay"),
        agentic_max_tokens=get(
            "agentic_max_tokens", lambda raw: _count(1)(str(raw)), spec.agentic_max_tokens if cpu_default else 600
        ),
        agentic_depth=get("agentic_depth", _agentic_depth, "fit"),
        gates=judged.gates,
        inconclusive=judged.inconclusive,
        save=judged.save_as.name if judged.save_as else None,
        compare=compare,
        image=get("image", lambda raw: str(raw).strip(), None),
        hf_cache=Path(get("hf_cache", lambda raw: str(raw), "~/.cache/huggingface")).expanduser(),
        compile_cache=get("compile_cache", _compile_cache, "auto"),
        gpus=get("gpus", _gpus, None),
        gpu_groups=get("gpu_groups", parse_gpu_groups, ()),
        pull=get("pull", lambda raw: raw if isinstance(raw, bool) else _bool(str(raw)), False),
        shm_size=get("shm_size", lambda raw: str(raw).strip(), None),
        gpu_power_limit=get("gpu_power_limit", _power_limit, None),
        gpu_require_idle=get("gpu_require_idle", lambda raw: raw if isinstance(raw, bool) else _bool(str(raw)), False),
        gpu_settle=get("gpu_settle", _settle, None),
        gpu_hz=get("gpu_hz", lambda raw: _positive_float(str(raw)), 4.0),
        gpu_max_temp=get("gpu_max_temp", lambda raw: _positive_float(str(raw)), None),
        replicates=replicates,
        order=order,
        order_seed=seed if order_seed is None else order_seed,
        target_ci_pct=target_ci,
        max_runs=max_runs,
        max_replicates=max_replicates,
        noise=noise,
        store=store_location,
        store_baselines=_store_baselines(store_location, env),
        store_notes=tuple(store_notes),
        allow_diff=judged.allow_diff,
        agreement=not get("no_agreement", lambda raw: raw if isinstance(raw, bool) else _bool(str(raw)), False),
        allow_unproven_cold=get(
            "allow_unproven_cold", lambda raw: raw if isinstance(raw, bool) else _bool(str(raw)), False
        ),
        self_check="off" if no_check else "full" if full_check else "quick",
        concurrency=get("concurrency", _levels, (1, 4, 16)),
        concurrency_max_tokens=get("concurrency_max_tokens", lambda raw: _count(1)(str(raw)), 128),
        client_procs=get("client_procs", _procs, None),
        client_max_cpu_pct=get("client_max_cpu", _pct_or_off, 85.0),
        client_max_lag_ms=get("client_max_lag_ms", _positive_or_off, 5.0),
        fidelity_depths=get("fidelity_depths", _depths, spec.fidelity_depths if cpu_default else FIDELITY_DEPTHS),
        fidelity_texts=get("fidelity_texts", _texts, FIDELITY_TEXTS),
        fidelity_top_k=get("fidelity_topk", lambda raw: _count(0)(str(raw)), 5),
        fidelity_window=get(
            "fidelity_window", lambda raw: _count(BLOCK_MIN)(str(raw)), spec.fidelity_window if cpu_default else 512
        ),
        explicit=frozenset(explicit),
        cache_bytes=get("cache_bytes", _size, None),
        slo=get("slo", _slo, CPU_SLO if cpu_default else GPU_SLO),
        capacity_depths=get("capacity_depths", _depths, CPU_CAPACITY_DEPTHS if cpu_default else CAPACITY_DEPTHS),
        capacity_think_s=get(
            "capacity_think",
            lambda raw: _positive_float(str(raw)),
            CPU_CAPACITY_THINK_S if cpu_default else CAPACITY_THINK_S,
        ),
        capacity_window_s=get(
            "capacity_window",
            lambda raw: _positive_float(str(raw)),
            CPU_CAPACITY_WINDOW_S if cpu_default else CAPACITY_WINDOW_S,
        ),
        capacity_max_tokens=get(
            "capacity_max_tokens",
            lambda raw: _count(1)(str(raw)),
            CPU_CAPACITY_MAX_TOKENS if cpu_default else CAPACITY_MAX_TOKENS,
        ),
        capacity_max_sessions=max_sessions,
        capacity_start=start,
    )
    from pytest_kvcache.config.context import fit_context

    settings = fit_context(settings)
    check_budgets(settings)
    return settings
