"""vLLM (``--kv-engine=vllm``, the default): its profile, KV dtypes, command line, log parser and counters."""

from __future__ import annotations

import ast
import math
import os
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from pytest_kvcache.config.arms import Arm
from pytest_kvcache.config.settings import Settings
from pytest_kvcache.engines.kinds import vllm_kv
from pytest_kvcache.engines.kinds.base import (
    Command,
    Container,
    EngineProfile,
    Kind,
    has_flag,
    register_kind,
)
from pytest_kvcache.engines.kinds.folder import embedded_vllm_model
from pytest_kvcache.engines.scoring import PromptClient, PromptScorer, PromptScores
from pytest_kvcache.model.evidence import LogFacts

if TYPE_CHECKING:
    from pytest_kvcache.config.budget import Need
    from pytest_kvcache.config.kv_layout import KvPlan
    from pytest_kvcache.config.plan import Boot

VLLM = EngineProfile(
    kind="vllm",
    title="vLLM",
    tokens="vllm",
    evidence_paths=("/version", "/v1/models", "/metrics"),
    usage_clock=True,
    exact_length=True,
    token_ids=True,
    prompt_logprobs=True,
    headers_at_once=True,
)

#: What the embedded tiny CPU model needs: random weights, no torch.compile (boot ~50 s, not ~100 s). Each
#: embedded model's own are in ``config/embedded.py`` (``vllm_args``).
EMBEDDED_ARGS: tuple[str, ...] = ("--load-format", "dummy", "--enforce-eager")
#: vLLM's CPU build sizes its KV cache from this (GiB); without it startup can fail on a small machine.
EMBEDDED_ENV: dict[str, str] = {"VLLM_CPU_KVCACHE_SPACE": "2", "HF_HUB_OFFLINE": "1"}
#: Host environment variables vLLM's container is passed into containers.
PASSTHROUGH_PREFIXES = ("NCCL_", "VLLM_", "PYTORCH_", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "OMP_")
#: Where a model folder is mounted inside a container.
CONTAINER_MODEL = "/model"
#: Where vLLM keeps its torch.compile cache inside a container (``VLLM_CACHE_ROOT``'s default for root).
CONTAINER_VLLM_CACHE = "/root/.cache/vllm"


#: What measurement needs from every engine: cached-token counts in ``usage``.
MEASUREMENT_ARGS: tuple[str, ...] = ("--enable-prompt-tokens-details",)

#: vLLM's Prometheus names: the counters read around each request (name in records → sample name), the one
#: that moves when a request finished, accepted draft tokens per position, and its cache-config info gauge.
ENGINE_COUNTERS: Mapping[str, str] = {
    "prefix_cache_queries": "vllm:prefix_cache_queries_total",
    "prefix_cache_hits": "vllm:prefix_cache_hits_total",
    "prompt_tokens": "vllm:prompt_tokens_total",
    "generation_tokens": "vllm:generation_tokens_total",
    "engine_ttft_s": "vllm:time_to_first_token_seconds_sum",
    "engine_prefill_s": "vllm:request_prefill_time_seconds_sum",
    "engine_decode_s": "vllm:request_decode_time_seconds_sum",
    "engine_queue_s": "vllm:request_queue_time_seconds_sum",
    "preemptions": "vllm:num_preemptions_total",
    "spec_drafts": "vllm:spec_decode_num_drafts_total",
    "spec_draft_tokens": "vllm:spec_decode_num_draft_tokens_total",
    "spec_accepted_tokens": "vllm:spec_decode_num_accepted_tokens_total",
}
REQUEST_SUCCESS = "vllm:request_success_total"
SPEC_PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
CACHE_CONFIG_INFO = "vllm:cache_config_info"

#: vLLM's KV budget: the flag that sizes its KV cache in bytes (``--kv-cache-bytes`` passes it), and the variable
#: its CPU build sizes the cache from (whole GiB), which overrides the flag there.
BUDGET_FLAG = "--kv-cache-memory-bytes"
CPU_SPACE_ENV = "VLLM_CPU_KVCACHE_SPACE"


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


