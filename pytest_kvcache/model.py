"""The typed run model: what a run writes (records, evidence, boot plan, ``run.json``) and what the report
is made of (summary, deltas, crossovers, gates …). Plain Python, no pytest, no pandas.

These are ``TypedDict``s because every one of them is JSON on disk first: a stored run folder is read back
into exactly these shapes (``pytest_kvcache.report.load``), and ``report.json`` is a :class:`Report`
written out. Readers index them by key as before, but every key and value type is checked by mypy.

Versions: :data:`RECORD_SCHEMA_VERSION` is written into every record and ``run.json``;
:data:`REPORT_VERSION` into ``report.json``. A change that renames or removes a key bumps them.
"""

from __future__ import annotations

from typing import Any, Literal, TypedDict

RECORD_SCHEMA_VERSION = 1
REPORT_VERSION = 1

Verdict = Literal["better", "worse", "inconclusive"]
Outcome = Literal["pass", "fail", "inconclusive"]

#: A JSON value whose inside the report does not read (launcher facts, NVML tables …).
Json = str | int | float | bool | None | list["Json"] | dict[str, "Json"]


# ------------------------------------------------------------------------------------------ records


class SampleData(TypedDict, total=False):
    """:class:`~pytest_kvcache.client.Sample` as written (``Sample.to_dict``)."""

    ok: bool
    error_kind: str | None
    error: str | None
    http_status: int | None
    send_unix_s: float
    send_perf_s: float
    first_token_s: float | None
    last_token_s: float | None
    end_s: float | None
    chunks: int
    token_chunks: int
    prompt_tokens: int | None
    completion_tokens: int | None
    cached_tokens: int | None
    finish_reason: str | None
    token_clock: str | None
    content_chars: int
    text: str
    tool_calls: list[dict[str, str]]


class Record(TypedDict, total=False):
    """One line of ``requests.jsonl`` (docs/records.md). The first block is always there; the rest is the
    probe's context (``depth``, ``turn``, ``engine`` counter deltas, ``gpu`` window, ``cold_proof`` …)."""

    schema_version: int
    run_id: str
    arm: str
    boot: str
    replicate: int
    probe: str | None
    shape: str | None
    depth: int | None
    turn: int | None
    session: int | None
    phase: str | None
    index: int | None
    ok: bool
    flags: list[str]
    excluded_reason: str | None
    voided: dict[str, str]
    error_kind: str | None
    error: str | None
    metrics: dict[str, float | None]
    sample: SampleData
    test: str
    engine: dict[str, Json] | None
    gpu: dict[str, Json] | None
    host_cpu: dict[str, Json] | None
    cold_proof: Json
    prompt_sha256: str
    sizing: dict[str, Json]
    tool_call: dict[str, Json]
    streams: int
    concurrency: int
    #: the many-stream client's load over the trial (concurrency probe; `pytest_kvcache.fanout.ClientLoad`)
    client: dict[str, Json]
    #: the capacity probe's trial this turn belongs to: sessions, SLO, window, the engine's counters over the
    #: window (`report.capacity` reads it)
    capacity: dict[str, Json]


class AgreementRecord(TypedDict, total=False):
    """One line of ``agreement.jsonl``: greedy token ids of one unmeasured request."""

    arm: str | None
    boot: str
    replicate: int
    shape: str
    index: int
    test: str
    ok: bool
    ids: list[int]
    logprobs: list[float]
    #: the generated text (the report shows where two arms' greedy texts diverge)
    text: str
    error: str
    send_unix_s: float
    wall_s: float


class FidelityWindowData(TypedDict):
    """The positions one scored prompt keeps at one depth (``probes.fidelity.Window``)."""

    depth: int
    start: int
    ids: list[int]
    logprob: list[float]
    top_ids: list[list[int]]
    top_logprobs: list[list[float]]


