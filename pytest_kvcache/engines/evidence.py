"""Evidence of what an engine really is: ``/version``, ``/v1/models``, ``/metrics`` and its log lines."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any, cast

import httpx

from pytest_kvcache import metrics
from pytest_kvcache.model import Evidence, LogFacts

BACKEND = re.compile(r"Using (\S+) attention backend out of potential backends: \[([^\]]*)\]")
ENGINE_INIT = re.compile(r"Initializing a V1 LLM engine \(v([^)]+)\) with config: (.*)")
KV_DTYPE_IN_CONFIG = re.compile(r"\bkv_cache_dtype=([A-Za-z0-9_]+)")
KV_SIZE = re.compile(r"\b(GPU|CPU|XPU|TPU) KV cache size: ([\d,]+) tokens")
NON_DEFAULT_ARGS = re.compile(r"non-default args: (\{.*\})\s*$")
SPEC_IN_CONFIG = re.compile(r"\bspeculative_config=(None|SpeculativeConfig\([^)]*\))")
SPEC_FIELD = re.compile(r"(\w+)=('[^']*'|[^,)]+)")
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


def _get(client: httpx.Client, path: str) -> tuple[Any, str | None]:
    try:
        response = client.get(path)
        if response.status_code != 200:
            return None, f"HTTP {response.status_code}"
        return (response.text if path == "/metrics" else response.json()), None
    except (httpx.HTTPError, ValueError) as exc:
        return None, f"{type(exc).__name__}: {exc}"


def collect(url: str, log_path: Path | None, timeout_s: float = 10.0) -> Evidence:
    """Ask the server what it is. Never raises: a missing endpoint is recorded as an error string."""
    evidence: dict[str, Any] = {"url": url}
    errors: dict[str, str] = {}
    with httpx.Client(base_url=url, timeout=timeout_s) as client:
        version, err = _get(client, "/version")
        if err:
            errors["/version"] = err
        elif isinstance(version, dict):
            evidence["engine_version"] = version.get("version")
        models, err = _get(client, "/v1/models")
        if err:
            errors["/v1/models"] = err
        elif isinstance(models, dict) and models.get("data"):
            first = models["data"][0]
            evidence["served_model"] = first.get("id")
            evidence["model_root"] = first.get("root")
            evidence["max_model_len"] = first.get("max_model_len")
            evidence["models"] = [m.get("id") for m in models["data"]]
        text, err = _get(client, "/metrics")
        if err:
            errors["/metrics"] = err
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
        evidence["log"] = parse_log(log_path.read_text(encoding="utf-8", errors="replace"))
    if errors:
        evidence["errors"] = errors
    return cast(Evidence, evidence)


def resolved_cache_dtype(evidence: Evidence) -> str | None:
    """The KV-cache dtype the engine reports: the ``/metrics`` label first, else its startup log line."""
    cache = evidence.get("cache_config") or {}
    if cache.get("cache_dtype"):
        return str(cache["cache_dtype"])
    log = evidence.get("log") or {}
    value = log.get("kv_cache_dtype")
    return str(value) if value else None


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
