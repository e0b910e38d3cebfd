"""A stand-in engine *process*, vLLM-shaped: ``python -m pytest_kvcache.testing.standin``.

Point ``--kv-engine-cmd`` at it (`engine_cmd()` builds the value) and every arm boots this instead of
vLLM. It accepts vLLM's server
arguments (``--model``, ``--host``, ``--port``, ``--kv-cache-dtype``, ``--max-model-len``; the rest are
ignored), prints vLLM-shaped startup log lines and serves
:class:`~pytest_kvcache.selfcheck.stream.StreamServer`. Options prefixed ``--standin-`` (pass them in
``--kv-engine-args`` or an arm's ``args``) make it misbehave the ways a real engine can but cannot be
made to on demand: exit at startup, start slowly, die mid-request, hang (take requests and never answer),
report another cache dtype, ignore SIGTERM, have no ``/tokenize``, play any `Fault` (``--standin-fault``: stop
early, misreport usage …), move its prompt logprobs (a lossy KV
dtype); ``--standin-ttft`` / ``--standin-itl`` set its timing.

Given a KV budget (vLLM's ``--kv-cache-memory-bytes``: 2,048 bytes a token at 16 bits, as the embedded tiny
model's, 1,024 at 8) or ``--standin-kv-tokens``, it keeps a KV-capacity model (`LruPrefixCache`): a prefix
cache of that many tokens in blocks of 16, least recently used evicted first, and a TTFT that grows with the
prompt tokens it had not cached (``--standin-prefill-tps``), queued behind the other prefills -- so the
capacity probe's search can be tested without a real engine.

It is a test double for what real vLLM cannot be made to do on cue; the happy path and real failure
modes are tested against real vLLM (CPU build). See ``docs/testing.md``.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from pytest_kvcache.config.budget import parse_bytes
from pytest_kvcache.engines.kinds.base import VLLM_ONLY_FIELDS, VLLM_ONLY_STREAM_OPTIONS
from pytest_kvcache.selfcheck.schedule import Fault, Schedule
from pytest_kvcache.selfcheck.stream import StreamServer

#: The module to run with ``python -m`` (what `engine_cmd` runs, and what finds leaked stand-ins in ``ps``).
MODULE = "pytest_kvcache.testing.standin"


def engine_cmd(python: str | None = None) -> str:
    """The ``--kv-engine-cmd`` value that boots the stand-in with ``python`` (default: this interpreter)."""
    return f"{python or sys.executable} -m {MODULE}"


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="standin", allow_abbrev=False)
    parser.add_argument("--model", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--kv-cache-dtype", default="auto")
    parser.add_argument("--standin-exit-at-start", type=int, default=None, metavar="CODE")
    parser.add_argument("--standin-startup-delay", type=float, default=0.0, metavar="S")
    parser.add_argument(
        "--standin-die-after",
        type=int,
        default=None,
        metavar="N",
        help="exit (code 3) while streaming the N-th chat request (1-based)",
    )
    parser.add_argument("--standin-report-dtype", default=None, help="report this cache_dtype in /metrics")
    parser.add_argument("--standin-ignore-sigterm", action="store_true")
    parser.add_argument("--standin-no-tokenize", action="store_true", help="answer /tokenize with 404")
    parser.add_argument(
        "--standin-hang", action="store_true", help="take every generation request and never answer (no headers)"
    )
    parser.add_argument(
        "--standin-fault",
        default=None,
        metavar="JSON",
        help='inject this Fault into every generation request, e.g. {"kind":"stop_early","after_chunks":8}',
    )
    parser.add_argument(
        "--standin-logprob-shift",
        type=float,
        default=0.0,
        metavar="X",
        help="move prompt_logprobs by up to ±X·ln(1 + position/1000) nats (a lossy arm for the fidelity probe)",
    )
    parser.add_argument("--standin-spawn-child", action="store_true", help="start a child process that ignores SIGTERM")
    parser.add_argument("--standin-sleeper", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument(
        "--standin-unstreamed-delay", type=float, default=0.0, metavar="S", help="delay non-streamed answers"
    )
    parser.add_argument(
        "--standin-short-context",
        action="store_true",
        help="refuse prompts over --max-model-len with HTTP 400 and do not advertise max_model_len in /v1/models",
    )
    parser.add_argument(
        "--standin-generic",
        action="store_true",
        help="a generic OpenAI server: no /tokenize, /metrics or /version, no vLLM log lines, and HTTP 400 for "
        "any vLLM-only request field (ignore_eos, min_tokens, continuous_usage_stats, …)",
    )
    parser.add_argument(
        "--standin-tokenizer",
        default=None,
        metavar="DIR",
        help="count usage.prompt_tokens with this folder's tokenizer and chat template (transformers)",
    )
    parser.add_argument("--max-model-len", type=int, default=8192)
    parser.add_argument(
        "--kv-cache-memory-bytes", type=parse_bytes, default=None, help="vLLM's KV budget (32M, 2G): the KV model"
    )
    parser.add_argument(
        "--standin-kv-tokens", type=int, default=None, help="a KV-capacity model of this many tokens (LruPrefixCache)"
    )
    parser.add_argument(
        "--standin-prefill-tps", type=float, default=10_000.0, help="the KV model's prefill rate (toy tokens/s)"
    )
    parser.add_argument("--standin-ttft", type=float, default=0.02)
    parser.add_argument("--standin-itl", type=float, default=0.002)
    args, _unknown = parser.parse_known_args(argv)
    return args


#: The stand-in's KV bytes per token at 16 bits (the embedded tiny model's: 2 × 4 layers × 2 heads × 64 × 2 B).
BYTES_PER_TOKEN = 2048
BLOCK_SIZE = 16


class LruPrefixCache:
    """The stand-in's KV capacity: ``capacity_tokens`` of prefix cache in blocks of ``block_size`` (a block is
    the hash of every token up to its end, as vLLM's), least recently used evicted first -- a request's tail
    before its head, as vLLM frees them. A prompt's cached
    tokens are its leading blocks still held; its first token leaves once the prefills queued before it and its
    own uncached tokens (at ``prefill_tps``) are done, plus ``ttft_s``. Thread-safe."""

    def __init__(
        self, capacity_tokens: int, *, block_size: int = BLOCK_SIZE, prefill_tps: float = 10_000.0, ttft_s: float = 0.02
    ) -> None:
        self.capacity_blocks = max(1, capacity_tokens // block_size)
        self.block_size = block_size
        self.prefill_tps = prefill_tps
        self.ttft_s = ttft_s
        self._blocks: collections.OrderedDict[int, None] = collections.OrderedDict()
        self._busy_until = 0.0
        self._lock = threading.Lock()

    def admit(self, tokens: Sequence[int], arrival_s: float) -> tuple[int, float]:
        size = self.block_size
        hashes, h = [], 0
        for k in range(len(tokens) // size):
            h = hash((h, tuple(tokens[k * size : (k + 1) * size])))
            hashes.append(h)
        with self._lock:
            hits = 0
            for h in hashes:
                if h not in self._blocks:
                    break
                hits += 1
            for h in reversed(hashes):  # the head last: as vLLM frees a request's blocks, its tail goes first
                self._blocks[h] = None
                self._blocks.move_to_end(h)
            while len(self._blocks) > self.capacity_blocks:
                self._blocks.popitem(last=False)
            cached = hits * size
            done = max(arrival_s, self._busy_until) + (len(tokens) - cached) / self.prefill_tps
            self._busy_until = done
        return cached, done - arrival_s + self.ttft_s

    def usage(self) -> float:
        with self._lock:
            return len(self._blocks) / self.capacity_blocks


def kv_tokens(args: argparse.Namespace) -> int | None:
    """The KV model's size: ``--standin-kv-tokens``, else the budget at the arm's bytes per token; None: no model."""
    if args.standin_kv_tokens is not None:
        return int(args.standin_kv_tokens)
    if args.kv_cache_memory_bytes is None:
        return None
    narrow = str(args.kv_cache_dtype).startswith(("fp8", "int8"))
    return int(args.kv_cache_memory_bytes) // (BYTES_PER_TOKEN // 2 if narrow else BYTES_PER_TOKEN)


#: What a generic OpenAI server (``--standin-generic``) lacks of vLLM's endpoints.
GENERIC_MISSING = frozenset({"/tokenize", "/metrics", "/version"})


def _chat_counter(folder: str) -> Callable[[dict[str, Any]], int]:
    """``usage.prompt_tokens`` of a request as a server with this model's tokenizer and template counts it."""
    from transformers import AutoTokenizer

    tokenizer: Any = AutoTokenizer.from_pretrained(folder)

    def count(body: dict[str, Any]) -> int:
        ids: Any
        if isinstance(body.get("messages"), list):
            ids = tokenizer.apply_chat_template(body["messages"], add_generation_prompt=True, tokenize=True)
            ids = ids["input_ids"] if hasattr(ids, "keys") else ids
        else:
            ids = tokenizer(str(body.get("prompt", "")))["input_ids"]
        return len(ids)

    return count


