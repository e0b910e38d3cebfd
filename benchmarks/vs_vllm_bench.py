"""Our client against ``vllm bench serve`` and the engine's own ``/metrics``, on one real vLLM server.

Run ``python benchmarks/vs_vllm_bench.py [--requests 10] [--input-len 256] [--output-len 128] [--markdown]``.
It boots one vLLM server (the CPU build, the embedded tiny model with dummy weights, prefix caching off so
that no phase gets another phase's prompts from the cache), then, one request at a time, on the same
prompts:

1. ours (pass 1): `pytest_kvcache.client.Client`, TTFT and per-output-token time ``(last − first)/(n − 1)``;
2. ``vllm bench serve`` (module ``vllm.benchmarks.serve``: the CPU build's ``vllm`` command is broken), backend
   ``openai-chat``, the same prompts as a ``custom`` dataset (``--skip-chat-template``, no shuffle), the same
   output length, ``--ignore-eos``, ``--temperature 0``, ``--max-concurrency 1``; its saved JSON result;
3. ours (pass 2): the same as 1 again, so that drift of the engine between phases shows;

and, around every phase, the deltas of the engine's histograms (``vllm:time_to_first_token_seconds``,
``vllm:request_time_per_output_token_seconds``, ``vllm:inter_token_latency_seconds``,
``vllm:request_decode_time_seconds``, ...): their means over the phase. The table puts the three side by side,
with each figure's difference from ``vllm bench serve``.

What is identical: server, prompts (text, order), output length, ignore_eos, greedy sampling, concurrency 1.
What is not: ours asks for per-chunk usage (``continuous_usage_stats``) and takes the first token at the first
chunk whose usage counts one; ``vllm bench`` asks for final usage only and takes the first token at the first
chunk with choices (vLLM sends the role chunk with the first token). vllm bench's TPOT is
``(latency − TTFT)/(output_tokens − 1)`` with latency at the last chunk with choices, ours is the same formula
over the first and last token chunk. The engine's histograms start the clock at the request's arrival in the
engine (after HTTP and tokenization), so they read lower by the serving front end's share.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pandas as pd
from prometheus_client.parser import text_string_to_metric_families

from pytest_kvcache.client import Client
from pytest_kvcache.datafiles import embedded_model_path
from pytest_kvcache.engines.kinds.vllm import EMBEDDED_ARGS, EMBEDDED_ENV, MEASUREMENT_ARGS
from pytest_kvcache.engines.process import HOST, free_port

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import markdown_table  # the benchmarks folder is not a package

HISTOGRAMS = {
    "ttft": "vllm:time_to_first_token_seconds",
    "tpot": "vllm:request_time_per_output_token_seconds",
    "itl": "vllm:inter_token_latency_seconds",
    "decode": "vllm:request_decode_time_seconds",
    "prefill": "vllm:request_prefill_time_seconds",
    "queue": "vllm:request_queue_time_seconds",
    "e2e": "vllm:e2e_request_latency_seconds",
}
BENCH_RUNNER = (
    "import sys\n"
    "from vllm.benchmarks.serve import add_cli_args, main\n"
    "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
    "parser = FlexibleArgumentParser()\n"
    "add_cli_args(parser)\n"
    "main(parser.parse_args(sys.argv[1:]))\n"
)
WORDS = [
    *("cache", "block", "token", "layer", "head", "value", "key", "page", "engine", "batch", "decode", "prefill"),
    *("stream", "model", "weight", "tensor", "kernel", "memory", "queue", "request", "server", "client"),
    *("measure", "latency", "throughput", "sample", "window", "chunk"),
]


# ------------------------------------------------------------------------------------------ engine


@contextlib.contextmanager
def vllm_server(model: Path, log_path: Path, startup_timeout_s: float) -> Iterator[str]:
    """One vLLM OpenAI server on loopback in its own process group; always stopped (TERM, then KILL)."""
    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model),
        *EMBEDDED_ARGS,
        *MEASUREMENT_ARGS,
        "--no-enable-prefix-caching",
        "--host",
        HOST,
        "--port",
        str(port),
    ]
    env = {**os.environ, **{k: v for k, v in EMBEDDED_ENV.items() if k not in os.environ}}
    url = f"http://{HOST}:{port}"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            deadline = time.monotonic() + startup_timeout_s
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"vLLM exited with {proc.returncode} while starting; see {log_path}")
                with contextlib.suppress(httpx.HTTPError):
                    if httpx.get(f"{url}/v1/models", timeout=2.0).status_code == 200:
                        break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"vLLM not ready after {startup_timeout_s:.0f} s; see {log_path}")
                time.sleep(1.0)
            yield url
        finally:
            _stop_group(proc)


def _stop_group(proc: subprocess.Popen[bytes]) -> None:
    for sig, grace in ((signal.SIGTERM, 20.0), (signal.SIGKILL, 10.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(grace)
            return
        except subprocess.TimeoutExpired:
            continue


def histograms(url: str) -> dict[str, tuple[float, float]]:
    """(sum, count) of each histogram in `HISTOGRAMS`, summed over label sets."""
    text = httpx.get(f"{url}/metrics", timeout=10.0).text
    found = {key: (0.0, 0.0) for key in HISTOGRAMS}
    by_name = {name: key for key, name in HISTOGRAMS.items()}
    for family in text_string_to_metric_families(text):
        key = by_name.get(family.name) or by_name.get(f"{family.name}_seconds")
        if key is None:
            continue
        total, count = found[key]
        for sample in family.samples:
            if sample.name.endswith("_sum"):
                total += sample.value
            elif sample.name.endswith("_count"):
                count += sample.value
        found[key] = (total, count)
    return found


def histogram_means(before: dict[str, tuple[float, float]], after: dict[str, tuple[float, float]]) -> dict[str, Any]:
    """Mean of each histogram over the observations made between two scrapes (ms), and their count."""
    means: dict[str, Any] = {}
    for key in HISTOGRAMS:
        total = after[key][0] - before[key][0]
        count = after[key][1] - before[key][1]
        means[key] = 1e3 * total / count if count > 0 else float("nan")
        means[f"{key}_n"] = int(count)
    return means


# ------------------------------------------------------------------------------------------ prompts


def make_prompts(model: Path, count: int, input_len: int, seed: int) -> list[str]:
    """``count`` prompts of ``input_len`` tokens of the model's tokenizer (before the chat template)."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(model / "tokenizer.json"))
    rng = random.Random(seed)
    prompts = []
    for i in range(count):
        words = [f"request {i}:"] + [rng.choice(WORDS) for _ in range(input_len * 2)]
        ids = tokenizer.encode(" ".join(words), add_special_tokens=False).ids[:input_len]
        prompts.append(tokenizer.decode(ids))
    return prompts


