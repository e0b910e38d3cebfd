"""What a run writes once per boot and per run: a boot's evidence, the arms, the boot plan, ``run.json``;
and the pure readers of an evidence dict (its resolved cache dtype, KV capacity, speculative setup)."""

from __future__ import annotations

import re
from typing import Any, TypedDict

from pytest_kvcache.model.base import Json


class CacheConfig(TypedDict, total=False):
    """The labels of ``vllm:cache_config_info`` (strings, as Prometheus gives them)."""

    cache_dtype: str
    kv_cache_size_tokens: str
    block_size: str
    enable_prefix_caching: str


class LogFacts(TypedDict, total=False):
    """What the engine's startup log says (``engines.evidence.parse_log``)."""

    engine_version: str
    kv_cache_dtype: str
    kv_cache_size_tokens: int
    kv_cache_device: str
    #: "Maximum concurrency for L tokens per request: X" (vLLM): X, and L (its max_model_len)
    kv_max_concurrency: float
    kv_concurrency_len: int
    attention_backend: str
    attention_candidates: list[str]
    non_default_args: dict[str, Json]
    speculative_config: str  # as the engine's config line prints it: "None" or "SpeculativeConfig(…)"
    compile_s: float  # "torch.compile took … s in total" (absent with --enforce-eager)
    compile_cache: str  # "hit" (graphs loaded from the compile cache), "miss" (compiled), "partial"
    init_engine_s: float  # "init engine (profile, create kv cache, warmup model) took … s"
    graph_capture_s: float  # "Graph capturing finished in … secs"
    # llama.cpp (llama-server's log)
    kv_cache_type_k: str  # "llama_kv_cache: size = … K (q8_0): … MiB, V (q8_0): … MiB"
    kv_cache_type_v: str
    kv_cache_mib: float
    flash_attn: str  # "flash_attn = enabled|disabled|auto"
    n_ctx: int


class GpuCard(TypedDict, total=False):
    index: int
    uuid: str
    name: str | None
    power_limit_w: float | None
    temp_c: float | None
    memory_used_mib: int | None


class GpuSnapshot(TypedDict, total=False):
    """An NVML snapshot (``gpu.snapshot``), or ``{"gpu": False, "reason": …}`` without a GPU."""

    gpu: bool
    reason: str
    taken_unix_s: float
    driver_version: str | None
    cuda_driver_version: str | None
    device_count: int
    cards: list[GpuCard]
    p2p: Json
    nvml_errors: dict[str, str]


class Evidence(TypedDict, total=False):
    """``arms/<boot>/evidence.json``: what one boot declared, what the engine resolved, its GPU state."""

    boot: str
    arm: ArmData
    replicate: int
    declared_kv_cache_dtype: str | None
    #: pytest-xdist: the lane (worker, its GPU group and host) and block the boot ran in.
    lane: int
    block: int
    status: str
    error: str
    started_unix_s: float
    #: checked and measurable (its evidence collected): booting ends, measuring may start
    ready_unix_s: float
    #: the stop began (its GPU snapshot, then the engine's shutdown, until ``stopped_unix_s``)
    stopping_unix_s: float
    stopped_unix_s: float
    warnings: list[str]
    # launcher facts (Engine.describe)
    launcher: str
    url: str
    pid: int | None
    argv: list[str]
    env: dict[str, str]
    ready_s: float | None
    stop: Json
    image: str | None
    image_id: str | None
    image_digest: str | None
    image_repo_digests: list[str]
    container_id: str | None
    container_name: str | None
    config: dict[str, Json]
    exit_code: int | None
    # what the server says (engines.evidence.collect)
    engine_version: str | None
    served_model: str | None
    model_root: str | None
    max_model_len: int | None
    models: list[str]
    cache_config: CacheConfig | None
    log: LogFacts
    errors: dict[str, str]
    tokenize: str
    # the server's kind (--kv-engine) and what it cannot show (EngineProfile.missing_evidence)
    engine_kind: str
    evidence_missing: list[str]
    # llama.cpp's own endpoints: /props (build, context, slots, chat template) and /slots
    props: dict[str, Json]
    slots: list[Json]
    metrics_families: list[str]  # a non-vLLM /metrics: which families it exposes
    # GPU state
    gpu_before: GpuSnapshot
    gpu_ready: GpuSnapshot
    gpu_after: GpuSnapshot
    vram_ready_mib: dict[str, int]
    vram_before_stop_mib: dict[str, int]
    gpu_changes: list[str]


class ArmData(TypedDict, total=False):
    """``Arm.to_dict``: one declared serving variant."""

    name: str
    kv_cache_dtype: str | None
    args: list[str]
    env: dict[str, str]
    image: str | None
    source: str
    typed_as: str
    knobs: list[str] | None


class KvPlanData(TypedDict, total=False):
    """What the engine kind's arithmetic planned for one boot's KV budget, before it booted (``config.kv_layout``'s
    ``KvPlan``): the figures the engine will report, or why there are none."""

    #: the served model's KV layout in words (``13 layers: 11 sliding-window (512) + 2 full, 1 KV head × 64``)
    layout: str
    budget_bytes: int
    max_model_len: int
    #: "KV cache size: N tokens" as the engine will report it; null: not modelled
    tokens: int | None
    #: its maximum concurrency at max_model_len
    concurrency: float | None
    #: what one request of max_model_len takes: the smallest budget the engine accepts
    request_bytes: int | None
    #: the engine's grouping in words, and the engine settings the figures rest on
    groups: str
    assumptions: str
    #: why there is no figure ("" when modelled)
    not_modelled: str


