"""Fidelity at depth: one committed text scored teacher-forced per boot (prompt logprobs), the same token
ids in every arm; the report compares each arm's logprobs with the baseline arm's (``probes.fidelity``)."""

from __future__ import annotations

import time

import httpx
import pytest

from pytest_kvcache.config.resolve import served_vocab
from pytest_kvcache.config.settings import Settings
from pytest_kvcache.model.records import FidelityRecord
from pytest_kvcache.plugin import Recorder
from pytest_kvcache.probes import fidelity, judging, prefill
from pytest_kvcache.run.measure import ArmClient, EngineDied, Server


def _error(exc: BaseException) -> str:
    if isinstance(exc, httpx.HTTPStatusError):
        return f"HTTP {exc.response.status_code}: {exc.response.text[:300]}"
    return f"{type(exc).__name__}: {exc}"


@pytest.mark.fidelity
def test_fidelity(
    kv_server: Server,
    kv_client: ArmClient,
    kv_record: Recorder,
    kv_settings: Settings,
    kv_fidelity_text: str,
) -> None:
    label = f"fidelity {kv_fidelity_text} on {kv_server.name}"
    forced = kv_server.profile.forced_scoring and not kv_server.profile.prompt_logprobs
    if not kv_server.profile.prompt_logprobs and not forced:
        pytest.skip(f"{label}: a {kv_server.profile.title} gives no prompt logprobs over token ids")
    try:
        text = fidelity.load_text(kv_fidelity_text)
    except fidelity.TextError as exc:
        failure: str | None = f"{label}: {exc}"
    else:
        failure = None
    if failure is not None:
        pytest.fail(failure, pytrace=False)
    depths = sorted(kv_settings.fidelity_depths)
    entry: FidelityRecord = {
        "text": text.name,
        "text_sha256": text.sha256,
        "top_k": kv_settings.fidelity_top_k,
        "window": kv_settings.fidelity_window,
    }
    tokenize = (
        {"content": text.text, "add_special": False}
        if forced
        else {"model": kv_server.model, "prompt": text.text, "add_special_tokens": False}
    )
    try:
        tokenized = kv_client.post_json("/tokenize", tokenize)
        all_ids = [int(t) for t in tokenized["tokens"]]
    except (httpx.HTTPError, KeyError, TypeError, ValueError) as exc:
        failure = f"the fidelity probe needs the engine's /tokenize for token ids: {_error(exc)}"
    if failure is not None:
        entry["ok"], entry["error"] = False, failure
        kv_record.fidelity(entry)
        pytest.fail(f"{label}: {failure}", pytrace=False)
    max_len = kv_server.evidence.get("max_model_len")
    limit = min(depths[-1], len(all_ids), (int(max_len) - 1) if max_len else depths[-1])
    ids = all_ids[:limit]
    usable = [d for d in depths if d <= limit]
    if not usable:
        reason = (
            f"no depth of {', '.join(map(prefill.depth_label, depths))} fits: the text has "
            f"{len(all_ids):,} tokens, max_model_len is {max_len}"
        )
        entry["ok"], entry["error"] = False, reason
        kv_record.fidelity(entry)
        pytest.skip(f"{label}: {reason}")
    entry["ids_sha256"], entry["prompt_tokens"] = fidelity.ids_sha256(ids), len(ids)
    # what the report's "can this baseline judge?" reads: the text's characters per token, the vocabulary
    entry["text_chars"], entry["text_tokens"] = len(text.text), len(all_ids)
    entry["vocab_size"] = _vocab(kv_client, kv_settings)
    # only the baseline's greedy continuations are judged (``report.judging``): other arms skip them
    baseline = kv_server.arm.name == kv_settings.baseline.name
    if forced:
        _score_forced(kv_client, kv_record, kv_settings, entry, ids, usable, depths, label, baseline=baseline)
        return
    payload = fidelity.payload(kv_server.model, ids, kv_settings.fidelity_top_k)
    try:
        body, wall_s, engine = kv_client.post_measured("/v1/completions", payload, kv_settings.request_timeout_s)
        scored = fidelity.parse_prompt_logprobs(body, ids, kv_settings.fidelity_top_k)
    except (httpx.HTTPError, ValueError, EngineDied) as exc:
        entry["ok"], entry["error"] = False, _error(exc)
        kv_record.fidelity(entry)
        message = f"{label}: scoring {len(ids):,} tokens with prompt_logprobs failed: {entry['error']}"
        pytest.fail(message, pytrace=False)
    kept, short = fidelity.windows(ids, scored, usable, kv_settings.fidelity_window)
    block_size = int((kv_server.evidence.get("cache_config") or {}).get("block_size") or 16)
    # Scores do not depend on a cache hit (the same KV either way): an unproven cold start is only flagged.
    flags, excluded, proof = prefill.cold_check(None, engine, block_size, allow_unproven=True)
    entry["ok"], entry["wall_s"], entry["engine"], entry["cold_proof"] = True, wall_s, engine, proof
    entry["flags"], entry["excluded_reason"] = flags, excluded
    entry["windows"] = [w.to_dict() for w in kept]
    entry["short_depths"] = [d for d in depths if d not in usable] + short
    if baseline:
        _greedy(kv_client, kv_server.model, ids[: judging.GREEDY_PROMPT_TOKENS], entry, forced=False)
    kv_record.fidelity(entry)
    if excluded:
        pytest.fail(f"{label}: {excluded}", pytrace=False)