# ------------------------------------------------------------------------------------------ phases


def run_ours(url: str, model: str, prompts: list[str], output_len: int) -> dict[str, Any]:
    """Our client, one request at a time: per-request TTFT and per-output-token time (ms)."""
    ttft, tpot, prompt_tokens, tokens = [], [], [], []
    failures = []
    cpu0, wall0 = time.process_time(), time.perf_counter()
    with Client(url, request_timeout_s=600, stall_timeout_s=120) as client:
        for prompt in prompts:
            payload = {
                "model": model,
                "messages": [{"role": "user", "content": prompt}],
                "max_tokens": output_len,
                "ignore_eos": True,
                "temperature": 0.0,
                "stream": True,
                "stream_options": {"include_usage": True, "continuous_usage_stats": True},
            }
            sample = client.stream_chat(payload)
            if not sample.ok or sample.first_token_s is None or sample.last_token_s is None:
                failures.append(f"{sample.error_kind}: {sample.error}")
                continue
            n = sample.completion_tokens or 0
            ttft.append(sample.first_token_s * 1e3)
            if n > 1:
                tpot.append((sample.last_token_s - sample.first_token_s) * 1e3 / (n - 1))
            prompt_tokens.append(sample.prompt_tokens or 0)
            tokens.append(n)
    return {
        "n": len(ttft),
        "failures": failures,
        "ttft_mean": _mean(ttft),
        "ttft_median": _median(ttft),
        "tpot_mean": _mean(tpot),
        "tpot_median": _median(tpot),
        "prompt_tokens": _mean(prompt_tokens),
        "output_tokens": _mean(tokens),
        "client_cpu_pct": 100.0 * (time.process_time() - cpu0) / (time.perf_counter() - wall0),
    }