class FidelityRecord(TypedDict, total=False):
    """One line of ``fidelity.jsonl``: one text scored teacher-forced on one boot (prompt logprobs)."""

    run_id: str
    arm: str
    boot: str
    replicate: int
    test: str
    text: str
    text_sha256: str
    ids_sha256: str
    prompt_tokens: int
    top_k: int
    window: int
    windows: list[FidelityWindowData]
    short_depths: list[int]
    engine: dict[str, Json] | None
    cold_proof: str
    flags: list[str]
    excluded_reason: str | None
    wall_s: float
    ok: bool
    error: str
    #: how it was scored when not by one prompt-logprobs request (llama-server: forced continuations)
    method: str


class SamplingRecord(TypedDict, total=False):
    """One line of ``sampling.jsonl``: why an adaptive loop (requests, or rounds of boots) stopped."""

    kind: str
    round: int
    rounds_done: int
    target_pct: float
    widest: dict[str, Json] | None
    decision: str
    reason: str
    boot: str
    arm: str
    test: str
    probe: str
    point: str


# ------------------------------------------------------------------------------------------ evidence


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


# ------------------------------------------------------------------------------------------ report


class SummaryRow(TypedDict, total=False):
    probe: str
    point: str
    metric: str
    arm: str
    n: int
    mean: float | None
    median: float | None
    std: float | None
    cv_pct: float | None
    min: float | None
    max: float | None
    excluded: int
    excluded_reasons: list[str]


class Comparison(TypedDict, total=False):
    """One ratio other/base of a metric at one point (``report.frame.compare``)."""

    baseline_value: float | None
    arm_value: float | None
    ratio: float | None
    delta_pct: float | None
    ci_low: float | None
    ci_high: float | None
    paired: bool
    ci_method: str
    n_baseline: int
    n_arm: int
    boots_baseline: int
    boots_arm: int
    direction: str
    verdict: Verdict
    #: a better/worse verdict from a within-boot CI: "N boot(s) per arm: within-boot CI only", else absent
    provisional: str
    #: a capacity search that never broke the SLO on a side: its capacity is a lower bound (report.capacity)
    censored: bool


class DeltaRow(Comparison, total=False):
    arm: str
    baseline: str
    probe: str
    point: str
    metric: str
    noise_pct: float | None
    verdict_note: str
    #: a within-boot delta: the default boot-to-boot band its verdict was judged with (SD of log boot means,
    #: percent) and the widened CI it was judged on (``report.bands.judge_deltas``)
    band_pct: float
    judged_ci: list[float]


class CrossoverRow(TypedDict, total=False):
    arm: str
    baseline: str
    probe: str
    metric: str
    axis: str
    xs: list[float]
    estimate: float | None
    ci_low: float | None
    ci_high: float | None
    statement: str
    #: "boots" (whole boots resampled, paired by block under pytest-xdist, as the deltas' CIs) or
    #: "within-boot" (samples within points, each resampled curve moved by a boot effect from the band).
    ci_method: str
    #: the share of resampled curves that cross 1 the same way as the estimate
    share: float
    points: int
    #: the points of the curve, by name (``4k``, ``turn3``), as the deltas name them
    point_names: list[str]
    #: within boots: the SD of the boot effect each resampled curve was moved by (percent)
    boot_sd_pct: float
    #: whether the data carry the crossing (a point on each side excludes parity, or share ≥ 95%), and why
    significant: bool
    evidence: str
    #: where points on each side exclude parity: the nearest such points on either side of the crossing
    #: (``ci_low``/``ci_high`` then hold them too)
    bracket: list[float]


class ResolvedArm(TypedDict):
    cache_dtype: str | None
    kv_cache_size_tokens: int | None
    attention_backend: str | None
    attention_candidates: list[str] | None
    engine_version: str | None
    max_model_len: int | None
    served_model: str | None
    ready_s: float | None
    status: str | None
    speculative: str | None  # "none", "ngram, 3 tokens" … (engines.evidence.speculative); None: not stated


class GpuCardSummary(TypedDict):
    index: int | None
    uuid: str | None
    name: str | None
    power_limit_before_w: float | None
    power_limit_after_w: float | None
    vram_ready_mib: int | None
    vram_before_stop_mib: int | None
    driver_version: str | None


class GpuSummary(TypedDict, total=False):
    gpu: bool
    reason: str | None
    cards: list[GpuCardSummary]
    changes: list[str]


