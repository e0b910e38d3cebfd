"""Fidelity at depth: one committed text scored teacher-forced per boot (prompt logprobs), the same token
ids in every arm; the report compares each arm's logprobs with the baseline arm's (``probes.fidelity``)."""

from __future__ import annotations

import time

import httpx
import pytest

from pytest_kvcache.config.resolve import served_vocab
from pytest_kvcache.config.settings import Settings
from pytest_kvcache.engines import scoring
from pytest_kvcache.model.records import FidelityRecord
from pytest_kvcache.plugin import Recorder
from pytest_kvcache.probes import fidelity, judging, prefill
from pytest_kvcache.probes.registry import depth_label
from pytest_kvcache.run.measure import ArmClient, EngineDied, Server, request_error


@pytest.mark.fidelity
def test_fidelity(
    kv_server: Server,
    kv_client: ArmClient,
    kv_record: Recorder,
    kv_settings: Settings,
    kv_fidelity_text: str,
) -> None:
    label = f"fidelity {kv_fidelity_text} on {kv_server.name}"
    scorer = kv_client.kind.score_prompt if kv_client.kind is not None else None
    if scorer is None:  # the kind's capability (``Kind.score_prompt``)
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
    try:
        all_ids = scorer.tokenize(kv_client, kv_server.model, text.text)
    except (httpx.HTTPError, KeyError, TypeError, ValueError) as exc:
        failure = f"the fidelity probe needs the engine's /tokenize for token ids: {request_error(exc)}"
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
            f"no depth of {', '.join(map(depth_label, depths))} fits: the text has "
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
    top_k, window = kv_settings.fidelity_top_k, kv_settings.fidelity_window
    started = time.perf_counter()
    scores = None
    try:
        scores = scorer.score(kv_client, kv_server.model, ids, top_k, kv_settings.request_timeout_s)
        kept, short = scoring.windows(ids, usable, window, top_k, scores.score)
    except (httpx.HTTPError, ValueError, EngineDied) as exc:
        entry["ok"], entry["error"] = False, request_error(exc)
        kv_record.fidelity(entry)
        if scores is not None and scores.method is not None:
            message = f"{label}: {scores.method} failed at request {scores.requests}: {entry['error']}"
        else:
            message = f"{label}: scoring {len(ids):,} tokens with prompt_logprobs failed: {entry['error']}"
        pytest.fail(message, pytrace=False)
    if scores.wall_s is not None:  # one measured request scored the whole prompt
        block_size = int((kv_server.evidence.get("cache_config") or {}).get("block_size") or 16)
        # Scores do not depend on a cache hit (the same KV either way): an unproven cold start is only flagged.
        flags, excluded, proof = prefill.cold_check(None, scores.engine, block_size, allow_unproven=True)
        entry["ok"], entry["wall_s"], entry["engine"], entry["cold_proof"] = True, scores.wall_s, scores.engine, proof
    else:  # a request a position, on the prompt cache: timed here, nothing cold to prove
        flags, excluded = [], None
        entry["ok"], entry["wall_s"], entry["engine"] = True, time.perf_counter() - started, None
        entry["method"] = f"{scores.method} ({scores.requests} requests)"
        entry["cold_proof"] = "n/a"
    entry["flags"], entry["excluded_reason"] = flags, excluded
    entry["windows"] = [w.to_dict() for w in kept]
    entry["short_depths"] = [d for d in depths if d not in usable] + short
    if baseline:  # a short greedy continuation of the text's first tokens (its cache's, where it scores on one)
        prompt = ids[: usable[0]] if scorer.greedy_on_cache else ids[: judging.GREEDY_PROMPT_TOKENS]
        try:
            entry["greedy_text"] = scorer.greedy(kv_client, kv_server.model, prompt, judging.GREEDY_TOKENS)
        except (httpx.HTTPError, KeyError, IndexError, TypeError, ValueError, EngineDied) as exc:
            entry["greedy_error"] = request_error(exc)  # judged "not checked", never a failed test
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
