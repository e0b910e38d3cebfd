"""Settings: every ``--kv-…`` option, declared once on the field it sets, resolved once, frozen.

Precedence is CLI > environment (``PYTEST_KVCACHE_…``) > ini/pyproject (``kv_…``) > default. Each field
declared with :func:`~pytest_kvcache.config.options.option` is an option: its flag, ini key, environment
variable, help, parser, default and serialisation follow from that one declaration (``config/options.py``).
Resolution (``config/resolve.py``) reads configuration only; the run store and stored runs are opened after
it (``config/stored.py``), and the boot plan is built from the result once (``config/plan.py``).

The package is split along its old dividers, and this module re-exports what it used to hold:
``config/constants.py`` (data), ``config/options.py`` (the declaration), ``config/values.py`` (value parsers),
``config/arms.py``, ``config/plan.py`` (the boot plan), ``config/resolve.py`` and ``config/stored.py``.

This module is plain Python (no pytest): the plugin feeds it the raw values it read.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal, TypedDict

from pytest_kvcache.config import embedded as embedded_models
from pytest_kvcache.config import values as v
from pytest_kvcache.config.arms import Arm as Arm
from pytest_kvcache.config.arms import looks_like_path as looks_like_path
from pytest_kvcache.config.arms import resolve_arm as resolve_arm
from pytest_kvcache.config.arms import resolve_arms as resolve_arms
from pytest_kvcache.config.constants import (
    ALIASES as ALIASES,
)
from pytest_kvcache.config.constants import (
    ARM_NAME as ARM_NAME,
)
from pytest_kvcache.config.constants import (
    CAPACITY_DEPTHS as CAPACITY_DEPTHS,
)
from pytest_kvcache.config.constants import (
    CAPACITY_MAX_SESSIONS as CAPACITY_MAX_SESSIONS,
)
from pytest_kvcache.config.constants import (
    CAPACITY_MAX_TOKENS as CAPACITY_MAX_TOKENS,
)
from pytest_kvcache.config.constants import (
    CAPACITY_THINK_S as CAPACITY_THINK_S,
)
from pytest_kvcache.config.constants import (
    CAPACITY_WINDOW_S as CAPACITY_WINDOW_S,
)
from pytest_kvcache.config.constants import (
    CPU_CAPACITY_DEPTHS as CPU_CAPACITY_DEPTHS,
)
from pytest_kvcache.config.constants import (
    CPU_CAPACITY_MAX_SESSIONS as CPU_CAPACITY_MAX_SESSIONS,
)
from pytest_kvcache.config.constants import (
    CPU_CAPACITY_MAX_TOKENS as CPU_CAPACITY_MAX_TOKENS,
)
from pytest_kvcache.config.constants import (
    CPU_CAPACITY_THINK_S as CPU_CAPACITY_THINK_S,
)
from pytest_kvcache.config.constants import (
    CPU_CAPACITY_WINDOW_S as CPU_CAPACITY_WINDOW_S,
)
from pytest_kvcache.config.constants import (
    CPU_KV_CACHE_DTYPES as CPU_KV_CACHE_DTYPES,
)
from pytest_kvcache.config.constants import (
    CPU_SLO as CPU_SLO,
)
from pytest_kvcache.config.constants import (
    FIDELITY_DEPTHS as FIDELITY_DEPTHS,
)
from pytest_kvcache.config.constants import (
    FIDELITY_TEXTS as FIDELITY_TEXTS,
)
from pytest_kvcache.config.constants import (
    GPU_SLO as GPU_SLO,
)
from pytest_kvcache.config.constants import (
    HALF_KV_ON_FLOAT32 as HALF_KV_ON_FLOAT32,
)
from pytest_kvcache.config.constants import (
    KV_CACHE_DTYPES as KV_CACHE_DTYPES,
)
from pytest_kvcache.config.constants import (
    SEED_DEPTHS as SEED_DEPTHS,
)
from pytest_kvcache.config.constants import (
    AgenticMode as AgenticMode,
)
from pytest_kvcache.config.constants import (
    HostCpuAction as HostCpuAction,
)
from pytest_kvcache.config.constants import (
    LauncherKind as LauncherKind,
)
from pytest_kvcache.config.constants import (
    Order as Order,
)
from pytest_kvcache.config.constants import (
    Progress as Progress,
)
from pytest_kvcache.config.constants import (
    Sampling as Sampling,
)
from pytest_kvcache.config.constants import (
    SelfCheck as SelfCheck,
)
from pytest_kvcache.config.constants import (
    SettingsError as SettingsError,
)
from pytest_kvcache.config.engine_kinds import ENGINE_KINDS, EngineKind
from pytest_kvcache.config.options import NOT_SERIALISED, TO_DICT, UNBOUND, option, options_of, serialise, to_dict
from pytest_kvcache.config.options import OptionSpec as OptionSpec
from pytest_kvcache.config.plan import GATE_BOOT_BUDGET as GATE_BOOT_BUDGET
from pytest_kvcache.config.plan import Boot as Boot
from pytest_kvcache.config.plan import BootPlan as BootPlan
from pytest_kvcache.config.plan import boot_budget as boot_budget
from pytest_kvcache.config.plan import boot_order as boot_order
from pytest_kvcache.config.plan import lane_order as lane_order
from pytest_kvcache.config.values import BLOCK_MIN as BLOCK_MIN
from pytest_kvcache.config.values import DEPTH as DEPTH
from pytest_kvcache.config.values import DOTTED as DOTTED
from pytest_kvcache.config.values import parse_depths as parse_depths
from pytest_kvcache.config.values import parse_gpu_groups as parse_gpu_groups
from pytest_kvcache.report.options import ReportOptions


class ClientLimits(TypedDict):
    """The measuring client's limits, as ``Client`` takes them."""

    request_timeout_s: float
    stall_timeout_s: float
    first_token_floor_s: float | None
    min_prefill_tps: float