def run_vllm_bench(
    url: str, model: Path, prompts: list[str], output_len: int, workdir: Path
) -> tuple[dict[str, Any], list[str]]:
    """``vllm bench serve`` on the same prompts; its summary figures (ms) and the command line."""
    dataset = workdir / "prompts.jsonl"
    dataset.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts), encoding="utf-8")
    host, port = url.removeprefix("http://").rsplit(":", 1)
    args = [
        "--backend", "openai-chat", "--endpoint", "/v1/chat/completions", "--host", host, "--port", port,
        "--model", str(model), "--tokenizer", str(model),
        "--dataset-name", "custom", "--dataset-path", str(dataset), "--custom-output-len", str(output_len),
        "--skip-chat-template", "--disable-shuffle", "--num-prompts", str(len(prompts)),
        "--max-concurrency", "1", "--ignore-eos", "--temperature", "0",
        "--percentile-metrics", "ttft,tpot,itl,e2el", "--disable-tqdm",
        "--save-result", "--save-detailed", "--result-dir", str(workdir), "--result-filename", "vllm-bench.json",
    ]  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    log_path = workdir / "vllm-bench.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-c", BENCH_RUNNER, *args], stdout=log, stderr=subprocess.STDOUT, env=env
        )
        samples = _sample_cpu(proc)
    if proc.returncode != 0:
        tail = log_path.read_text(encoding="utf-8", errors="replace")[-2000:]
        raise RuntimeError(f"vllm bench serve failed ({proc.returncode}): {tail}")
    result = json.loads((workdir / "vllm-bench.json").read_text(encoding="utf-8"))
    duration = float(result.get("duration") or 0.0)
    ttfts = [1e3 * t for t in result.get("ttfts", [])]
    pairs = zip(result.get("itls", []), result.get("output_lens", []), strict=False)
    tpots = [1e3 * sum(itls) / (out - 1) for itls, out in pairs if out and out > 1 and itls]
    summary = {
        "n": int(result.get("completed", 0)),
        "failures": [e for e in result.get("errors", []) if e],
        "ttft_mean": float(result["mean_ttft_ms"]),
        "ttft_median": float(result["median_ttft_ms"]),
        "tpot_mean": float(result["mean_tpot_ms"]),
        "tpot_median": float(result["median_tpot_ms"]),
        "prompt_tokens": result.get("total_input_tokens", 0) / max(1, int(result.get("completed", 0))),
        "output_tokens": result.get("total_output_tokens", 0) / max(1, int(result.get("completed", 0))),
        "ttft_median_from_detail": _median(ttfts),
        "tpot_median_from_detail": _median(tpots),
        "client_cpu_pct": _cpu_pct_over_last(samples, duration),
    }
    return summary, ["python", "-m", "vllm.benchmarks.serve (via add_cli_args/main)", *args]


def _process_cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of a live process (all its threads), from /proc."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _sample_cpu(proc: subprocess.Popen[bytes], every_s: float = 0.25) -> list[tuple[float, float]]:
    """Wait for ``proc``, sampling its CPU seconds; (monotonic time, CPU seconds) pairs."""
    samples: list[tuple[float, float]] = []
    while proc.poll() is None:
        cpu = _process_cpu_s(proc.pid)
        if cpu is not None:
            samples.append((time.monotonic(), cpu))
        try:
            proc.wait(every_s)
        except subprocess.TimeoutExpired:
            continue
    return samples


def _cpu_pct_over_last(samples: list[tuple[float, float]], duration_s: float) -> float:
    """CPU use (% of one core) over the last ``duration_s`` seconds sampled: the benchmark itself, not its
    start-up (imports, tokenizer, dataset), which comes first."""
    if len(samples) < 2 or duration_s <= 0:
        return float("nan")
    end_t, end_cpu = samples[-1]
    start_t, start_cpu = min(samples, key=lambda s: abs(s[0] - (end_t - duration_s)))
    return 100.0 * (end_cpu - start_cpu) / (end_t - start_t) if end_t > start_t else float("nan")


def _mean(values: list[float]) -> float:
    return float(np.mean(values)) if values else float("nan")


def _median(values: list[float]) -> float:
    return float(np.median(values)) if values else float("nan")


def _pct(value: float, reference: float) -> float:
    return 100.0 * (value / reference - 1.0) if reference else float("nan")


# ------------------------------------------------------------------------------------------ table


