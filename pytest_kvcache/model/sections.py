"""The report's feature sections, as ``report.json`` holds them: speculative decoding, fidelity (and the
baseline's check) and capacity (its rows and trials). Part of the typed run model (:mod:`pytest_kvcache.model`)."""

from __future__ import annotations

from typing import TypedDict

from pytest_kvcache.model.base import Json


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
    acceptance_length_mean: float | None  # mean over prompts of each prompt's per-request acceptance lengths
    ci_low: float | None  # its CI: Student's t over the per-prompt means (acceptance is deterministic across boots)
    ci_high: float | None
    prompts: int  # the distinct prompts (a short shape: one; prefill: depth × index; agentic: session × turn)
    ci_basis: str  # "over prompts"
    ci_df: int | None  # prompts − 1; None without a CI
    no_ci: str | None  # why there is no CI: fewer than 3 prompts
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
    #: "texts": the CIs are over texts (each text's mean of its blocks, averaged over its boots; Student's t)
    ci_method: str
    #: what the CIs are over, in words: "over texts"
    ci_basis: str
    #: the t-interval's degrees of freedom (texts − 1); absent without a CI
    ci_df: int
    #: why there is no CI (fewer than 3 texts), absent when there is one
    no_ci: str
    #: each text's mean |Δ logprob| (its blocks' mean, averaged over its boots): what the CI is over
    per_text: dict[str, float]
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


class BaselineCheck(TypedDict):
    """Can the baseline arm judge quality? (``report.judging``): its figures, what they say, what was not checked."""

    baseline: str
    texts: list[str]
    nll: float | None
    vocab: int | None
    nll_share: float | None
    chars_per_token: float | None
    greedy: list[str]
    #: False: a check failed (``problems``); True: NLL against chance passed and nothing failed; None: not established
    can_judge: bool | None
    problems: list[str]
    unchecked: list[str]


class CapacityRow(TypedDict, total=False):
    """One arm's capacity at one depth (``report.capacity.section.section``)."""

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
    #: per boot: the last level that met the SLO, the first that broke it (None: none did) and the judged trials
    #: of each (level as text → trials)
    brackets: list[dict[str, Json]]
    #: the brackets in words: "met at 6, broke at 7; 2 trials each"
    bracket: str
    #: why the capacity (and its ratio) has no interval: a one-boot search whose knee or a level either side of
    #: it was tried fewer than 2 times; absent: it has one
    interval_note: str
    kv_tokens: int | None
    kv_budget_bytes: int | None
    trials: int
    #: the knee's cause read from the engine: "kv" (the prefix-cache hit rate fell past it), "compute", "unknown"
    #: (``report.capacity.section.knee_bound``: from the two knees and the hit rate's drop past the SLO's knee)
    knee_cause: str
    #: the cause in words: "KV (the cache holds 7 sessions)", "compute (the cache held them; …)"; "" unknown
    knee_bound: str
    #: the KV-residency knee: the largest level such that it and every level tried below it had a prefix-cache
    #: hit rate of at least half (mean over boots; None: no hit rate), its CI (tried levels only), whether no
    #: level's rate fell below half, its brackets (as ``brackets``: "met" the last level held, "broke" the first
    #: below half) and in words, its ratio to the baseline's (the ``kv_residency`` delta) and its CI
    residency: float | None
    residency_ci: list[float | None]
    residency_censored: bool
    residency_brackets: list[dict[str, Json]]
    residency_bracket: str
    residency_ratio: float | None
    residency_ratio_ci: list[float | None]
    #: why the residency knee has no interval (as ``interval_note``); absent: it has one
    residency_interval_note: str
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
