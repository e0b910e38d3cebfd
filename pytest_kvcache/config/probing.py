"""The probe and judging options: probe sizes (with the embedded CPU default's own), boots per arm and their
order, adaptive sampling, gates and stored baselines. Each field is one option's whole declaration
(``config/options.py``); :class:`~pytest_kvcache.config.settings.Settings` holds them with the serving options."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pytest_kvcache.config import values as v
from pytest_kvcache.config.constants import (
    CAPACITY_DEPTHS,
    CAPACITY_MAX_SESSIONS,
    CAPACITY_MAX_TOKENS,
    CAPACITY_THINK_S,
    CAPACITY_WINDOW_S,
    CPU_RETRIEVAL_DEPTHS,
    CPU_RETRIEVAL_NEEDLES,
    FIDELITY_DEPTHS,
    FIDELITY_TEXTS,
    GPU_SLO,
    RETRIEVAL_CEILING,
    RETRIEVAL_DEPTHS,
    RETRIEVAL_NEEDLES,
    RETRIEVAL_POSITIONS,
    SEED_DEPTHS,
    AgenticMode,
    Order,
    Sampling,
)
from pytest_kvcache.config.options import option
from pytest_kvcache.config.values import BLOCK_MIN


@dataclass(frozen=True)
class ProbeOptions:
    """What every boot runs and how the run is judged (a part of :class:`Settings`)."""

    warmups: int = option(
        help="unmeasured warmup requests per probe shape (default 3).",
        parse=v.count(0, v.MAX_WARMUPS),
        default=3,
        cpu_default=lambda m: m.warmups,
    )
    runs: int = option(
        help="measured requests per probe shape (default 5).",
        parse=v.count(1, v.MAX_RUNS),
        default=5,
        cpu_default=lambda m: m.runs,
    )
    max_tokens: int | None = option(
        help="override every short probe's max_tokens.",
        parse=v.count(1, v.MAX_TOKENS),
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
    seed: int = option(
        help="run seed: salts and ordering derive from it (default 0).", parse=v.count(0, v.MAX_SEED), default=0
    )
    depths: tuple[int, ...] = option(
        help="prefill depths in prompt tokens, 'k' = 1000 (default 10k,90k).",
        metavar="D1,D2",
        parse=v.depths,
        default=SEED_DEPTHS,
        cpu_default=lambda m: m.depths,
    )
    depth_warmups: int = option(
        help="unmeasured prefill requests per depth (default 1).", parse=v.count(0, v.MAX_WARMUPS), default=1
    )
    depth_runs: int = option(
        help="measured prefill requests per depth (default 3).", parse=v.count(1, v.MAX_RUNS), default=3
    )
    sessions: int = option(
        help="independent agentic sessions per arm (default 2).",
        parse=v.count(1, v.MAX_SESSIONS),
        default=2,
        cpu_default=lambda m: m.sessions,
    )
    turns: int | None = option(
        help="run only the first N turns of the agentic fixture (default: all).",
        parse=v.count(1, v.MAX_TURNS),
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
        parse=v.count(1, v.MAX_TOKENS),
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
    replicates: int = option(
        help=(
            "boots per arm (default 1). Each boot runs every selected probe; with 3 or more the report's CIs are "
            "computed over boots (boots, then samples within a boot)."
        ),
        parse=v.count(1, v.MAX_REPLICATES),
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
        parse=v.count(1, v.MAX_ADAPTIVE_RUNS),
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
    concurrency: tuple[int, ...] = option(
        help="simultaneous streams per level of the concurrency probe (default 1,4,16).",
        metavar="N1,N2",
        parse=v.levels,
        default=(1, 4, 16),
    )
    concurrency_max_tokens: int = option(
        help="max_tokens of each concurrency-probe stream (default 128).", parse=v.count(1, v.MAX_TOKENS), default=128
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
        help=(
            "the fidelity probe's committed texts, from prose, code, data, markup (default all four: its CIs are "
            "over texts, none with fewer than 3)."
        ),
        metavar="T1,T2",
        parse=v.texts,
        default=FIDELITY_TEXTS,
    )
    fidelity_top_k: int = option(
        "fidelity_topk",
        help="top-k logprobs per position for the fidelity probe's KL estimate; 0: none (default 5).",
        metavar="K",
        parse=v.count(0, v.MAX_TOP_K),
        default=5,
    )
    fidelity_window: int = option(
        help="positions scored before each fidelity depth (default 512).",
        parse=v.count(BLOCK_MIN, v.MAX_TOKENS),
        default=512,
        cpu_default=lambda m: m.fidelity_window,
    )
    retrieval_depths: tuple[int, ...] = option(
        help=(
            "the retrieval probe's depths in exact prompt tokens, 'k' = 1000 (default 8k,32k that fit and the "
            "model's own limit, which replaces a default within 10% below it; 1k,4k below the limit when only it "
            "is left; 1k,4k on the embedded CPU default)."
        ),
        metavar="D1,D2",
        parse=v.depths,
        default=RETRIEVAL_DEPTHS,
        cpu_default=lambda m: CPU_RETRIEVAL_DEPTHS,
    )
    retrieval_positions: tuple[float, ...] = option(
        help="where the asked needle sits, as percentages of the context (default 10,50,90).",
        metavar="P1,P2",
        parse=v.positions,
        default=RETRIEVAL_POSITIONS,
    )
    retrieval_needles: int = option(
        help=(
            "needles per cell (depth × position): 90 decide a 10-point loss (default 90; 4 on the embedded CPU "
            "default)."
        ),
        parse=v.count(1, 10_000),
        default=RETRIEVAL_NEEDLES,
        cpu_default=lambda m: CPU_RETRIEVAL_NEEDLES,
    )
    retrieval_form: str = option(
        help=(
            "recall (a completion ending with the needle's lead-in: base and small models) or question (a chat "
            "question: instruct models); default recall."
        ),
        metavar="FORM",
        parse=v.choice("recall", "question"),
        default="recall",
    )
    retrieval_keys: tuple[int, ...] = option(
        help=(
            "needles in each haystack, one asked: 1 (default) or K > 1 for the multi-key variant; several "
            "(1,4) run each variant on the same boot."
        ),
        metavar="K1,K2",
        parse=v.key_counts,
        default=(1,),
    )
    retrieval_haystack: str = option(
        help="texts (the committed prose and code, default) or filler (one repeated sentence).",
        metavar="KIND",
        parse=v.choice("texts", "filler"),
        default="texts",
    )
    retrieval_ceiling: float = option(
        help=(
            "a cell where the baseline finds fewer of its needles than this percentage cannot judge a KV dtype: no "
            "verdict, and a gate there is an error (default 80)."
        ),
        metavar="PCT",
        parse=v.share,
        default=RETRIEVAL_CEILING,
    )
    slo: str = option(
        help=(
            "the capacity probe's latency SLO over a trial's measured turns, e.g. ttft_p95<=2s,itl_p95<=60ms (default"
            " that; ttft_p95<=200ms,itl_p95<=100ms on the embedded CPU default)."
        ),
        metavar="TERMS",
        parse=v.slo,
        default=GPU_SLO,
        cpu_default=lambda m: m.capacity_slo,
    )
    capacity_depths: tuple[int, ...] = option(
        help=(
            "the capacity probe's session contexts in tokens, 'k' = 1000 (default 16k,32k; 2k,4k on the embedded CPU "
            "default)."
        ),
        metavar="D1,D2",
        parse=v.depths,
        default=CAPACITY_DEPTHS,
        cpu_default=lambda m: m.capacity_depths,
    )
    capacity_think_s: float = option(
        "capacity_think",
        help=(
            "mean think time between a session's turns, in seconds (each drawn uniform 0.5–1.5 × it; default 2, 1 on "
            "the embedded CPU default)."
        ),
        parse=v.positive,
        default=CAPACITY_THINK_S,
        cpu_default=lambda m: m.capacity_think_s,
    )
    capacity_window_s: float = option(
        "capacity_window",
        help=(
            "seconds each capacity trial is measured for, after its sessions are warm (default 30; 5 on the embedded "
            "CPU default)."
        ),
        parse=v.positive,
        default=CAPACITY_WINDOW_S,
        cpu_default=lambda m: m.capacity_window_s,
    )
    capacity_max_tokens: int = option(
        help="tokens each capacity turn decodes (default 64; 16 on the embedded CPU default).",
        parse=v.count(1, v.MAX_TOKENS),
        default=CAPACITY_MAX_TOKENS,
        cpu_default=lambda m: m.capacity_max_tokens,
    )
    capacity_max_sessions: int = option(
        help="the most concurrent sessions the capacity search tries (default 256; 32 on the embedded CPU default).",
        parse=v.count(1, v.MAX_CAPACITY_SESSIONS),
        default=CAPACITY_MAX_SESSIONS,
        cpu_default=lambda m: m.capacity_max_sessions,
    )
    capacity_start: int = option(
        help="the capacity search's first number of sessions (default 1).",
        parse=v.count(1, v.MAX_CAPACITY_SESSIONS),
        default=1,
    )
    capacity_trials: int = option(
        help=(
            "trials of the capacity's knee and of the levels either side of it, each judged over all its trials' "
            "turns, before the report prints an interval (default 2; 1: the search alone, no interval at one boot)."
        ),
        parse=v.count(1, v.MAX_CAPACITY_TRIALS),
        default=2,
    )
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
