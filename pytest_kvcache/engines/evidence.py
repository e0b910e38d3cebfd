"""Evidence of what an engine really is: ``/version``, ``/v1/models``, ``/metrics`` and its log lines."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any, cast

import httpx

from pytest_kvcache import metrics
from pytest_kvcache.engines.profiles import VLLM, EngineProfile
from pytest_kvcache.model import Evidence, LogFacts
from pytest_kvcache.model.evidence import SPEC_FIELD as SPEC_FIELD
from pytest_kvcache.model.evidence import kv_capacity_tokens as kv_capacity_tokens
from pytest_kvcache.model.evidence import resolved_cache_dtype as resolved_cache_dtype
from pytest_kvcache.model.evidence import speculative as speculative

BACKEND = re.compile(r"Using (\S+) attention backend out of potential backends: \[([^\]]*)\]")
ENGINE_INIT = re.compile(r"Initializing a V1 LLM engine \(v([^)]+)\) with config: (.*)")
KV_DTYPE_IN_CONFIG = re.compile(r"\bkv_cache_dtype=([A-Za-z0-9_]+)")
KV_SIZE = re.compile(r"\b(GPU|CPU|XPU|TPU) KV cache size: ([\d,]+) tokens")
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


def _get(client: httpx.Client, path: str) -> tuple[Any, str | None]:
    try:
        response = client.get(path)
        if response.status_code != 200:
            return None, f"HTTP {response.status_code}"
        return (response.text if path == "/metrics" else response.json()), None
    except (httpx.HTTPError, ValueError) as exc:
        return None, f"{type(exc).__name__}: {exc}"


def collect(url: str, log_path: Path | None, timeout_s: float = 10.0, profile: EngineProfile = VLLM) -> Evidence:
    """Ask the server what it is, on the endpoints its profile has. Never raises: a missing endpoint is
    recorded as an error string, and what this kind of server cannot show is listed in ``evidence_missing``."""
    evidence: dict[str, Any] = {"url": url, "engine_kind": profile.kind}
    errors: dict[str, str] = {}
    paths = profile.evidence_paths
    with httpx.Client(base_url=url, timeout=timeout_s) as client:
        if "/version" in paths:
            version, err = _get(client, "/version")
            if err:
                errors["/version"] = err
            elif isinstance(version, dict):
                evidence["engine_version"] = version.get("version")
        if "/props" in paths:
            _llamacpp_props(client, evidence, errors)
        models, err = _get(client, "/v1/models")
        if err:
            errors["/v1/models"] = err
        elif isinstance(models, dict) and models.get("data"):
            first = models["data"][0]
            evidence["served_model"] = first.get("id")
            evidence["model_root"] = first.get("root")
            evidence["max_model_len"] = first.get("max_model_len") or evidence.get("max_model_len")
            evidence["models"] = [m.get("id") for m in models["data"]]
        text, err = _get(client, "/metrics") if "/metrics" in paths else (None, None)
        if err:
            errors["/metrics"] = err
        elif isinstance(text, str) and profile.kind != "vllm":
            evidence["metrics_families"] = sorted(
                {line.split("{")[0].split()[0] for line in text.splitlines() if line and not line.startswith("#")}
            )
        elif isinstance(text, str):
            try:
                scraped = metrics.parse(text)
            except ValueError as exc:
                errors["/metrics"] = f"unparseable: {exc}"
            else:
                cache = metrics.cache_config(scraped)
                evidence["cache_config"] = cache
                if cache is None:
                    errors["/metrics"] = f"no {metrics.CACHE_CONFIG_INFO} sample"
    if log_path is not None and log_path.exists():
        text = log_path.read_text(encoding="utf-8", errors="replace")
        evidence["log"] = parse_llamacpp_log(text) if profile.kind == "llamacpp" else parse_log(text)
    if missing := profile.missing_evidence():
        evidence["evidence_missing"] = missing
    if errors:
        evidence["errors"] = errors
    return cast(Evidence, evidence)


def _llamacpp_props(client: httpx.Client, evidence: dict[str, Any], errors: dict[str, str]) -> None:
    """llama-server's ``/props`` (build, slots, context per slot) and ``/slots`` (what each slot holds)."""
    props, err = _get(client, "/props")
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
    slots, err = _get(client, "/slots")
    if err:
        errors["/slots"] = err
    elif isinstance(slots, list):
        evidence["slots"] = [{"id": s.get("id"), "n_ctx": s.get("n_ctx")} for s in slots if isinstance(s, dict)]