def side_by_side(phases: dict[str, dict[str, Any]], engine: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows: source × statistic: TTFT and per-output-token time (ms), % from vllm bench and from the engine.

    ``*_vs_engine_pct``: a client's mean against the engine's own histogram mean over the same phase, which
    takes out any drift of the engine's speed between phases (both clients share the machine with it).
    """
    bench = phases["vllm bench serve"]
    rows = []
    for name, figures in phases.items():
        own = engine[f"/metrics during {name}"]
        for stat in ("mean", "median"):
            ttft, tpot = figures[f"ttft_{stat}"], figures[f"tpot_{stat}"]
            rows.append({
                "source": name,
                "stat": stat,
                "n": figures["n"],
                "ttft_ms": ttft,
                "ttft_vs_bench_pct": _pct(ttft, bench[f"ttft_{stat}"]),
                "tpot_ms": tpot,
                "tpot_vs_bench_pct": _pct(tpot, bench[f"tpot_{stat}"]),
                "ttft_vs_engine_pct": _pct(ttft, own["ttft"]) if stat == "mean" else float("nan"),
                "tpot_vs_engine_pct": _pct(tpot, own["tpot"]) if stat == "mean" else float("nan"),
                "client_cpu_pct": figures.get("client_cpu_pct", float("nan")) if stat == "mean" else float("nan"),
            })  # fmt: skip
    for name, means in engine.items():
        phase = name.removeprefix("/metrics during ")
        reference = phases[phase]
        rows.append({
            "source": name,
            "stat": "mean",
            "n": means["ttft_n"],
            "ttft_ms": means["ttft"],
            "ttft_vs_bench_pct": _pct(means["ttft"], bench["ttft_mean"]),
            "tpot_ms": means["tpot"],
            "tpot_vs_bench_pct": _pct(means["tpot"], bench["tpot_mean"]),
            "itl_ms": means["itl"],
            "decode_per_token_ms": means["decode"] / (reference["output_tokens"] - 1)
            if reference["output_tokens"] > 1
            else float("nan"),
        })  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=10, help="prompts per phase (default 10)")
    parser.add_argument("--input-len", type=int, default=256, help="prompt tokens before the chat template")
    parser.add_argument("--output-len", type=int, default=128, help="output tokens (ignore_eos)")
    parser.add_argument("--warmups", type=int, default=2, help="unmeasured requests after the engine is ready")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--startup-timeout", type=float, default=600.0)
    parser.add_argument("--markdown", action="store_true", help="print a markdown table")
    parser.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    parser.add_argument("--workdir", type=Path, help="keep the engine log, dataset and vllm bench result here")
    args = parser.parse_args(argv)

    model = embedded_model_path()
    prompts = make_prompts(model, args.requests, args.input_len, args.seed)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="vs-vllm-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    phases: dict[str, dict[str, Any]] = {}
    engine: dict[str, dict[str, Any]] = {}
    started = time.time()
    with vllm_server(model, workdir / "engine.log", args.startup_timeout) as url:
        boot_s = time.time() - started
        name = str(model)
        warm = make_prompts(model, args.warmups, args.input_len, args.seed + 1)
        run_ours(url, name, warm, args.output_len)
        for phase in ("ours (pass 1)", "vllm bench serve", "ours (pass 2)"):
            before = histograms(url)
            if phase == "vllm bench serve":
                phases[phase], bench_cmd = run_vllm_bench(url, model, prompts, args.output_len, workdir)
            else:
                phases[phase] = run_ours(url, name, prompts, args.output_len)
            engine[f"/metrics during {phase}"] = histogram_means(before, histograms(url))
    rows = side_by_side(phases, engine)
    frame = pd.DataFrame(rows)
    if args.markdown:
        print(markdown_table(frame))
    else:
        print(frame.to_string(index=False, float_format=lambda x: f"{x:.3g}"))
    print()
    ours, bench = phases["ours (pass 1)"], phases["vllm bench serve"]
    print(
        f"requests per phase: {args.requests}; prompt tokens (server-counted, chat template included): "
        f"ours {ours['prompt_tokens']:.0f}, vllm bench {bench['prompt_tokens']:.0f}; output tokens: ours "
        f"{ours['output_tokens']:.0f}, vllm bench {bench['output_tokens']:.0f}; engine boot {boot_s:.0f} s; "
        f"workdir {workdir}"
    )
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {"phases": phases, "engine_metrics": engine, "rows": rows, "vllm_bench_args": bench_cmd,
                 "requests": args.requests, "input_len": args.input_len, "output_len": args.output_len,
                 "boot_s": boot_s, "workdir": str(workdir)},
                indent=1,
            ),
            encoding="utf-8",
        )  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
