"""Evidence of what an engine really is: ``/version``, ``/v1/models``, ``/metrics`` and its log lines."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import httpx

from pytest_kvcache.engines.kinds.base import EngineProfile, find_kind, get_endpoint
from pytest_kvcache.engines.kinds.vllm import (
    VLLM,
    parse_log,
)
from pytest_kvcache.metrics import prometheus
from pytest_kvcache.model.evidence import Evidence


def collect(url: str, log_path: Path | None, timeout_s: float = 10.0, profile: EngineProfile = VLLM) -> Evidence:
    """Ask the server what it is, on the endpoints its profile has. Never raises: a missing endpoint is
    recorded as an error string, and what this kind of server cannot show is listed in ``evidence_missing``.
    The kind registered under ``profile.kind`` parses the log and asks its own endpoints."""
    kind = find_kind(profile.kind)
    info = kind.cache_config_info if kind is not None else None
    evidence: dict[str, Any] = {"url": url, "engine_kind": profile.kind}
    errors: dict[str, str] = {}
    paths = profile.evidence_paths
    with httpx.Client(base_url=url, timeout=timeout_s) as client:
        if "/version" in paths:
            version, err = get_endpoint(client, "/version")
            if err:
                errors["/version"] = err
            elif isinstance(version, dict):
                evidence["engine_version"] = version.get("version")
        if kind is not None:
            kind.collect(client, evidence, errors)
        models, err = get_endpoint(client, "/v1/models")
        if err:
            errors["/v1/models"] = err
        elif isinstance(models, dict) and models.get("data"):
            first = models["data"][0]
            evidence["served_model"] = first.get("id")
            evidence["model_root"] = first.get("root")
            evidence["max_model_len"] = first.get("max_model_len") or evidence.get("max_model_len")
            evidence["models"] = [m.get("id") for m in models["data"]]
        text, err = get_endpoint(client, "/metrics") if "/metrics" in paths else (None, None)
        if err:
            errors["/metrics"] = err
        elif isinstance(text, str) and info is not None:
            try:
                scraped = prometheus.parse(text)
            except ValueError as exc:
                errors["/metrics"] = f"unparseable: {exc}"
            else:
                cache = scraped.labels(info)
                evidence["cache_config"] = cache
                if cache is None:
                    errors["/metrics"] = f"no {info} sample"
        elif isinstance(text, str):
            evidence["metrics_families"] = sorted(
                {line.split("{")[0].split()[0] for line in text.splitlines() if line and not line.startswith("#")}
            )
    if log_path is not None and log_path.exists():
        text = log_path.read_text(encoding="utf-8", errors="replace")
        evidence["log"] = kind.parse_log(text) if kind is not None else parse_log(text)
    if missing := profile.missing_evidence():
        evidence["evidence_missing"] = missing
    if errors:
        evidence["errors"] = errors
    return cast(Evidence, evidence)