def default_engine_cmd() -> tuple[str, ...]:
    # ``python -m`` works for vLLM's CPU build (whose ``vllm`` console script is broken) and GPU installs.
    return (sys.executable, "-m", "vllm.entrypoints.openai.api_server")


def build_engine_args(settings: Settings, arm: Arm, model: str) -> tuple[list[str], dict[str, str]]:
    """The engine arguments (without command, host and port) and the env overrides for one arm.

    Order: model, embedded defaults, measurement needs, the arm's dtype, ``--kv-engine-args``, the arm's
    own args — later arguments win in vLLM's parser, so users can override anything we add.
    """
    user_args = (*settings.engine_args, *arm.args)
    args: list[str] = ["--model", model]
    env: dict[str, str] = {}
    budget = settings.kv_budget(arm)
    if settings.embedded:
        dtype = settings.embedded_dtype
        args += [*(("--dtype", dtype) if dtype else ()), *settings.embedded_spec.vllm_args]
        # a KV budget (--kv-cache-memory-bytes) is overridden by VLLM_CPU_KVCACHE_SPACE on the CPU build
        embedded = {k: v for k, v in EMBEDDED_ENV.items() if not (budget is not None and k == CPU_SPACE_ENV)}
        env.update({k: v for k, v in embedded.items() if k not in os.environ})
    if settings.cache_bytes is not None and not has_flag(user_args, BUDGET_FLAG):
        args += [BUDGET_FLAG, str(settings.cache_bytes)]
    for flag in MEASUREMENT_ARGS:
        if not has_flag(user_args, flag) and not has_flag(user_args, flag.replace("--", "--no-", 1)):
            args.append(flag)
    if arm.kv_cache_dtype is not None and not has_flag(user_args, "--kv-cache-dtype"):
        args += ["--kv-cache-dtype", arm.kv_cache_dtype]
    args += user_args
    if settings.compile_cache == "off":
        env["VLLM_DISABLE_COMPILE_CACHE"] = "1"
    elif settings.compile_cache != "auto" and settings.launcher != "docker":  # docker mounts it instead
        env["VLLM_CACHE_ROOT"] = settings.compile_cache
    env.update(dict(arm.env))
    return args, env


BACKEND = re.compile(r"Using (\S+) attention backend out of potential backends: \[([^\]]*)\]")
ENGINE_INIT = re.compile(r"Initializing a V1 LLM engine \(v([^)]+)\) with config: (.*)")
KV_DTYPE_IN_CONFIG = re.compile(r"\bkv_cache_dtype=([A-Za-z0-9_]+)")
KV_SIZE = re.compile(r"\b(GPU|CPU|XPU|TPU)(?: \+ host)? KV cache size: ([\d,]+) tokens")
#: on the KV size line (vLLM 0.32), or a line of its own (earlier V1 versions)
MAX_CONCURRENCY = re.compile(r"Maximum concurrency for ([\d,]+) tokens per request: ([\d.]+)x")
NON_DEFAULT_ARGS = re.compile(r"non-default args: (\{.*\})\s*$")
SPEC_IN_CONFIG = re.compile(r"\bspeculative_config=(None|SpeculativeConfig\([^)]*\))")
# torch.compile and its cache (vLLM 0.10–0.25 wordings: "took"/"takes", shapes or compile ranges).
COMPILE_TOTAL = re.compile(r"torch\.compile take[sn]? ([\d.]+) s in total|torch\.compile took ([\d.]+) s in total")
COMPILE_HIT = re.compile(r"Directly load (?:the compiled graph\(s\)|AOT compilation)")
COMPILE_MISS = re.compile(r"Compiling a graph for .* takes? [\d.]+ s")
INIT_ENGINE = re.compile(r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+) s")
GRAPH_CAPTURE = re.compile(r"Graph capturing finished in ([\d.]+) secs?")