class ArmEntry(TypedDict):
    name: str
    baseline: bool
    declared: ArmData
    resolved: ResolvedArm
    gpu: GpuSummary
    boots: list[str]
    evidence: dict[str, Evidence]


class BootEntry(TypedDict):
    position: int
    boot: str
    arm: str | None
    replicate: int
    extra: bool
    status: str
    skipped: str | None
    ready_s: float | None
    started_unix_s: float | None
    compile_s: float | None
    compile_cache: str | None
    init_engine_s: float | None


class BootResult(TypedDict):
    boot: str
    arm: str | None
    position: int
    probe: str
    point: str
    metric: str
    mean: float
    n: int


class CiStatement(TypedDict, total=False):
    boots_per_arm: dict[str, int]
    method: str
    order: list[str]
    text: str
    #: Under pytest-xdist: each lane's boots in the order it ran them (``lane N`` → boot ids).
    lane_order: dict[str, list[str]]


class BlockEntry(TypedDict):
    """One block of a pytest-xdist run (one boot of every arm on one lane) and where it ran."""

    block: int
    lane: int
    workers: list[str]
    host: str | None
    gpus: str | None
    gpu_models: list[str]
    driver: str | None
    engine_version: str | None
    boots: list[str]
    status: str


class Confound(TypedDict, total=False):
    path: str
    reference: str
    reference_value: Json
    boot: str
    value: Json
    why: str
    allowed_by: str


class Confounds(TypedDict, total=False):
    status: str
    reason: str
    reference: str | None
    compared: int
    confounds: list[Confound]
    declared: list[Confound]
    allowed: list[Confound]
    lines: list[str]


class AgreementRow(TypedDict, total=False):
    kind: str
    arm: str
    baseline: str
    shape: str
    pairs: int
    identical_share: float
    mean_first_divergence: float | None
    mean_abs_logprob_diff: float | None
    length: int


class AgreementSection(TypedDict):
    rows: list[AgreementRow]
    notes: list[str]


class SaturatedTrial(TypedDict):
    """A concurrency trial in which the many-stream client was saturated."""

    boot: str
    arm: str
    point: str
    trial: int
    reasons: list[str]


class ClientLoadSection(TypedDict):
    """How hard the many-stream client worked in the concurrency probe's measured trials (``client`` of
    their records): the worst figures, and the trials it was saturated in (excluded from every figure)."""

    trials: int
    processes_max: int
    cpu_share_max: float
    loop_lag_p99_max_s: float
    timer_lag_p99_max_s: float
    schedule_delay_max_s: float
    saturated: list[SaturatedTrial]


class SelfCheckSection(TypedDict, total=False):
    summary: str
    error: str
    measured_itl_s: float | None
    overhead_per_chunk_s: float | None
    warnings: list[str]


class GrowthVerdict(TypedDict, total=False):
    """One arm's agentic TTFT-growth verdict (``probes.agentic.growth_verdict``)."""

    arm: str
    verdict: str
    ttft_growth: float
    context_growth: float
    last_turn: int
    flags: dict[str, str]
    line: str


class AgenticTurn(TypedDict, total=False):
    arm: str
    turn: int
    sessions: int
    prompt_tokens: float | None
    cached_tokens: float | None
    ttft_s: float | None
    ttft_s_std: float | None
    decode_tps: float | None


class AgenticSection(TypedDict):
    turns: list[AgenticTurn]
    growth: list[GrowthVerdict]


class SpecDecodeRow(TypedDict):
    """Speculative decoding of one arm at one probe point, from the per-request ``/metrics`` deltas."""

    arm: str
    probe: str
    point: str
    requests: int
    drafts: int  # verification steps with a draft
    drafted: int  # draft tokens proposed
    accepted: int  # draft tokens accepted
    acceptance_pct: float  # 100 · accepted / drafted
    acceptance_length: float  # 1 + accepted / drafts (pooled)
    acceptance_length_mean: float | None  # mean of per-request acceptance lengths, with its CI
    ci_low: float | None
    ci_high: float | None
    per_position: list[float]  # accepted at draft position i / drafts (pooled), i = 1 … k


