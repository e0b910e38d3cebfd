"""Retrieval at depth: needles at exact depths and positions, the same in every arm, recalled greedily
(``probes.retrieval``); the report scores each cell with a Wilson interval and pairs each arm's needles with the
baseline's (``report.retrieval``)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from pytest_kvcache.config.settings import Settings
from pytest_kvcache.model.records import RetrievalRecord
from pytest_kvcache.plugin import Recorder
from pytest_kvcache.probes import fidelity, retrieval
from pytest_kvcache.probes.registry import depth_label
from pytest_kvcache.probes.tokens import TokenizerError, load_tokenizer, tokenizer_dir
from pytest_kvcache.run.measure import ArmClient, EngineDied, Server, request_error

#: Tokens a chat template may add around the question form's message (its depth is the server's count).
TEMPLATE_SLACK = 32


class Tokenizer:
    """The served model's tokenizer: the server's ``/tokenize`` (vLLM's or llama.cpp's shape), else the model's
    own folder here (an external endpoint)."""

    def __init__(self, client: ArmClient, server: Server, settings: Settings) -> None:
        self.client, self.server, self.how = client, server, server.profile.tokens
        self.local: Any = None
        if self.how == "local":
            self.local = load_tokenizer(str(tokenizer_dir(settings)))

    def encode(self, text: str, *, special: bool = False) -> list[int]:
        if self.local is not None:
            return [int(t) for t in self.local.encode(text, add_special_tokens=special)]
        if self.how == "llamacpp":
            body: dict[str, Any] = {"content": text, "add_special": special}
        else:
            body = {"model": self.server.model, "prompt": text, "add_special_tokens": special}
        return [int(t) for t in self.client.post_json("/tokenize", body)["tokens"]]

    def decode(self, ids: list[int]) -> str:
        if self.local is not None:
            return str(self.local.decode(ids))
        if self.how == "llamacpp":
            return str(self.client.post_json("/detokenize", {"tokens": ids})["content"])
        return str(self.client.post_json("/detokenize", {"model": self.server.model, "tokens": ids})["prompt"])

    def prefix(self) -> list[int]:
        """What the tokenizer puts before a text (its BOS, where it has one): a prompt of ids starts with it."""
        bare, marked = self.encode("x"), self.encode("x", special=True)
        return marked[: len(marked) - len(bare)] if marked[-len(bare) :] == bare else []


def _haystacks(tokenizer: Tokenizer, kind: str, depth: int) -> dict[str, list[int]]:
    if kind == "filler":
        once = tokenizer.encode(retrieval.FILLER)
        return {"filler": once * (depth // max(1, len(once)) + 2)}
    return {name: tokenizer.encode(fidelity.load_text(name).text) for name in retrieval.HAYSTACK_TEXTS}


def _ask(client: ArmClient, server: Server, ids: list[int], form: str, text: str) -> tuple[str, int]:
    """Send one needle's request; (the answer, the prompt's tokens as the server counted them, else as sent). Not
    streamed: it may take its prompt's first-token limit (``ArmClient.post_unstreamed``) — q4_0 KV on llama.cpp's
    CPU path takes minutes for a 4k prompt on a busy host."""

    def post(path: str, body: dict[str, Any]) -> Any:
        return client.post_unstreamed(path, body, len(ids))

    if form == "question":
        body: dict[str, Any] = {
            "model": server.model,
            "messages": [{"role": "user", "content": text}],
            "max_tokens": retrieval.answer_tokens(form=form),
            "temperature": 0.0,
            "stream": False,
        }
        reply = post("/v1/chat/completions", body)
        usage = reply.get("usage") or {}
        return str(reply["choices"][0]["message"]["content"] or ""), int(usage.get("prompt_tokens") or 0)
    n = retrieval.answer_tokens(form=form)
    if server.profile.tokens == "llamacpp":  # llama-server's own endpoint takes token ids as they are
        body = {"prompt": ids, "n_predict": n, "temperature": 0.0, "cache_prompt": True}
        reply = post("/completion", body)
        return str(reply["content"]), int(reply.get("tokens_evaluated") or len(ids))
    body = {"model": server.model, "prompt": ids, "max_tokens": n, "temperature": 0.0, "stream": False}
    reply = post("/v1/completions", body)
    usage = reply.get("usage") or {}
    return str(reply["choices"][0]["text"]), int(usage.get("prompt_tokens") or len(ids))


@pytest.mark.retrieval
def test_retrieval(
    kv_server: Server,
    kv_client: ArmClient,
    kv_record: Recorder,
    kv_settings: Settings,
    kv_retrieval_depth: int,
) -> None:
    depth, form = kv_retrieval_depth, kv_settings.retrieval_form
    label = f"retrieval@{depth_label(depth)} on {kv_server.name}"
    max_len = kv_server.evidence.get("max_model_len")
    if max_len and depth + retrieval.answer_tokens(form=form) > int(max_len):
        pytest.skip(f"{label}: {depth:,} tokens and an answer exceed max_model_len {max_len}")
    try:
        tokenizer = Tokenizer(kv_client, kv_server, kv_settings)
        prefix = tokenizer.prefix()
        hays = _haystacks(tokenizer, kv_settings.retrieval_haystack, depth)
    except (httpx.HTTPError, KeyError, TypeError, ValueError, TokenizerError, EngineDied) as exc:
        pytest.fail(
            f"{label}: the retrieval probe needs the served model's tokenizer: {request_error(exc)}", pytrace=False
        )
    encode: Callable[[str], list[int]] = tokenizer.encode
    # the question form's haystack leaves room for the question and the chat template (the server counts them)
    sized = (
        depth
        if form == "recall"
        else depth - TEMPLATE_SLACK - len(encode(retrieval.Needle("Alice", "words", "").question))
    )
    failed = asked = 0
    cells = [(k, p) for k in kv_settings.retrieval_keys for p in kv_settings.retrieval_positions]
    for keys, position in cells:
        for index in range(kv_settings.retrieval_needles):
            needles = retrieval.needles_for(kv_settings.seed, depth, position, keys, index)
            text = retrieval.haystack_text(index, kv_settings.retrieval_haystack)
            hay = hays[text]
            room = sized - len(prefix)
            start = retrieval.haystack_start(kv_settings.seed, depth, position, keys, index, len(hay), room)
            asked_needle = needles[0]
            entry: RetrievalRecord = {
                "depth": depth,
                "position": position,
                "form": form,
                "keys": keys,
                "haystack": text,
                "needle": index,
                "kind": asked_needle.kind,
                "key": asked_needle.key,
                "expected": asked_needle.value,
            }
            try:
                prompt = retrieval.recall_prompt(
                    depth=sized,
                    position=position,
                    needles=needles,
                    hay=hay,
                    start=start,
                    encode=encode,
                    prefix=prefix,
                    ask=form == "recall",
                )
                message = (
                    "" if form == "recall" else tokenizer.decode(prompt.ids[len(prefix) :]) + asked_needle.question
                )
                sent = time.perf_counter()
                returned, prompt_tokens = _ask(kv_client, kv_server, prompt.ids, form, message)
            except retrieval.HaystackTooShort as exc:
                pytest.fail(f"{label}: {exc}", pytrace=False)
            except EngineDied as exc:
                pytest.fail(f"{label}: {exc}", pytrace=False)
            except (httpx.HTTPError, KeyError, IndexError, TypeError, ValueError) as exc:
                failed += 1
                entry.update({"ok": False, "error": request_error(exc), "returned": "", "correct": False})
            else:
                entry.update(
                    {
                        "ok": True,
                        "returned": returned,
                        "correct": retrieval.found(returned, asked_needle, form),
                        "prompt_tokens": prompt_tokens,
                        "needle_at": prompt.needle_at,
                        "wall_s": round(time.perf_counter() - sent, 4),
                    }
                )
            asked += 1
            kv_record.retrieval(entry)
    if failed == asked:
        pytest.fail(f"{label}: every one of {asked} requests failed (retrieval.jsonl has the errors)", pytrace=False)