def parse_log(text: str) -> LogFacts:
    """The facts an engine log states about itself (vLLM V1 line formats; absent facts are omitted)."""
    found: dict[str, Any] = {}
    compiled: set[str] = set()  # "hit" / "miss" lines of torch.compile's cache
    for line in text.splitlines():
        if m := BACKEND.search(line):
            found["attention_backend"] = m.group(1)
            found["attention_candidates"] = [c.strip().strip("'\"") for c in m.group(2).split(",") if c.strip()]
        elif m := ENGINE_INIT.search(line):
            found["engine_version"] = m.group(1)
            if d := KV_DTYPE_IN_CONFIG.search(m.group(2)):
                found["kv_cache_dtype"] = d.group(1)
            if d := SPEC_IN_CONFIG.search(m.group(2)):
                found["speculative_config"] = d.group(1)
        elif m := KV_SIZE.search(line):
            found["kv_cache_device"] = m.group(1)
            found["kv_cache_size_tokens"] = int(m.group(2).replace(",", ""))
            if c := MAX_CONCURRENCY.search(line):
                found["kv_concurrency_len"] = int(c.group(1).replace(",", ""))
                found["kv_max_concurrency"] = float(c.group(2))
        elif m := MAX_CONCURRENCY.search(line):
            found["kv_concurrency_len"] = int(m.group(1).replace(",", ""))
            found["kv_max_concurrency"] = float(m.group(2))
        elif m := NON_DEFAULT_ARGS.search(line):
            raw = m.group(1)
            try:
                found["non_default_args"] = ast.literal_eval(raw)
            except (ValueError, SyntaxError):
                found["non_default_args"] = raw
        elif m := COMPILE_TOTAL.search(line):
            found["compile_s"] = float(m.group(1) or m.group(2))
        elif COMPILE_HIT.search(line):
            compiled.add("hit")
        elif COMPILE_MISS.search(line):
            compiled.add("miss")
        elif m := INIT_ENGINE.search(line):
            found["init_engine_s"] = float(m.group(1))
        elif m := GRAPH_CAPTURE.search(line):
            found["graph_capture_s"] = float(m.group(1))
    if compiled:  # both: some graphs loaded, others compiled (e.g. a new compile range)
        found["compile_cache"] = "partial" if len(compiled) == 2 else compiled.pop()
    return cast(LogFacts, found)


def compile_cache_mount(settings: Settings) -> tuple[Path, str] | None:
    """The host folder mounted as the container's vLLM cache, so every boot's engine finds the graphs the
    first one compiled: ``--kv-compile-cache=DIR``, or ``~/.cache/vllm`` for ``auto``; none for ``off``."""
    if settings.compile_cache == "off":
        return None
    host = Path("~/.cache/vllm").expanduser() if settings.compile_cache == "auto" else Path(settings.compile_cache)
    try:
        host.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None  # an unwritable home: the container keeps its own (per-boot) cache
    return host, CONTAINER_VLLM_CACHE


# ------------------------------------------------------------------------------------------ fidelity scoring


def payload(model: str, ids: Sequence[int], top_k: int) -> dict[str, Any]:
    """A non-streamed completion over ``ids`` that returns every prompt position's logprobs (and top-k)."""
    return {
        "model": model,
        "prompt": list(ids),
        "max_tokens": 1,
        "temperature": 0.0,
        "prompt_logprobs": top_k,
        "stream": False,
    }