class SpecDecodeSection(TypedDict):
    rows: list[SpecDecodeRow]
    config: dict[str, str | None]  # arm → resolved setup ("ngram, 3 tokens", "none", None: not stated)
    line: str


class FidelityRow(TypedDict, total=False):
    """One arm against another at one depth: "between arms" (an arm vs the baseline, same replicate) or
    "across boots" (an arm's later boots vs its first: the measure's noise floor)."""

    kind: str
    arm: str
    baseline: str
    point: str
    depth: int
    texts: int
    boots: int
    positions: int
    blocks: int
    ci_method: str
    baseline_nll: float | None
    logprob_drift: float | None
    logprob_drift_ci: list[float | None]
    nll_delta: float | None
    nll_delta_ci: list[float | None]
    kl_topk: float | None
    kl_topk_ci: list[float | None]


class FidelitySection(TypedDict):
    config: dict[str, Json]
    rows: list[FidelityRow]
    notes: list[str]


class CapacityRow(TypedDict, total=False):
    """One arm's capacity at one depth (``report.capacity.section``)."""

    arm: str
    point: str
    depth: int
    boots: int
    capacity: float | None
    capacity_ci: list[float | None]
    censored: bool
    ratio: float | None
    ratio_ci: list[float | None]
    ci_method: str
    kv_tokens: int | None
    kv_budget_bytes: int | None
    trials: int
    #: the knee's cause read from the engine: "kv" (the prefix-cache hit rate fell past it), "compute", "unknown"
    knee_cause: str
    at_capacity: dict[str, float | None]
    first_broken: dict[str, Json]


class CapacityTrialRow(TypedDict, total=False):
    """One trial of a capacity search: its sessions, verdict and figures."""

    arm: str
    boot: str
    point: str
    depth: int
    trial: int
    sessions: int
    step: str
    verdict: str
    turns: int
    failed: int
    context_tokens: float | None
    ttft_p50_s: float | None
    ttft_p95_s: float | None
    itl_p50_s: float | None
    itl_p95_s: float | None
    goodput_tps: float | None
    goodput_ci: list[float | None]
    hit_rate: float | None
    hit_rate_source: str | None
    preemptions: int | None
    kv_usage_mean: float | None
    kv_usage_max: float | None
    excluded_reason: str | None
    broken: list[str]
    #: each SLO term's value over the trial (``{"ttft_p90": 0.38}``)
    slo_values: dict[str, float | None]


class CapacitySection(TypedDict):
    config: dict[str, Json]
    rows: list[CapacityRow]
    trials: list[CapacityTrialRow]
    notes: list[str]


class FlagSummary(TypedDict):
    samples: int
    kinds: list[str]


class NoiseBand(TypedDict):
    probe: str
    point: str
    metric: str
    band_pct: float


class NoiseSection(TypedDict):
    run: str
    bands: list[NoiseBand]
    missing: int


class SavedRow(Comparison, total=False):
    verdict_note: str
    probe: str
    point: str
    metric: str
    arm: str


class SavedSection(TypedDict):
    baseline_run: str | None
    path: str
    rows: list[SavedRow]
    warnings: list[str]


class GateEvidence(TypedDict, total=False):
    """What decided a gate (``report.gates.evaluate``), with its figures."""

    #: "boots" (3+ boots a side: the CI over boots), "noise run" (a stored A/A's band, --kv-noise), "default
    #: band" (the within-boot CI widened by the metric family's default boot-to-boot band), "within-boot"
    #: (no band for the platform), or "none" (no CI: no or too few samples)
    kind: str
    text: str
    boots_baseline: int
    boots_arm: int
    #: the within-boot CI before it was widened (noise run, default band)
    within_ci: list[float | None]
    band_pct: float
    platform: str
    family: str
    #: the default band: the standard deviation of log(one boot's mean), percent
    boot_sd_pct: float
    source: str


class _GateExtras(TypedDict, total=False):
    #: "boots", "within-boot" or "noise band" (the CI the outcome was judged on)
    ci_method: str
    evidence: GateEvidence
    #: an open gate: how many more boots per arm would likely decide it (None: not within 30)
    boots_to_decide: int | None


