"""The docker launcher, at the library level, on a real Docker daemon and the local CPU image.

The image comes from scripts/build-cpu-image.sh (built once, then cached by its tag). One real vLLM boot
(the float16 arm); the other containers exit at argument parsing or never run vLLM at all.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from pytest_kvcache.datafiles import embedded_model_path
from pytest_kvcache.engines.base import EngineError, free_port
from pytest_kvcache.engines.docker import (
    HF_CACHE_IN_CONTAINER,
    LABEL_ARM,
    LABEL_IMAGE_MOUNTS,
    LABEL_OWNER_PID,
    LABEL_OWNER_SCOPE,
    LABEL_OWNER_TICKS,
    LABEL_SESSION,
    ContainerSpec,
    DockerEngine,
    container_name,
    device_requests,
    image_mounts,
    owner_scope,
    reap_containers,
)
from pytest_kvcache.engines.process import proc_start_ticks

pytestmark = pytest.mark.engine

ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = ROOT / "scripts" / "build-cpu-image.sh"
MODEL_IN_CONTAINER = "/model"
#: The embedded model as the CPU image serves it (random weights, no torch.compile).
EMBEDDED = ["--model", MODEL_IN_CONTAINER, "--load-format", "dummy", "--enforce-eager"]
EMBEDDED_ENV = {"VLLM_CPU_KVCACHE_SPACE": "2", "HF_HUB_OFFLINE": "1"}


# ----------------------------------------------------------------------------------------- fixtures


@pytest.fixture
def run_id() -> str:
    return f"t{uuid.uuid4().hex[:10]}"


@pytest.fixture
def no_leaks(docker_client: Any, run_id: str) -> Iterator[None]:
    """After the test, no container of this run id is left (and none is left behind if one was)."""
    yield
    left = session_containers(docker_client, run_id)
    for container in left:
        container.remove(force=True)
    assert not left, f"containers left behind: {[c.name for c in left]}"


def session_containers(client: Any, run_id: str) -> list[Any]:
    return list(client.containers.list(all=True, filters={"label": f"{LABEL_SESSION}={run_id}"}))


def engine(image: str, run_id: str, tmp_path: Path, args: list[str], **kwargs: Any) -> DockerEngine:
    container = ContainerSpec(
        image,
        args,
        kwargs.pop("env", EMBEDDED_ENV),
        free_port(),
        model_mount=(embedded_model_path(), MODEL_IN_CONTAINER),
    )
    return DockerEngine(
        kwargs.pop("boot_id", "float16-1"),
        container,
        log_path=tmp_path / "engine.log",
        startup_timeout_s=kwargs.pop("startup_timeout_s", 300),
        run_id=run_id,
        arm=kwargs.pop("arm", "float16"),
        **kwargs,
    )


# ------------------------------------------------------------------------------------- real engines


@pytest.mark.usefixtures("no_leaks")
def test_boot_serves_the_declared_kv_dtype_and_leaves_nothing(
    cpu_image: str, docker_client: Any, run_id: str, tmp_path: Path
) -> None:
    env = {**EMBEDDED_ENV, "HF_TOKEN": "hf_secret_value"}
    spawned: list[str] = []
    stopped: list[str] = []
    eng = engine(
        cpu_image,
        run_id,
        tmp_path,
        [*EMBEDDED, "--enable-prompt-tokens-details", "--kv-cache-dtype", "float16"],
        env=env,
        on_spawn=lambda e: spawned.append(e.container_id or ""),
        on_stop=lambda e: stopped.append(e.boot_id),
    )
    try:
        eng.start()
        assert eng.alive()
        assert eng.ready_s is not None and eng.ready_s > 0
        metrics = httpx.get(eng.url + "/metrics", timeout=10).text
        info = [line for line in metrics.splitlines() if line.startswith("vllm:cache_config_info{")]
        assert info and 'cache_dtype="float16"' in info[0], info
        answer = httpx.post(
            eng.url + "/v1/completions",
            json={"model": MODEL_IN_CONTAINER, "prompt": "hello", "max_tokens": 4},
            timeout=60,
        )
        assert answer.status_code == 200, answer.text
        (container,) = session_containers(docker_client, run_id)
        assert container.labels[LABEL_ARM] == "float16"
        assert container.labels[LABEL_OWNER_PID] == str(os.getpid())
        ports = container.attrs["HostConfig"]["PortBindings"]
        assert ports == {f"{eng.port}/tcp": [{"HostIp": "127.0.0.1", "HostPort": str(eng.port)}]}
        assert container.attrs["HostConfig"]["IpcMode"] == "host"
    finally:
        eng.stop()
    eng.stop()  # idempotent

    described = eng.describe()
    assert described["launcher"] == "docker"
    assert described["image"] == cpu_image
    image = docker_client.images.get(cpu_image)
    assert described["image_id"] == image.id
    assert described["image_digest"] == image.id  # a local build has no RepoDigests
    assert described["container_id"] == spawned[0] and described["container_name"] == container_name(
        run_id, "float16-1"
    )
    config = described["config"]
    command = config["command"]
    assert command[command.index("--kv-cache-dtype") + 1] == "float16"
    assert command[-4:] == ["--host", "0.0.0.0", "--port", str(eng.port)]
    assert config["entrypoint"][-2:] == ["-m", "vllm.entrypoints.openai.api_server"]
    assert config["labels"][LABEL_SESSION] == run_id
    assert config["labels"][LABEL_OWNER_TICKS] == str(proc_start_ticks(os.getpid()))
    assert config["labels"][LABEL_OWNER_SCOPE] == owner_scope()
    assert config["env"]["HF_TOKEN"] == "***" and config["env"]["VLLM_CPU_KVCACHE_SPACE"] == "2"
    assert f"{embedded_model_path()}:{MODEL_IN_CONTAINER}:ro" in config["mounts"]
    assert any(m.startswith("/opt/kvcache-venv:") for m in config["mounts"])  # from the image's label
    assert described["ready_s"] == eng.ready_s
    assert described["stop"] == "terminated", described
    assert stopped == ["float16-1"]
    assert not eng.alive()
    assert not session_containers(docker_client, run_id)
    log = eng.log_path.read_text()
    assert "non-default args" in log and "kv_cache_dtype" in log  # vLLM's own output reached the file
    assert "hf_secret_value" not in log


@pytest.mark.usefixtures("no_leaks")
def test_engine_that_exits_at_startup_fails_fast_with_its_log(
    cpu_image: str, docker_client: Any, run_id: str, tmp_path: Path
) -> None:
    eng = engine(cpu_image, run_id, tmp_path, [*EMBEDDED, "--no-such-flag"], boot_id="bad-1")
    start = time.monotonic()
    with pytest.raises(EngineError) as info:
        eng.start()
    assert time.monotonic() - start < 120  # failed fast, not at the startup timeout
    err = info.value
    assert "bad-1: engine exited with code 2 during startup" in err.headline
    assert "unrecognized arguments: --no-such-flag" in err.headline  # the salient line
    assert "unrecognized arguments: --no-such-flag" in err.log_tail
    assert eng.describe()["exit_code"] == 2
    assert not session_containers(docker_client, run_id)


# ------------------------------------------------------------------------ containers without vLLM


@pytest.mark.usefixtures("no_leaks")
def test_missing_image_fails_fast_and_names_it(docker_client: Any, run_id: str, tmp_path: Path) -> None:
    image = f"pytest-kvcache/not-built:{run_id}"
    eng = engine(image, run_id, tmp_path, EMBEDDED, boot_id="auto-1")
    start = time.monotonic()
    with pytest.raises(EngineError) as info:
        eng.start()
    assert time.monotonic() - start < 10
    assert str(info.value) == f"auto-1: image {image!r} is not present locally (pass --kv-pull to pull it)"
    assert not session_containers(docker_client, run_id)


@pytest.mark.usefixtures("no_leaks")
def test_interrupt_after_create_removes_the_container(
    cpu_image: str, docker_client: Any, run_id: str, tmp_path: Path
) -> None:
    seen: list[int] = []

    def interrupt(e: DockerEngine) -> None:
        seen.append(len(session_containers(docker_client, run_id)))
        raise KeyboardInterrupt

    eng = engine(cpu_image, run_id, tmp_path, EMBEDDED, on_spawn=interrupt)
    with pytest.raises(KeyboardInterrupt):
        eng.start()
    assert seen == [1]  # it existed, and start() removed it on the way out
    assert eng.describe()["stop"] == "never started"
    assert not session_containers(docker_client, run_id)


def test_reap_removes_containers_of_dead_owners_only(cpu_image: str, docker_client: Any, run_id: str) -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    own = os.getpid()

    def sleeper(owner: int, ticks: int | None, suffix: str, scope: str | None = None) -> Any:
        return docker_client.containers.run(
            cpu_image,
            entrypoint=["sleep", "600"],
            command=[],
            name=container_name(run_id, suffix),
            labels={
                LABEL_SESSION: run_id,
                LABEL_ARM: "auto",
                LABEL_OWNER_PID: str(owner),
                LABEL_OWNER_TICKS: "" if ticks is None else str(ticks),
                LABEL_OWNER_SCOPE: owner_scope() if scope is None else scope,
            },
            detach=True,
        )

    orphan = sleeper(dead.pid, 12345, "orphan")
    mine = sleeper(own, proc_start_ticks(own), "mine")
    reused = sleeper(own, (proc_start_ticks(own) or 0) + 1, "reused-pid")  # same pid, another process
    # A dead pid, but of another pid namespace (pytest in a container sharing this daemon): not ours to judge.
    foreign = sleeper(dead.pid, 12345, "foreign", scope=owner_scope() + "-elsewhere")
    try:
        messages = reap_containers(docker_client)
        names = {c.name for c in session_containers(docker_client, run_id)}
        assert names == {mine.name, foreign.name}
        reaped = [m for m in messages if run_id in m]
        assert len(reaped) == 2 and any(orphan.name in m and f"dead pytest process {dead.pid}" in m for m in reaped)
        assert any(reused.name in m for m in reaped)
        # A session's own end-of-run sweep removes its containers regardless of the owner.
        messages = reap_containers(docker_client, only_dead_owners=False, session=run_id)
        assert len(messages) == 2 and any(mine.name in m for m in messages)
        assert not session_containers(docker_client, run_id)
    finally:
        for container in session_containers(docker_client, run_id):
            container.remove(force=True)


# ------------------------------------------------------------------------------- container spec only


def test_container_spec_gpu_requests_and_mounts(tmp_path: Path) -> None:
    """The create() arguments for a GPU box. Real GPU device requests cannot run on these machines (no GPU,
    no NVIDIA container runtime), so this checks the request Docker would receive, not a GPU container."""
    spec = ContainerSpec(
        image="vllm/vllm-openai:v0.25.1",
        engine_args=["--model", "Org/Model", "--tensor-parallel-size", "4", "--kv-cache-dtype", "fp8"],
        env={"VLLM_USE_V1": "1"},
        port=8123,
        hf_cache=tmp_path / "hf",
        gpus="all",
        shm_size=None,
    ).create_kwargs(container_name("20260101-120000-ab", "fp8/1"), {LABEL_SESSION: "20260101-120000-ab"})
    (request,) = spec["device_requests"]
    assert request["Count"] == -1 and request["Capabilities"] == [["gpu"]] and not request["DeviceIDs"]
    assert spec["command"] == [
        "--model",
        "Org/Model",
        "--tensor-parallel-size",
        "4",
        "--kv-cache-dtype",
        "fp8",
        "--host",
        "0.0.0.0",
        "--port",
        "8123",
    ]
    assert spec["ports"] == {"8123/tcp": ("127.0.0.1", 8123)}
    assert spec["ipc_mode"] == "host" and "shm_size" not in spec
    assert spec["volumes"] == [f"{tmp_path / 'hf'}:{HF_CACHE_IN_CONTAINER}:rw"]
    assert spec["name"] == "kvcache-20260101-120000-ab-fp8-1"

    spec = ContainerSpec(
        image="img",
        engine_args=["--model", "/models/m"],
        env={},
        port=1,
        model_mount=("/data/m", "/models/m"),
        gpus="0,1,2,3",
        shm_size="16g",
    ).create_kwargs("n", {})
    (request,) = spec["device_requests"]
    assert request["DeviceIDs"] == ["0", "1", "2", "3"] and request["Capabilities"] == [["gpu"]]
    assert request["Count"] in (None, 0)
    assert spec["shm_size"] == "16g" and "ipc_mode" not in spec
    assert spec["volumes"] == ["/data/m:/models/m:ro"]

    (request,) = device_requests("GPU-1a2b, GPU-3c4d")
    assert request["DeviceIDs"] == ["GPU-1a2b", "GPU-3c4d"]
    assert device_requests(None) == [] and device_requests("none") == []
    with pytest.raises(EngineError, match="--kv-gpus"):
        device_requests("0,,1")


def test_image_mount_label_and_names() -> None:
    assert image_mounts({LABEL_IMAGE_MOUNTS: "/opt/v:/opt/v:ro,/a:/b"}) == [
        ("/opt/v", "/opt/v", "ro"),
        ("/a", "/b", "ro"),
    ]
    assert image_mounts(None) == [] and image_mounts({}) == []
    name = container_name("run id/1", "auto:1")
    assert re.fullmatch(r"[a-zA-Z0-9][a-zA-Z0-9_.-]*", name) and name == "kvcache-run-id-1-auto-1"
