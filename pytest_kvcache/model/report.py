"""What ``report.json`` is made of: summary rows, deltas, crossovers, gates and every section of a
:class:`Report`."""

from __future__ import annotations

from typing import Any, TypedDict

from pytest_kvcache.model.base import Json, Outcome, Verdict
from pytest_kvcache.model.evidence import ArmData, Evidence, ProbeSpecData
from pytest_kvcache.model.records import SamplingRecord
from pytest_kvcache.model.sections import BaselineCheck, CapacitySection, FidelitySection, SpecDecodeSection


class PointOfArm(TypedDict):
    """One probe × point × metric × arm: its sample count and mean."""

    probe: str
    point: str
    metric: str
    arm: str
    n: int
    mean: float | None


class SummaryRow(PointOfArm, total=False):
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
    #: over boots: the degrees of freedom of the t-interval (blocks − 1, or Welch's on the log boot means;
    #: ``stats.ratio_df_boots``), so a p-value is the same test's; absent for a bootstrap interval
    ci_df: float
    #: a better/worse verdict from a within-boot CI: "N boot(s) per arm: within-boot CI only", else absent
    provisional: str
    #: a capacity search that never broke the SLO on a side: its capacity is a lower bound (report.capacity)
    censored: bool
    #: a metric deterministic across boots and repeats (acceptance): the prompts its CI is over (``ci_method``
    #: "prompts", report.frame.compare_over_prompts; why it has none is in ``ci_note``)
    prompts: int
    #: why a comparison has no CI although both sides have a value: a capacity whose one-boot search did not try
    #: the knee and the levels either side of it twice each (report.capacity.statistics.unmeasured)
    ci_note: str
    #: the pooled SD of log(boot mean) within each side and its degrees of freedom (2+ boots on a side)
    boot_sd: float
    boot_df: int
    #: valid compared samples that saw the host busy (``host_cpu_busy``)
    host_busy: int


class SpreadInfo(TypedDict):
    kind: str
    sd_pct: float | None
    df: float | None
    text: str


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
    #: the spread the within-boot verdict was judged with (``report.spread``): its kind ("default band",
    #: "run's boots", "noise run", "widest", "none"), SD percent, t degrees of freedom (null: normal) and words
    spread: SpreadInfo
    #: H0 ratio = 1, from the interval the verdict is decided on (``report.multiplicity``); Holm-adjusted within
    #: the (arm, probe) family of ``family_size`` comparisons (its points and metrics)
    p_value: float
    p_holm: float
    family_size: int
    #: written to ``report.json`` only (``report.deciding``): the ratio interval the verdict was taken on
    #: (``judged_ci`` where the within-boot CI was widened by a spread, else ``ci_low``/``ci_high``; None without a
    #: CI) and what it is: "boots", "blocks", "within-boot" or "within-boot widened by " and the spread's words
    decided_ci: list[float] | None
    ci_basis: str


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
    #: the agentic probe: how many sessions the curve's turns come from (one: a turn is its content and its
    #: depth at once, so turns are named, not a crossover in prompt tokens)
    sessions: int
    #: within boots: the SD of the boot effect each resampled curve was moved by (percent)
    boot_sd_pct: float
    #: whether the data carry the crossing (a point on each side excludes parity after Holm; the share alone
    #: never does), and why
    significant: bool
    evidence: str
    #: where points on each side exclude parity: the nearest such points on either side of the crossing
    #: (``ci_low``/``ci_high`` then hold them too)
    bracket: list[float]


class KvPlanRow(TypedDict):
    """One arm's KV cache as planned before its boot (the engine kind's arithmetic, ``run.json``'s
    ``plan[].kv_plan``) beside what the engine reported at its first boot (``report.kv_plan``)."""

    arm: str
    boot: str | None
    #: the served model's KV layout in words
    layout: str
    max_model_len: int | None
    budget_bytes: int | None
    #: "KV cache size: N tokens": planned (null: not modelled) and reported (null: not reported)
    planned_tokens: int | None
    reported_tokens: int | None
    #: reported / planned − 1, in percent
    diff_pct: float | None
    #: "Maximum concurrency for max_model_len tokens per request": planned and reported
    planned_concurrency: float | None
    reported_concurrency: float | None
    #: the engine's grouping, the settings the plan rests on, and why there is no planned figure
    groups: str
    assumptions: str
    not_modelled: str
    #: the flagged line when plan and engine differ by more than 2% (None: within it, or nothing to compare)
    flag: str | None


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


class FlagSummary(TypedDict):
    samples: int
    kinds: list[str]


class NoiseBand(TypedDict):
    probe: str
    point: str
    metric: str
    #: the A/A's σ̂ of log boot means (percent) and its degrees of freedom (``report.judge.noise_bands``)
    band_pct: float
    df: float


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

    #: "boots" (3+ boots a side: the CI over boots), else the spread the within-boot CI was widened with
    #: (``report.spread``): "noise run" (a stored A/A, --kv-noise), "run's boots" (this run's, from 2 boots on a
    #: side), "default band" (the metric family's), "widest" (the widest spread measured on any host: a compared
    #: sample saw the host busy), "no band" (none: no interval); "prompts" (acceptance: the CI over prompts, none
    #: with fewer than 3, ``report.frame.compare_over_prompts``); "texts" (a fidelity gate: the CI over texts, none
    #: with fewer than 3, ``report.fidelity``); or "none" (no CI: no or too few samples)
    kind: str
    text: str
    boots_baseline: int
    boots_arm: int
    #: a fidelity gate: the texts its CI is over (``df`` = texts − 1 with 3 or more)
    texts: int
    #: the within-boot CI before it was widened (noise run, default band)
    within_ci: list[float | None]
    band_pct: float
    platform: str
    family: str
    #: the spread the within-boot CI was widened with: the standard deviation of log(one boot's mean), percent,
    #: and the degrees of freedom of its t quantile (absent: the normal one)
    boot_sd_pct: float
    df: float
    source: str
    #: a within-boot CI: whether the gate would FAIL even widened by the widest spread measured on any host
    #: (``report.spread.widest``): only then may an interim adaptive look stop a run on that FAIL
    beyond_widest: bool


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


class BandsUsed(TypedDict, total=False):
    platform: str
    #: default band family → its SD percent, where a within-boot delta was judged with it
    families: dict[str, float]
    #: every kind of spread the within-boot deltas were judged with → its source in words (``report.spread``)
    spreads: dict[str, str]
    #: valid measured samples of the run that saw the host busy (``host_cpu_busy``): one-boot comparisons of a run
    #: with any are judged with the widest spread
    host_busy: int
    #: why the run is not the case the default bands were measured on (its model's size class, or an unknown
    #: size): one-boot comparisons of it are judged with the widest spread (absent: it is)
    unlike: str


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
    #: can the baseline arm judge quality at all (present where a quality probe ran; ``report.judging``)
    baseline_check: BaselineCheck
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
    #: each arm's KV tokens and concurrency, planned before the boot and reported by the engine (``report.kv_plan``)
    kv_plan: list[KvPlanRow]