class GateResult(_GateExtras):
    """One evaluated gate (one point and arm pair of a ``--kv-fail`` expression)."""

    name: str
    gate: str
    outcome: Outcome
    value: float | None
    ci_low: float | None
    ci_high: float | None
    threshold: float
    op: str
    reason: str
    value_text: str
    ci_text: str
    threshold_text: str


class EnergyRow(TypedDict):
    """One arm's probe point and energy metric over its boots (``report.energy``)."""

    arm: str
    probe: str
    point: str
    metric: str
    window: str  # "decode", "prefill" or "trial" (a concurrency trial's span)
    boots: int
    boots_reported: int
    windows: int
    window_s: float | None
    joules: float | None
    tokens: float | None
    joules_per_token: float | None
    mean_power_w: float | None
    source: str | None
    step_s: float | None
    reason: str | None  # why boots were left out: "boot: reason; …"


class EnergySection(TypedDict):
    how: dict[str, Json]
    line: str | None
    rows: list[EnergyRow]
    not_reported: list[str]


class CostSection(TypedDict):
    """What the verdict cost (``report.cost``): device-seconds (``unit`` GPU-s; "s" of wall time without a GPU)."""

    unit: str
    cards: int
    wall_s: float
    total: float
    booting: float  # stops included
    stopping: float
    measuring: float
    waiting: float
    boots: int
    compile_cache_saved: float | None
    per_boot: list[dict[str, Json]]


class BandsUsed(TypedDict):
    platform: str
    families: dict[str, float]


class FailureRow(TypedDict):
    """Failed or excluded measured requests of one arm, probe and kind (an error kind or an exclusion)."""

    arm: str
    probe: str
    kind: str
    #: "failed" (the request did not complete) or "excluded" (measured, then left out)
    status: str
    count: int
    #: the points it removed every sample of (shown as failed in the tables), and the points it touched
    points_removed: list[str]
    points: list[str]
    first_message: str


class EmptyPoint(TypedDict):
    """A probe point of one arm whose measured requests all failed or were excluded: no valid sample."""

    probe: str
    point: str
    arm: str
    requests: int
    kinds: list[str]


class FailuresSection(TypedDict):
    failed: int
    excluded: int
    measured: int
    rows: list[FailureRow]
    empty_points: list[EmptyPoint]
    lines: list[str]


class Report(TypedDict, total=False):
    """``report.json``: a pure function of the loaded run folder, the gates, the noise run and the saved run."""

    #: Only in a pytest-xdist run: its blocks (see :class:`BlockEntry`).
    blocks: list[BlockEntry]

    report_version: int
    run_id: str | None
    status: str | None
    model: str | None
    versions: dict[str, str | None] | None
    seed: int
    probes: list[ProbeSpecData]
    arms: list[ArmEntry]
    boots: list[BootEntry]
    boot_results: list[BootResult]
    compile_cache: list[str]
    ci: CiStatement
    confounds: Confounds
    agreement: AgreementSection
    sampling: list[SamplingRecord]
    self_check: SelfCheckSection | None
    client_load: ClientLoadSection | None
    summary: list[SummaryRow]
    deltas: list[DeltaRow]
    crossovers: list[CrossoverRow]
    agentic: AgenticSection
    spec_decode: SpecDecodeSection
    fidelity: FidelitySection
    #: energy per token: how it was measured (``how``, ``line``) and per arm, probe, point and window (``rows``)
    energy: EnergySection
    #: what the verdict cost: device time, booting / measuring / waiting, the compile cache's saving
    cost: CostSection | None
    capacity: CapacitySection
    #: each arm's greedy texts against the baseline's, where they part (``report.greedy``)
    greedy: list[dict[str, Any]]
    #: what could not fit the context, and the agentic fixture used (``report.left_out``)
    left_out: dict[str, Any]
    flags: FlagSummary
    verdicts: list[str]
    notes: list[str]
    noise: NoiseSection
    compare: SavedSection
    gates: list[GateResult]
    #: the default boot-to-boot bands within-boot verdicts were judged with: platform, family → SD percent
    bands: BandsUsed
    #: every failed or excluded measured request, per arm × probe × kind (``report.failures``)
    failures: FailuresSection