def log(message: str, level: str = "INFO", who: str = "APIServer") -> None:
    stamp = time.strftime("%m-%d %H:%M:%S")
    print(f"({who} pid={os.getpid()}) {level} {stamp} [standin.py:1] {message}", flush=True)


def main(argv: list[str] | None = None) -> int:
    raw = sys.argv[1:] if argv is None else argv
    args = parse(raw)
    if args.standin_sleeper:  # the child of --standin-spawn-child: ignores SIGTERM, only SIGKILL ends it
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        time.sleep(600)
        return 0
    if args.standin_ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if args.standin_spawn_child:
        child = [a for a in raw if a != "--standin-spawn-child"]
        subprocess.Popen([sys.executable, "-m", MODULE, *child, "--standin-sleeper"], stdin=subprocess.DEVNULL)
    if not args.standin_generic:
        log(f"non-default args: {{'model': {args.model!r}, 'kv_cache_dtype': {args.kv_cache_dtype!r}}}")
    if args.standin_exit_at_start is not None:
        log("ValueError: standin told to fail at start", "ERROR", "EngineCore")
        return int(args.standin_exit_at_start)
    time.sleep(args.standin_startup_delay)
    dtype = args.standin_report_dtype or args.kv_cache_dtype
    capacity = kv_tokens(args)
    if not args.standin_generic:
        log(f"Initializing a V1 LLM engine (v0.0.0-standin) with config: model={args.model!r}, kv_cache_dtype={dtype}")
        log(f"CPU KV cache size: {capacity or 65536:,} tokens")
    labels = {
        "block_size": str(BLOCK_SIZE),
        "cache_dtype": dtype,
        "enable_prefix_caching": "True",
        "kv_cache_size_tokens": str(capacity or 65536),
        "mamba_cache_dtype": "auto",
    }
    if args.kv_cache_memory_bytes is not None:
        labels["kv_cache_memory_bytes"] = str(args.kv_cache_memory_bytes)
    cache = None
    if capacity is not None:
        cache = LruPrefixCache(capacity, prefill_tps=args.standin_prefill_tps, ttft_s=args.standin_ttft)
    fault = Fault("hang", stall_s=3600.0) if args.standin_hang else None
    if args.standin_fault:
        fault = Fault.from_dict(json.loads(args.standin_fault))
    schedule = Schedule(ttft_s=args.standin_ttft, itl_s=args.standin_itl, fault=fault)
    server = StreamServer(
        schedule,
        host=args.host,
        port=args.port,
        model_name=args.model,
        max_model_len=args.max_model_len,
        cache_config_labels=labels,
        count_prompt_tokens=True,
        disabled_paths=(
            GENERIC_MISSING
            if args.standin_generic
            else frozenset({"/tokenize"})
            if args.standin_no_tokenize
            else frozenset()
        ),
        rejected_fields=VLLM_ONLY_FIELDS | VLLM_ONLY_STREAM_OPTIONS if args.standin_generic else frozenset(),
        prompt_counter=_chat_counter(args.standin_tokenizer) if args.standin_tokenizer else None,
        unstreamed_delay_s=args.standin_unstreamed_delay,
        enforce_max_model_len=args.standin_short_context,
        advertise_max_model_len=not args.standin_short_context,
        logprob_shift=args.standin_logprob_shift,
        prompt_cache=cache,
    )
    server.start()
    log(f"Started server process on http://{args.host}:{args.port}")
    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    if not args.standin_ignore_sigterm:
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
    while not stop.wait(0.02):
        if args.standin_die_after is not None:
            chats = [r for r in server.requests if r.path.endswith("/chat/completions")]
            if len(chats) == args.standin_die_after - 1:
                server.set_schedule(Schedule(ttft_s=30.0))  # the next request is still waiting when we die
            if len(chats) >= args.standin_die_after:
                time.sleep(0.1)
                log("RuntimeError: standin died", "ERROR", "EngineCore")
                os._exit(3)
    server.close()
    log("Shutting down")
    return 0


if __name__ == "__main__":
    sys.exit(main())