def _vocab(kv_client: ArmClient, kv_settings: Settings) -> int | None:
    """The served model's vocabulary: its config where the plugin knows it, else what the engine says
    (llama-server's ``/v1/models`` carries ``meta.n_vocab``)."""
    known = served_vocab(kv_settings)
    if known is not None:
        return known
    try:
        models = kv_client.get_json("/v1/models")
        n_vocab = models["data"][0]["meta"]["n_vocab"]
    except (httpx.HTTPError, KeyError, IndexError, TypeError, ValueError):
        return None
    return n_vocab if isinstance(n_vocab, int) and n_vocab > 1 else None


def _greedy(kv_client: ArmClient, model: str, ids: list[int], entry: FidelityRecord, *, forced: bool) -> None:
    """A short greedy continuation of the text's first tokens, on the baseline arm's boots, for the report's
    repeat check (``probes.judging``). A failure is recorded and judged "not checked", never a failed test."""
    n = judging.GREEDY_TOKENS
    try:
        if forced:  # llama-server's own completion endpoint, as the forced scoring uses
            body = {"prompt": ids, "n_predict": n, "temperature": 0.0, "cache_prompt": True}
            entry["greedy_text"] = str(kv_client.post_json("/completion", body)["content"])
        else:
            body = {"model": model, "prompt": ids, "max_tokens": n, "temperature": 0.0, "stream": False}
            entry["greedy_text"] = str(kv_client.post_json("/v1/completions", body)["choices"][0]["text"])
    except (httpx.HTTPError, KeyError, IndexError, TypeError, ValueError, EngineDied) as exc:
        entry["greedy_error"] = _error(exc)


def _score_forced(
    kv_client: ArmClient,
    kv_record: Recorder,
    kv_settings: Settings,
    entry: FidelityRecord,
    ids: list[int],
    usable: list[int],
    depths: list[int],
    label: str,
    *,
    baseline: bool,
) -> None:
    """llama-server has no prompt logprobs: each window position is one forced one-token continuation
    (``fidelity.forced_payload``) on the prompt cache — the same requests, in the same order, in every arm."""
    top_k = kv_settings.fidelity_top_k
    steps = 0

    def score(position: int) -> tuple[float, list[tuple[int, float]]]:
        nonlocal steps
        steps += 1
        # a window's first position prefills everything before it: the first-token limit of that prompt
        body = kv_client.post_unstreamed("/completion", fidelity.forced_payload(ids, position, top_k), position)
        return fidelity.parse_forced(body, ids[position], top_k)

    started = time.perf_counter()
    try:
        kept, short = fidelity.forced_windows(ids, usable, kv_settings.fidelity_window, top_k, score)
    except (httpx.HTTPError, ValueError, EngineDied) as exc:
        entry["ok"], entry["error"] = False, _error(exc)
        kv_record.fidelity(entry)
        pytest.fail(f"{label}: forced scoring failed at step {steps + 1}: {entry['error']}", pytrace=False)
    entry["ok"], entry["wall_s"], entry["engine"] = True, time.perf_counter() - started, None
    entry["method"] = f"forced one-token continuations on the prompt cache ({steps} requests)"
    entry["cold_proof"], entry["flags"], entry["excluded_reason"] = "n/a", [], None
    entry["windows"] = [w.to_dict() for w in kept]
    entry["short_depths"] = [d for d in depths if d not in usable] + short
    if baseline:  # on the prompt cache: the first depth's tokens are there
        _greedy(kv_client, "", ids[: usable[0]], entry, forced=True)
    kv_record.fidelity(entry)
