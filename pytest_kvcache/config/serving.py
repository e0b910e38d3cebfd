"""The serving options: which engine serves which model, how it is started and reached, the measuring
client's limits, the GPU and host-CPU controls. Each field is one option's whole declaration
(``config/options.py``); :class:`~pytest_kvcache.config.settings.Settings` holds them with the probe options."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_kvcache.config import embedded as embedded_models
from pytest_kvcache.config import values as v
from pytest_kvcache.config.constants import HostCpuAction, LauncherKind, Progress, SelfCheck
from pytest_kvcache.config.options import option, to_dict
from pytest_kvcache.kind_registry import EngineKind


def _embedded(name: str, settings: Any) -> dict[str, Any]:
    return {"embedded_model": settings.embedded, "embedded_name": name if settings.embedded else None}


@dataclass(frozen=True)
class ServingOptions:
    """How every arm is served and measured (a part of :class:`Settings`)."""

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
        parse=v.kind_choice,
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
        parse=v.positive,
        default=600.0,
    )
    request_timeout_s: float = option(
        "request_timeout",
        help="seconds one request may take end to end (default 600).",
        parse=v.positive,
        default=600.0,
    )
    stall_timeout_s: float = option(
        "stall_timeout",
        help="seconds without a streamed chunk before a request fails (default 120).",
        parse=v.positive,
        default=120.0,
    )
    first_token_floor_s: float = option(
        "first_token_floor",
        help=(
            "before the first byte a request may wait this floor plus prompt tokens / --kv-min-prefill-tps (default "
            "120 s): vLLM sends nothing until prefill ends, and a deep prefill takes minutes."
        ),
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
    progress: Progress = option(
        help=(
            "progress lines during the run: auto (a live line on a terminal, plain lines otherwise; default), lines "
            "(always plain lines) or off."
        ),
        metavar="MODE",
        parse=v.choice("auto", "lines", "off"),
        default="auto",
    )
    self_check: SelfCheck = option(
        help=(
            "run the full measuring-client self-check against a calibrated stream at the start (default: a ~1 s quick"
            " one)."
        ),
        flag=True,
        default="quick",
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