def _embedded(name: str, settings: Settings) -> dict[str, Any]:
    return {"embedded_model": settings.embedded, "embedded_name": name if settings.embedded else None}


@dataclass(frozen=True)
class Settings:
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
    launcher: LauncherKind = option(
        help="how each arm's engine is started: process (default), docker or external.",
        metavar="KIND",
        parse=v.choice("process", "docker", "external"),
        default="process",
    )
    engine: EngineKind = option(
        help=(
            "which server every arm is: vllm (default), llamacpp (llama-server; arms are its cache types f16, q8_0, "
            "q4_0 …) or openai (any other OpenAI-compatible server: no vLLM-only request field is sent)."
        ),
        metavar="KIND",
        parse=v.choice(*ENGINE_KINDS),
        default="vllm",
    )
    model: str | None = option(
        help=(
            "model path or id served by every arm, or an embedded model: embedded:smollm2-135m (the default: "
            "SmolLM2-135M-Instruct, trained weights, 8K context) or embedded:tiny-qwen3 (random weights)."
        ),
        metavar="MODEL",
        default=None,
    )
    tokenizer: str | None = option(
        help=(
            "local tokenizer folder (tokenizer.json + chat template) that counts prompt tokens for a server without a"
            " tokenizer endpoint (--kv-engine=openai; default: --kv-model's folder, else the embedded model's)."
        ),
        metavar="DIR",
        default=None,
    )
    #: which embedded model serves when ``model`` is None (``--kv-model=embedded:NAME``; config/embedded.py)
    embedded_model: str = field(default=embedded_models.DEFAULT, metadata=to_dict(_embedded))
    engine_args: tuple[str, ...] = option(
        help="extra engine arguments appended for every arm (one shell-quoted string).",
        metavar="ARGS",
        parse=lambda raw: v.args(" ".join(raw) if isinstance(raw, list) else raw),
        default=(),
    )
    engine_cmd: tuple[str, ...] = option(
        help=(
            "command that starts the engine for the process launcher (default: '<this python> -m "
            "vllm.entrypoints.openai.api_server'; for llamacpp: llama-server on PATH, else one built once from the "
            "llama-cpp-python sdist's llama.cpp and cached)."
        ),
        metavar="CMD",
        parse=lambda raw: v.args(v.joined(raw)),
        default=(),
    )
    endpoints: Mapping[str, str] = option(
        "endpoint",
        help="ARM=URL of an already running server (repeatable; requires --kv-launcher=external and one per arm).",
        metavar="ARM=URL",
        repeatable=True,
        parse=lambda raw: v.endpoints([raw] if isinstance(raw, str) else list(raw)),
        default=dict,
    )
    port: int | None = option(
        help="fixed port for the process launcher (default: a free port per boot).",
        metavar="PORT",
        parse=lambda raw: v.port(str(raw)),
        default=None,
    )
    startup_timeout_s: float = option(
        "startup_timeout",
        help="seconds an engine may take to answer /v1/models (default 600).",
        metavar="S",
        parse=v.positive,
        default=600.0,
    )
    request_timeout_s: float = option(
        "request_timeout",
        help="seconds one request may take end to end (default 600).",
        metavar="S",
        parse=v.positive,
        default=600.0,
    )
    stall_timeout_s: float = option(
        "stall_timeout",
        help="seconds without a streamed chunk before a request fails (default 120).",
        metavar="S",
        parse=v.positive,
        default=120.0,
    )
    warmups: int = option(
        help="unmeasured warmup requests per probe shape (default 3).",
        metavar="N",
        parse=v.count(0),
        default=3,
        cpu_default=lambda m: m.warmups,
    )
    runs: int = option(
        help="measured requests per probe shape (default 5).",
        metavar="N",
        parse=v.count(1),
        default=5,
        cpu_default=lambda m: m.runs,
    )
    max_tokens: int | None = option(
        help="override every short probe's max_tokens.",
        metavar="N",
        parse=v.count(1),
        default=None,
        cpu_default=lambda m: m.short_max_tokens,
    )
    sampling: Sampling = option(
        help=(
            "greedy (default: temperature 0, ignore_eos, identical tokens across arms) or sampled (the seed's "
            "temperature 0.6, top_p 0.95, top_k 20)."
        ),
        metavar="MODE",
        parse=v.choice("greedy", "sampled"),
        default="greedy",
    )
    report_dir: Path = option(
        help="folder that holds run folders (default .kvcache/runs).", metavar="DIR", default=Path(".kvcache/runs")
    )
    suite: bool = option(
        "no_suite",
        help="do not collect the stock probe tests; run only your own.",
        flag=True,
        parse=lambda raw: not v.flag(raw),
        default=True,
    )
    seed: int = option(
        help="run seed: salts and ordering derive from it (default 0).", metavar="N", parse=v.count(0), default=0
    )
    depths: tuple[int, ...] = option(
        help="prefill depths in prompt tokens, 'k' = 1000 (default 10k,90k).",
        metavar="D1,D2",
        parse=v.depths,
        default=SEED_DEPTHS,
        cpu_default=lambda m: m.depths,
    )
    depth_warmups: int = option(
        help="unmeasured prefill requests per depth (default 1).", metavar="N", parse=v.count(0), default=1
    )
    depth_runs: int = option(
        help="measured prefill requests per depth (default 3).", metavar="N", parse=v.count(1), default=3
    )
    sessions: int = option(
        help="independent agentic sessions per arm (default 2).",
        metavar="N",
        parse=v.count(1),
        default=2,
        cpu_default=lambda m: m.sessions,
    )
    turns: int | None = option(
        help="run only the first N turns of the agentic fixture (default: all).",
        metavar="N",
        parse=v.count(1),
        default=None,
        cpu_default=lambda m: m.turns,
    )
    agentic_mode: AgenticMode = option(
        help=(
            "replay (default: prompts from the fixture alone, identical in every arm, greedy) or live (the model's "
            "own replies and tool calls are appended, as the seed did)."
        ),
        metavar="MODE",
        parse=v.choice("replay", "live"),
        default="replay",
    )
    agentic_max_tokens: int = option(
        help="max_tokens per agentic turn (default 600; 64 on the embedded trained model).",
        metavar="N",
        parse=v.count(1),
        default=600,
        cpu_default=lambda m: m.agentic_max_tokens,
    )
    gates: tuple[str, ...] = option(
        "fail",
        help=(
            "a regression gate 'METRIC[PROBE[@POINT]]: CONDITION' (repeatable), e.g. 'decode_tps[short]: int8 >= fp8 "
            "* 1.20', 'ttft_s[prefill]: <= +10%', 'decode_tps[agentic@turn15]: >= 30', 'ttft_s[prefill]: <= saved "
            "+5%'. Failed gates exit 1."
        ),
        metavar="EXPR",
        repeatable=True,
        default=(),
    )
    inconclusive: Literal["fail", "warn"] = option(
        help="what an inconclusive gate does: warn (default) or fail.",
        metavar="MODE",
        parse=v.choice("fail", "warn"),
        default="warn",
    )
    save: str | None = option(
        help="store this run as the baseline NAME in the run store (--kv-store).",
        metavar="NAME",
        parse=v.baseline_name,
        default=None,
    )
    compare: str | None = option(
        help="compare this run with the stored baseline NAME (and enable 'saved' gates).",
        metavar="NAME",
        parse=v.baseline_name,
        default=None,
    )
    image: str | None = option(
        help="the docker launcher's image (e.g. vllm/vllm-openai:v0.25.1); a named arm may set its own.",
        metavar="IMAGE",
        parse=v.stripped,
        default=None,
    )
    hf_cache: Path | None = option(
        help="host HF cache mounted at /root/.cache/huggingface (default ~/.cache/huggingface).",
        metavar="DIR",
        parse=lambda raw: Path(str(raw)).expanduser(),
        default=lambda: Path("~/.cache/huggingface").expanduser(),
        unset=None,
    )
    compile_cache: str = option(
        help=(
            "vLLM's torch.compile cache shared by every boot: auto (default: the engine's own, ~/.cache/vllm, mounted"
            " into containers), a DIR (VLLM_CACHE_ROOT), or off (each boot compiles)."
        ),
        metavar="auto|DIR|off",
        parse=v.compile_cache,
        default="auto",
    )
    gpus: str | None = option(
        help="GPUs for containers: all, or indices/UUIDs like 0,1,2,3 (default: none).",
        metavar="GPUS",
        parse=v.gpus,
        default=None,
    )
    pull: bool = option(
        help="let the docker launcher pull a missing image (default: a missing image is an error).",
        flag=True,
        parse=v.flag,
        default=False,
    )
    shm_size: str | None = option(
        help="container shared memory (e.g. 16g) instead of --ipc=host.", metavar="SIZE", parse=v.stripped, default=None
    )
    gpu_power_limit: str | None = option(
        help=(
            "pin GPU power caps before the first arm, verify them around every arm, restore them at the end: '300' "
            "(all cards, W), '0:300,1:250' (by index), 'GPU-ab12:300' (by UUID prefix); 'verify:300' only checks. "
            "Setting needs root."
        ),
        metavar="SPEC",
        parse=v.power_limit,
        default=None,
    )
    gpu_require_idle: bool = option(
        help="refuse to boot an arm while a foreign process holds a GPU or it is busy.",
        flag=True,
        parse=v.flag,
        default=False,
    )
    gpu_settle: tuple[float, float] | None = option(
        help="between arms, wait until every GPU is at or below TEMP_C:POWER_W (e.g. 45:150).",
        metavar="T:W",
        parse=v.settle,
        default=None,
    )
    gpu_hz: float = option(
        help="GPU sampling rate during the run (default 4 Hz).", metavar="HZ", parse=v.positive, default=4.0
    )
    gpu_max_temp: float | None = option(
        help="exclude samples whose window saw a GPU above this temperature (°C).",
        metavar="C",
        parse=v.positive,
        default=None,
    )
    replicates: int = option(
        help=(
            "boots per arm (default 1). Each boot runs every selected probe; with 3 or more the report's CIs are "
            "computed over boots (boots, then samples within a boot)."
        ),
        metavar="N",
        parse=v.count(1),
        default=1,
    )
    order: Order = option(
        help=(
            "the boot order: sequential (A B A B), abba (A B B A A B …; the default with 2+ replicates) or "
            "random[:SEED] (each round shuffled; default seed: --kv-seed)."
        ),
        metavar="MODE",
        default="sequential",
    )
    #: the seed of ``--kv-order=random`` (``random:SEED``, else ``--kv-seed``)
    order_seed: int = 0
    target_ci_pct: float | None = option(
        "target_ci",
        help=(
            "adaptive sampling: add measured requests within a boot until the probe's CI half-width is below PCT of "
            "its mean (up to --kv-max-runs); with 2+ replicates, also add rounds of boots until every delta's CI "
            "half-width is below PCT (up to --kv-max-replicates)."
        ),
        metavar="PCT",
        parse=v.pct,
        default=None,
    )
    max_runs: int | None = option(
        help="with --kv-target-ci: measured requests per probe shape at most (default 4 × runs).",
        metavar="N",
        parse=v.count(1),
        default=None,
    )
    max_replicates: int | None = option(
        help=(
            "the boot budget: boots per arm a run may grow to, one counterbalanced round at a time, while a gate is "
            "undecided (default with --kv-fail: 3) or a CI is wider than --kv-target-ci (with 2+ replicates: 2 × "
            "replicates); 1 turns it off."
        ),
        metavar="N",
        default=None,
    )
    noise: str | None = option(
        help=(
            "a stored A/A run (--kv-arms=X,X --kv-save=NAME) whose deltas are the noise band: verdicts and gates "
            "count a difference only beyond it."
        ),
        metavar="NAME",
        parse=v.baseline_name,
        default=None,
    )
    store: str | None = option(
        help=(
            "the run store: named baselines and the history of every run, outside the workspace (a folder; default "
            "$XDG_DATA_HOME/pytest-kvcache, else ~/.local/share/pytest-kvcache), or a postgresql:// URL."
        ),
        metavar="PATH|URL",
        default=None,
    )
    allow_diff: tuple[str, ...] = option(
        help=(
            "an evidence path (e.g. cache_config.block_size, engine_version, argv.--max-num-seqs) allowed to differ "
            "between boots without marking the A/B CONFOUNDED (repeatable; a prefix allows everything below it)."
        ),
        metavar="KEY",
        repeatable=True,
        parse=v.dotted,
        default=(),
    )
    agreement: bool = option(
        "no_agreement",
        help="skip the output-agreement requests (greedy token ids per short shape).",
        flag=True,
        parse=lambda raw: not v.flag(raw),
        default=True,
    )
    allow_unproven_cold: bool = option(
        help=(
            "keep prefill samples nothing proves cold (no /metrics prefix-cache hits, no usage cached_tokens); "
            "default: excluded."
        ),
        flag=True,
        parse=v.flag,
        default=False,
    )
    self_check: SelfCheck = option(
        help=(
            "run the full measuring-client self-check against a calibrated stream at the start (default: a ~1 s quick"
            " one)."
        ),
        flag=True,
        default="quick",
    )
    concurrency: tuple[int, ...] = option(
        help="simultaneous streams per level of the concurrency probe (default 1,4,16).",
        metavar="N1,N2",
        parse=v.levels,
        default=(1, 4, 16),
    )
    concurrency_max_tokens: int = option(
        help="max_tokens of each concurrency-probe stream (default 128).", metavar="N", parse=v.count(1), default=128
    )
    client_procs: int | None = option(
        help=(
            "worker processes (one event loop each) that read the concurrency probe's streams (default auto: one per "
            "64 streams, at most half the cores)."
        ),
        metavar="N|auto",
        parse=v.procs,
        default=None,
    )
    client_max_cpu_pct: float | None = option(
        "client_max_cpu",
        help=(
            "a concurrency trial whose client process used more than this share of a core is saturated: its figures "
            "are the client's, and are excluded (default 85%; 'off')."
        ),
        metavar="PCT|off",
        parse=v.pct_or_off,
        default=85.0,
    )
    client_max_lag_ms: float | None = option(
        help=(
            "a concurrency trial whose client event loop lagged more than this (99th percentile) is saturated and "
            "excluded (default 5; 'off')."
        ),
        metavar="MS|off",
        parse=v.positive_or_off,
        default=5.0,
    )
    fidelity_depths: tuple[int, ...] = option(
        help=(
            "depths at which the fidelity probe compares prompt logprobs with the baseline arm, 'k' = 1000 (default "
            "1k,8k,32k; 1k,4k on the embedded CPU default)."
        ),
        metavar="D1,D2",
        parse=v.depths,
        default=FIDELITY_DEPTHS,
        cpu_default=lambda m: m.fidelity_depths,
    )
    fidelity_texts: tuple[str, ...] = option(
        help="the fidelity probe's committed texts (default prose,code).",
        metavar="T1,T2",
        parse=v.texts,
        default=FIDELITY_TEXTS,
    )
    fidelity_top_k: int = option(
        "fidelity_topk",
        help="top-k logprobs per position for the fidelity probe's KL estimate; 0: none (default 5).",
        metavar="K",
        parse=v.count(0),
        default=5,
    )
    fidelity_window: int = option(
        help="positions scored before each fidelity depth (default 512).",
        metavar="N",
        parse=v.count(BLOCK_MIN),
        default=512,
        cpu_default=lambda m: m.fidelity_window,
    )
    cache_bytes: int | None = option(
        help=(
            "the KV-cache budget of every vLLM arm (its --kv-cache-memory-bytes; VLLM_CPU_KVCACHE_SPACE is then left "
            "unset): 512MiB, 2GiB, 2G or bytes. It must hold one request of max_model_len at the arm's dtype "
            "(default: each engine sizes its own)."
        ),
        metavar="SIZE",
        parse=v.size,
        default=None,
    )
    slo: str = option(
        help=(
            "the capacity probe's latency SLO over a trial's measured turns, e.g. ttft_p95<=2s,itl_p95<=60ms (default"
            " that; ttft_p95<=200ms,itl_p95<=100ms on the embedded CPU default)."
        ),
        metavar="TERMS",
        parse=v.slo,
        default=GPU_SLO,
        cpu_default=lambda m: CPU_SLO,
    )
    capacity_depths: tuple[int, ...] = option(
        help=(
            "the capacity probe's session contexts in tokens, 'k' = 1000 (default 16k,32k; 2k,4k on the embedded CPU "
            "default)."
        ),
        metavar="D1,D2",
        parse=v.depths,
        default=CAPACITY_DEPTHS,
        cpu_default=lambda m: CPU_CAPACITY_DEPTHS,
    )
    capacity_think_s: float = option(
        "capacity_think",
        help=(
            "mean think time between a session's turns, in seconds (each drawn uniform 0.5–1.5 × it; default 2, 1 on "
            "the embedded CPU default)."
        ),
        metavar="S",
        parse=v.positive,
        default=CAPACITY_THINK_S,
        cpu_default=lambda m: CPU_CAPACITY_THINK_S,
    )
    capacity_window_s: float = option(
        "capacity_window",
        help=(
            "seconds each capacity trial is measured for, after its sessions are warm (default 30; 5 on the embedded "
            "CPU default)."
        ),
        metavar="S",
        parse=v.positive,
        default=CAPACITY_WINDOW_S,
        cpu_default=lambda m: CPU_CAPACITY_WINDOW_S,
    )
    capacity_max_tokens: int = option(
        help="tokens each capacity turn decodes (default 64; 16 on the embedded CPU default).",
        metavar="N",
        parse=v.count(1),
        default=CAPACITY_MAX_TOKENS,
        cpu_default=lambda m: CPU_CAPACITY_MAX_TOKENS,
    )
    capacity_max_sessions: int = option(
        help="the most concurrent sessions the capacity search tries (default 256; 32 on the embedded CPU default).",
        metavar="N",
        parse=v.count(1),
        default=CAPACITY_MAX_SESSIONS,
        cpu_default=lambda m: CPU_CAPACITY_MAX_SESSIONS,
    )
    capacity_start: int = option(
        help="the capacity search's first number of sessions (default 1).", metavar="N", parse=v.count(1), default=1
    )
    first_token_floor_s: float = option(
        "first_token_floor",
        help=(
            "before the first byte a request may wait this floor plus prompt tokens / --kv-min-prefill-tps (default "
            "120 s): vLLM sends nothing until prefill ends, and a deep prefill takes minutes."
        ),
        metavar="S",
        parse=v.positive,
        default=120.0,
    )
    min_prefill_tps: float = option(
        help=(
            "the slowest prefill rate (tokens/s) the first-token limit allows for (default 500: a 90K prompt may take"
            " 120 + 180 s before its first token)."
        ),
        metavar="TPS",
        parse=v.positive,
        default=500.0,
        cpu_default=lambda m: m.min_prefill_tps,
    )
    progress: Progress = option(
        help=(
            "progress lines during the run: auto (a live line on a terminal, plain lines otherwise; default), lines "
            "(always plain lines) or off."
        ),
        metavar="MODE",
        parse=v.choice("auto", "lines", "off"),
        default="auto",
    )
    host_cpu_max_pct: float | None = option(
        "host_cpu_max",
        help=(
            "a sample whose window saw more than this share (%) of the host's CPU busy outside the engine and the "
            "client is disturbed (default 50; off: no sampling; see docs/host-cpu.md)."
        ),
        metavar="PCT",
        parse=v.pct_or_off,
        default=50.0,
    )
    host_cpu_action: HostCpuAction = option(
        "host_cpu",
        help=(
            "what a disturbed sample gets: flag (default: counted in the report) or exclude (left out of the "
            "statistics)."
        ),
        metavar="ACTION",
        parse=v.choice("flag", "exclude", "off"),
        default="flag",
    )
    gpu_groups: tuple[str, ...] = option(
        help=(
            "with pytest-xdist (-n N or --tx): one group of cards per worker, ';'-separated, like 0,1;2,3;4,5;6,7. "
            "Each worker's engines see only its group (CUDA_VISIBLE_DEVICES, or the container's device ids) and its "
            "GPU state covers only those cards; over ssh gateways, each host's own cards."
        ),
        metavar="G1;G2",
        parse=v.gpu_groups,
        default=(),
    )
    #: Parallel lanes (pytest-xdist workers) the blocks of boots are placed on; 1 without pytest-xdist.
    lanes: int = 1
    agentic_depth: str = option(
        help=(
            "how deep the agentic session's last turn goes: fit (default: the stock fixture, its tool results scaled "
            "down when its last turn cannot fit the context), stock (as it is: turns that cannot fit are left out), a"
            " token count like 6k, or a share of the context like 75%. Scaling keeps the turns and their growth."
        ),
        metavar="fit|stock|N|PCT",
        parse=v.agentic_depth,
        default="fit",
    )
    #: The context (tokens one request may fill) known before any boot: the embedded model's, a model
    #: folder's config, ``--max-model-len``/``--ctx-size`` in the engine arguments; None: known at boot.
    context_tokens: int | None = None
    #: where ``context_tokens`` came from, in words
    context_source: str | None = None
    #: default probe points left out before any boot because they cannot fit ``context_tokens``
    context_notes: tuple[str, ...] = ()
    #: Where the run store's baselines are on this machine (``store.baselines_dir_of``: no I/O).
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
        return "bfloat16" if any(a.kv_cache_dtype in HALF_KV_ON_FLOAT32 for a in self.arms) else "float32"

    @property
    def rounds(self) -> int:
        """Boots per arm the plan holds: ``--kv-replicates``, and up to the boot budget ``--kv-max-replicates``
        when rounds may be added (an undecided gate, or a CI wider than ``--kv-target-ci``; see
        :func:`boot_budget`). Rounds past ``--kv-replicates`` are adaptive: booted only while needed."""
        return max(self.replicates, self.max_replicates or 0)

    def boots(self) -> tuple[Boot, ...]:
        """The boot plan's boots (``BootPlan.of(settings).boots``). The plugin builds the plan once, at configure,
        and hands it on; this is for callers that hold only settings (tests, scripts)."""
        from pytest_kvcache.config.plan import BootPlan

        return BootPlan.of(self).boots

    def lane_cards(self, lane: int) -> str | None:
        """The cards lane ``lane``'s engines see (its ``--kv-gpu-groups`` group), or None: not pinned."""
        return self.gpu_groups[lane] if self.gpu_groups and lane < len(self.gpu_groups) else None

    def to_dict(self) -> dict[str, Any]:
        """The settings as run.json stores them: each field by its name (or its own ``to_dict`` encoder)."""
        out: dict[str, Any] = {}
        for f in fields(self):
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


#: Every option: the ones declared on ``Settings`` fields, in field order, then those that set no field.
OPTIONS: tuple[OptionSpec, ...] = (*options_of(Settings), *UNBOUND)
OPTION_BY_NAME: Mapping[str, OptionSpec] = {spec.name: spec for spec in OPTIONS}

from pytest_kvcache.config.resolve import check_budgets as check_budgets  # noqa: E402
from pytest_kvcache.config.resolve import report_dir_of as report_dir_of  # noqa: E402
from pytest_kvcache.config.resolve import resolve as resolve  # noqa: E402
from pytest_kvcache.config.resolve import unwritable_folder as unwritable_folder  # noqa: E402
from pytest_kvcache.config.stored import Stored as Stored  # noqa: E402
from pytest_kvcache.config.stored import open_stored as open_stored  # noqa: E402
from pytest_kvcache.config.stored import report_options as report_options  # noqa: E402
from pytest_kvcache.config.stored import store_of as store_of  # noqa: E402