class PlanEntry(TypedDict, total=False):
    """One planned boot in ``run.json``'s ``plan``, in run order."""

    boot: str
    arm: str
    replicate: int
    extra: bool
    kv_cache_dtype: str | None
    args: list[str]
    tests: int
    skipped: str
    #: The arm's KV budget in bytes (``--kv-cache-bytes`` or its own ``--kv-cache-memory-bytes``), when it has one.
    kv_cache_bytes: int
    #: What the engine kind's arithmetic planned for that budget (or the CPU build's VLLM_CPU_KVCACHE_SPACE).
    kv_plan: KvPlanData
    #: Under pytest-xdist: the lane (worker, GPU group, host) and block (one boot of every arm) it runs in.
    lane: int
    block: int
    gpus: str | None
    #: Why the boot never ran: its worker died while running the block (pytest-xdist).
    lost: str


class ProbeSpecData(TypedDict, total=False):
    """``ProbeSpec.to_dict`` (``run.json``'s ``probes``): lets a stored run re-render a user's probe."""

    name: str
    marker: str
    title: str
    metrics: list[str]
    primary_metric: str
    order: int
    point: str
    paired_by: list[str] | None
    paired_shapes: list[str] | None
    curve: list[str]
    curve_x: str | None
    exclude_first_point: bool
    markers: list[str]
    label: str
    trials: bool
    own_section: bool
    search: bool


class SettingsData(TypedDict, total=False):
    """``run.json``'s ``settings`` (``Settings.to_dict``) as a stored run's readers read them — the report,
    ``kvcache-report``, the run store — with their types; it holds more keys, which nothing reads back."""

    arms: list[ArmData]
    seed: int
    launcher: str
    engine_args: list[str]
    report_dir: str
    store: str | None
    noise: str | None
    compare: str | None
    save: str | None
    max_replicates: int | None
    host_cpu_action: str
    allow_diff: list[str]
    context_tokens: int | None
    context_source: str | None
    context_notes: list[str]
    fidelity_depths: list[int]
    fidelity_top_k: int
    fidelity_window: int
    slo: str | None
    capacity_depths: list[int]
    capacity_think_s: float
    capacity_window_s: float
    capacity_max_tokens: int
    capacity_max_sessions: int
    capacity_start: int
    capacity_trials: int
    cache_bytes: int | None


class ModelSize(TypedDict):
    """``run.json``'s ``model_size``: the served model's estimated parameter count (null: not known here) and where
    it came from (``config.resolve.served_parameters``). Absent from runs made before it was recorded."""

    parameters: int | None
    source: str


class RunMeta(TypedDict, total=False):
    """``run.json``: the run's settings, plan and versions (rewritten as the run progresses)."""

    schema_version: int
    run_id: str
    status: str
    started_unix_s: float
    updated_unix_s: float
    invocation: list[str]
    cwd: str
    model: str
    model_size: ModelSize
    settings: dict[str, Json]
    plan: list[PlanEntry]
    #: The controller's word on each lane of a pytest-xdist run (``Run.lane_report``).
    lanes: list[dict[str, Any]]
    probes: list[ProbeSpecData]
    versions: dict[str, str | None]
    benchmark_machine_info: Json
    reaped: list[str]
    problems: list[str]
    skipped: list[str]
    self_check: dict[str, Json] | None
    boots: dict[str, str | None]


# ------------------------------------------------------------------------------------------ readers

#: one ``name=value`` of a ``SpeculativeConfig(...)`` line
SPEC_FIELD = re.compile(r"(\w+)=('[^']*'|[^,)]+)")


def speculative(evidence: Evidence) -> str | None:
    """The speculative-decoding setup a boot resolved, in words: ``none``, ``ngram, 3 tokens``,
    ``mtp, 3 tokens, model /m`` — from the engine's config line, else its non-default args; None when
    neither says."""
    log = evidence.get("log") or {}
    text = log.get("speculative_config")
    fields: dict[str, object] = {}
    if text == "None":
        return "none"
    if isinstance(text, str):
        fields = {k: v.strip("'") for k, v in SPEC_FIELD.findall(text.removeprefix("SpeculativeConfig("))}
    else:
        args = log.get("non_default_args")
        found = args.get("speculative_config") if isinstance(args, dict) else None
        if isinstance(found, dict):
            fields = dict(found)
        elif isinstance(args, dict):
            return "none"  # the engine listed its non-default args and speculation is not among them
        else:
            return None
    method = fields.get("method") or "?"
    tokens = fields.get("num_spec_tokens", fields.get("num_speculative_tokens"))
    parts = [str(method)] + ([f"{tokens} tokens"] if tokens not in (None, "None") else [])
    model = fields.get("model")
    if model not in (None, "None", ""):
        parts.append(f"model {model}")
    return ", ".join(parts)


def resolved_cache_dtype(evidence: Evidence) -> str | None:
    """The KV-cache dtype the engine reports: the ``/metrics`` label first, else its startup log line."""
    cache = evidence.get("cache_config") or {}
    if cache.get("cache_dtype"):
        return str(cache["cache_dtype"])
    log = evidence.get("log") or {}
    value = log.get("kv_cache_dtype")
    return str(value) if value else None


def kv_max_concurrency(evidence: Evidence) -> float | None:
    """The engine's "Maximum concurrency for L tokens per request: X" (its startup log), or None."""
    value = (evidence.get("log") or {}).get("kv_max_concurrency")
    return float(value) if value is not None else None


def kv_capacity_tokens(evidence: Evidence) -> int | None:
    cache = evidence.get("cache_config") or {}
    raw = cache.get("kv_cache_size_tokens")
    if raw not in (None, "", "None"):
        try:
            return int(float(str(raw)))
        except ValueError:
            pass
    log = evidence.get("log") or {}
    value = log.get("kv_cache_size_tokens")
    return int(value) if value is not None else None