def parse_prompt_logprobs(body: Any, ids: Sequence[int], top_k: int) -> list[tuple[float, list[tuple[int, float]]]]:
    """Per prompt position p ≥ 1: (logprob of ``ids[p]``, [(id, logprob) of the top-k by rank]).

    vLLM answers ``choices[0].prompt_logprobs``: ``None`` for position 0, then one ``{"<id>": {"logprob",
    "rank", …}}`` per position, holding the actual token and the top-k. ValueError says what is missing.
    """
    try:
        entries = body["choices"][0]["prompt_logprobs"]
    except (KeyError, IndexError, TypeError):
        raise ValueError(
            "the response carries no choices[0].prompt_logprobs (the engine ignored prompt_logprobs)"
        ) from None
    if not isinstance(entries, list):
        raise ValueError("choices[0].prompt_logprobs is not a list (the engine ignored prompt_logprobs)")
    if len(entries) != len(ids):
        raise ValueError(f"{len(entries)} prompt_logprobs entries for a prompt of {len(ids)} tokens")
    found: list[tuple[float, list[tuple[int, float]]]] = []
    for p in range(1, len(ids)):
        entry = entries[p]
        if not isinstance(entry, dict):
            raise ValueError(f"prompt_logprobs[{p}] is not an object")
        ranked: list[tuple[int, int, float]] = []
        actual: float | None = None
        for key, value in entry.items():
            try:
                token = int(key)
                logprob = float(value["logprob"]) if isinstance(value, dict) else float(value)
            except (TypeError, ValueError, KeyError):
                raise ValueError(
                    f"prompt_logprobs[{p}] has an entry {key!r} that is not '<token id>: logprob'"
                ) from None
            rank = value.get("rank") if isinstance(value, dict) else None
            if token == ids[p]:
                actual = logprob
            if isinstance(rank, int) and 1 <= rank <= top_k:
                ranked.append((rank, token, logprob))
        if actual is None:
            raise ValueError(f"prompt_logprobs[{p}] lacks the prompt's own token {ids[p]}")
        if not math.isfinite(actual):
            raise ValueError(f"prompt_logprobs[{p}]: the prompt's own token {ids[p]} has logprob {actual}")
        ranked.sort()
        found.append((actual, [(token, lp) for _, token, lp in ranked[:top_k]]))
    return found


class PromptLogprobs(PromptScorer):
    """vLLM scores a whole prompt in one request: ``/v1/completions`` over the token ids with ``prompt_logprobs``
    (measured: its wall time and the engine's counters around it)."""

    def tokenize(self, client: PromptClient, model: str, text: str) -> list[int]:
        body = {"model": model, "prompt": text, "add_special_tokens": False}
        return [int(t) for t in client.post_json("/tokenize", body)["tokens"]]

    def score(self, client: PromptClient, model: str, ids: Sequence[int], top_k: int, timeout_s: float) -> PromptScores:
        body, wall_s, engine = client.post_measured("/v1/completions", payload(model, ids, top_k), timeout_s)
        rows = parse_prompt_logprobs(body, ids, top_k)
        return PromptScores(lambda position: rows[position - 1], wall_s=wall_s, engine=engine)

    def greedy(self, client: PromptClient, model: str, ids: Sequence[int], tokens: int) -> str:
        body = {"model": model, "prompt": list(ids), "max_tokens": tokens, "temperature": 0.0, "stream": False}
        return str(client.post_json("/v1/completions", body)["choices"][0]["text"])


@register_kind("vllm")
class VllmKind(Kind):
    """vLLM's OpenAI server: every vLLM request field, its ``/tokenize``, ``/metrics`` and V1 log lines."""

    profile = VLLM
    dtype_aliases = ALIASES
    dtypes = KV_CACHE_DTYPES
    cpu_dtypes = CPU_KV_CACHE_DTYPES
    half_kv_on_float32 = HALF_KV_ON_FLOAT32
    launchers = ("process", "docker", "external")
    needs_cmd = False
    budget_flag = BUDGET_FLAG
    budget_env = (CPU_SPACE_ENV,)
    embedded_dtype = True
    cpu_build = True
    counters = ENGINE_COUNTERS
    request_success = REQUEST_SUCCESS
    spec_per_position = SPEC_PER_POSITION
    cache_config_info = CACHE_CONFIG_INFO
    score_prompt = PromptLogprobs()

    def command(self, settings: Settings, boot: Boot, log_path: Path) -> Command:
        model = embedded_vllm_model(settings)
        args, env = build_engine_args(settings, boot.arm, model)
        return settings.engine_cmd or default_engine_cmd(), args, env

    def parse_log(self, text: str) -> LogFacts:
        return parse_log(text)

    def container(self, settings: Settings, boot: Boot) -> Container:
        """vLLM in its container: the model folder mounted at ``/model`` (the embedded one, or ``--kv-model``'s
        folder; a hub id comes from the mounted HF cache), the engine arguments as for a process, the variables vLLM
        and its libraries read (a container inherits none), and the torch.compile cache shared between boots."""
        model_mount = None
        if settings.model is None:
            model, model_mount = CONTAINER_MODEL, (embedded_vllm_model(settings), CONTAINER_MODEL)
        elif Path(settings.model).is_dir():
            model, model_mount = CONTAINER_MODEL, (settings.model, CONTAINER_MODEL)
        else:
            model = settings.model
        args, env_overrides = build_engine_args(settings, boot.arm, model)
        passthrough = {k: v for k, v in os.environ.items() if k.startswith(PASSTHROUGH_PREFIXES)}
        embedded_env = dict(EMBEDDED_ENV) if settings.embedded else {}
        if settings.kv_budget(boot.arm) is not None:  # it would override the budget on vLLM's CPU build
            passthrough.pop(CPU_SPACE_ENV, None)
            embedded_env.pop(CPU_SPACE_ENV, None)
        env = {**passthrough, **embedded_env, **env_overrides}
        return Container(args, env, model_mount=model_mount, compile_cache=compile_cache_mount(settings))

    def kv_plan(self, settings: Settings, arm: Arm, found: Need, budget: int | None) -> KvPlan | None:
        """vLLM's own arithmetic (``vllm_kv``): its groups, blocks and windows for the arm's arguments, on the CPU
        build (the embedded default, or the ``vllm-cpu`` this Python runs) or a CUDA build. Without a budget, the
        CPU build's ``VLLM_CPU_KVCACHE_SPACE`` (the embedded default's 2 GiB) is the budget; elsewhere vLLM sizes
        its KV cache from free memory after the boot, and nothing is planned."""
        if found.shape is None:
            return None
        cpu = serves_on_cpu(settings)
        if budget is None:
            budget = cpu_space_bytes(settings, arm) if cpu else None
        if budget is None:
            return None
        env = {**os.environ, **dict(arm.env)}
        knobs = vllm_kv.knobs(found.args, found.shape, found.max_model_len, cpu=cpu, env=env)
        return vllm_kv.plan(found.shape, found.element, budget, found.max_model_len, knobs, kv_dtype=found.kv_dtype)


def serves_on_cpu(settings: Settings) -> bool:
    """The arms run on vLLM's CPU build: the embedded default started by the plugin's own command (not an external
    server, not ``--kv-engine-cmd``), or ``--kv-model`` started by the process launcher with this Python's vLLM when
    that is the CPU build (``vllm-cpu``). Otherwise a CUDA build's defaults are assumed (and said)."""
    if settings.launcher == "external" or settings.engine_cmd:
        return False
    return settings.embedded or (settings.launcher == "process" and vllm_kv.cpu_build_installed())


def cpu_space_bytes(settings: Settings, arm: Arm) -> int | None:
    """The CPU build's KV cache without a budget: ``VLLM_CPU_KVCACHE_SPACE`` GiB — the arm's, the environment's, or
    the embedded default's (2); None when none is set."""
    raw = dict(arm.env).get(CPU_SPACE_ENV) or os.environ.get(CPU_SPACE_ENV)
    if raw is None and settings.embedded:
        raw = EMBEDDED_ENV[CPU_SPACE_ENV]
    try:
        return int(raw) * 2**30 if raw else None
    except ValueError:
        return None
