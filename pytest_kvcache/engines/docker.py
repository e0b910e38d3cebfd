"""The docker launcher: the engine in a container of an image (``vllm/vllm-openai`` or a local build).

The image's entrypoint is the OpenAI API server; the engine arguments (``--model X`` explicitly, the arm's
dtype …) are appended as the container's command, plus ``--host 0.0.0.0 --port PORT``. The port is
published on 127.0.0.1 only. Every container carries labels naming the pytest session, the arm and the
owning pytest process, so :func:`reap_containers` can remove what a dead session left behind.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import socket
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import docker
import docker.errors
import docker.types

from pytest_kvcache.engines.base import HOST, EngineError, redact_argv, redact_env, started
from pytest_kvcache.engines.process import proc_start_ticks

LABEL_SESSION = "pytest-kvcache.session"
LABEL_ARM = "pytest-kvcache.arm"
LABEL_BOOT = "pytest-kvcache.boot"
LABEL_OWNER_PID = "pytest-kvcache.owner-pid"
LABEL_OWNER_TICKS = "pytest-kvcache.owner-start-ticks"
#: Where the owner's pid means something: the kernel's boot id and the owner's pid namespace. A reaper in
#: another scope (another pid namespace or host sharing the daemon) cannot judge the owner and leaves it.
LABEL_OWNER_SCOPE = "pytest-kvcache.owner-scope"
#: An image label: ``HOST:CONTAINER[:MODE],…`` host paths the image needs mounted (the local CPU image's
#: engine venv, see scripts/build-cpu-image.sh). The launcher adds them by itself.
LABEL_IMAGE_MOUNTS = "pytest-kvcache.host-mounts"

HF_CACHE_IN_CONTAINER = "/root/.cache/huggingface"
#: Seconds between SIGTERM and SIGKILL when a container is stopped.
STOP_TIMEOUT_S = 20
#: Seconds to wait for the log streamer to drain once the container has stopped.
LOG_DRAIN_S = 5.0

Mount = tuple[str, str, str]  # host path, container path, "ro" | "rw"


# ----------------------------------------------------------------------------------------- helpers


def docker_available() -> str | None:
    """None when a Docker daemon answers; otherwise why not, in words."""
    # A local socket is checked first: docker-py leaks a socket when it cannot connect.
    host = os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
    if host.startswith("unix://"):
        path = host.removeprefix("unix://")
        if not os.path.exists(path):
            return f"no Docker daemon answers (no socket at {path}; start dockerd or set DOCKER_HOST)"
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(5.0)
            try:
                sock.connect(path)
            except OSError as exc:
                return f"no Docker daemon answers at {path} ({exc})"
    client = None
    try:
        client = docker.from_env(timeout=10)
        client.ping()
    except docker.errors.DockerException as exc:
        return f"no Docker daemon answers ({exc})"
    except Exception as exc:  # requests' errors when the socket is there but the daemon is not
        return f"no Docker daemon answers ({type(exc).__name__}: {exc})"
    finally:
        if client is not None:
            client.close()
    return None


def container_name(run_id: str, boot_id: str) -> str:
    """``kvcache-<run_id>-<boot_id>`` reduced to what Docker accepts (``[a-zA-Z0-9][a-zA-Z0-9_.-]*``)."""
    name = re.sub(r"[^a-zA-Z0-9_.-]+", "-", f"kvcache-{run_id}-{boot_id}").strip("-.")
    return name[:200]


def device_requests(gpus: str | None) -> list[docker.types.DeviceRequest]:
    """``"all"`` → every GPU; ``"0,1"`` or ``"GPU-uuid,…"`` → those devices; None or ``""`` → no GPU."""
    if gpus is None or not gpus.strip() or gpus.strip().lower() == "none":
        return []
    if gpus.strip().lower() == "all":
        return [docker.types.DeviceRequest(count=-1, capabilities=[["gpu"]])]
    ids = [g.strip() for g in gpus.split(",")]
    if any(not g for g in ids):
        raise EngineError(f"--kv-gpus={gpus!r}: expected 'all' or a comma-separated list of GPU indices or UUIDs")
    return [docker.types.DeviceRequest(device_ids=ids, capabilities=[["gpu"]])]


def image_mounts(labels: Mapping[str, str] | None) -> list[Mount]:
    """The host mounts an image asks for through its ``pytest-kvcache.host-mounts`` label."""
    raw = (labels or {}).get(LABEL_IMAGE_MOUNTS, "")
    mounts: list[Mount] = []
    for item in filter(None, (part.strip() for part in raw.split(","))):
        host, _, rest = item.partition(":")
        target, _, mode = rest.partition(":")
        if host and target:
            mounts.append((host, target, mode or "ro"))
    return mounts


def owner_scope() -> str:
    """``<boot id> <pid namespace>`` of this process: where its pid can be checked."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""
    return f"{boot} {namespace}"


def owner_labels() -> dict[str, str]:
    pid = os.getpid()
    ticks = proc_start_ticks(pid)
    return {
        LABEL_OWNER_PID: str(pid),
        LABEL_OWNER_TICKS: "" if ticks is None else str(ticks),
        LABEL_OWNER_SCOPE: owner_scope(),
    }


@dataclass(frozen=True)
class ContainerSpec:
    """What one engine container runs: its image, the engine's arguments and environment, its port, mounts and
    GPUs. :meth:`create_kwargs` gives the keyword arguments of ``client.containers.create()``."""

    image: str
    engine_args: Sequence[str]
    env: Mapping[str, str]
    port: int
    model_mount: tuple[str | Path, str] | None = None
    hf_cache: Path | None = None
    compile_cache: tuple[Path, str] | None = None
    gpus: str | None = None
    shm_size: str | None = None

    def create_kwargs(self, name: str, labels: Mapping[str, str], image_mounts: Sequence[Mount] = ()) -> dict[str, Any]:
        """For the container ``name`` with ``labels``; ``image_mounts``: what its image's label asks for."""
        volumes = [f"{host}:{target}:{mode}" for host, target, mode in image_mounts]
        if self.model_mount is not None:
            volumes.append(f"{Path(self.model_mount[0]).expanduser()}:{self.model_mount[1]}:ro")
        if self.hf_cache is not None:
            volumes.append(f"{Path(self.hf_cache).expanduser()}:{HF_CACHE_IN_CONTAINER}:rw")
        if self.compile_cache is not None:
            volumes.append(f"{self.compile_cache[0]}:{self.compile_cache[1]}:rw")
        port = self.port
        spec: dict[str, Any] = {
            "image": self.image,
            "command": [*self.engine_args, "--host", "0.0.0.0", "--port", str(port)],
            "name": name,
            "labels": dict(labels),
            "environment": dict(self.env),
            "ports": {f"{port}/tcp": (HOST, port)},
            "volumes": volumes,
            "device_requests": device_requests(self.gpus),
            "detach": True,
        }
        if self.shm_size is None:
            spec["ipc_mode"] = "host"
        else:
            spec["shm_size"] = self.shm_size
        return spec


def _owner_alive(pid_label: str | None, ticks_label: str | None) -> bool:
    try:
        pid = int(pid_label or "")
    except ValueError:
        return False
    ticks = proc_start_ticks(pid)
    if ticks is None:
        return False
    return not ticks_label or ticks_label == str(ticks)


def reap_containers(
    client: docker.DockerClient, *, only_dead_owners: bool = True, session: str | None = None
) -> list[str]:
    """Remove containers labelled ``pytest-kvcache.session`` (of ``session`` when given).

    With ``only_dead_owners`` (the default) only those whose owning pytest process is gone — its pid no
    longer exists or now belongs to a process started at another time. Containers labelled by a process in
    another scope (another pid namespace or host sharing this daemon) are left alone: their owner's pid
    cannot be checked from here. Returns one message per container.
    """
    label = LABEL_SESSION if session is None else f"{LABEL_SESSION}={session}"
    scope = owner_scope()
    messages: list[str] = []
    try:
        containers = client.containers.list(all=True, filters={"label": label})
    except docker.errors.DockerException as exc:
        return [f"could not list pytest-kvcache containers: {exc}"]
    for container in containers:
        labels = container.labels or {}
        pid = labels.get(LABEL_OWNER_PID)
        if only_dead_owners:
            if labels.get(LABEL_OWNER_SCOPE, scope) not in (scope, ""):
                continue
            if _owner_alive(pid, labels.get(LABEL_OWNER_TICKS)):
                continue
        try:
            container.remove(force=True)
        except docker.errors.NotFound:
            continue
        except docker.errors.APIError as exc:
            messages.append(f"could not remove container {container.name}: {exc.explanation or exc}")
            continue
        messages.append(
            f"removed container {container.name} (session {labels.get(LABEL_SESSION)}, arm "
            f"{labels.get(LABEL_ARM)}, {container.status}) left by "
            + (f"dead pytest process {pid}" if only_dead_owners else f"pytest process {pid}")
        )
    return messages


# ------------------------------------------------------------------------------------------ engine


class DockerEngine:
    """One engine container: created, started, waited for, logged to ``log_path``, stopped and removed."""

    def __init__(
        self,
        boot_id: str,
        container: ContainerSpec,
        *,
        log_path: Path,
        startup_timeout_s: float,
        run_id: str,
        arm: str,
        pull: bool = False,
        client: docker.DockerClient | None = None,
        on_spawn: Callable[[DockerEngine], None] | None = None,
        on_stop: Callable[[DockerEngine], None] | None = None,
    ) -> None:
        self.boot_id = boot_id
        self.container = container
        self.image = container.image
        self.port = container.port
        self.log_path = log_path
        self.startup_timeout_s = startup_timeout_s
        self.run_id = run_id
        self.arm = arm
        self.pull = pull
        self.name = container_name(run_id, boot_id)
        self.labels = {LABEL_SESSION: run_id, LABEL_ARM: arm, LABEL_BOOT: boot_id, **owner_labels()}
        self.ready_s: float | None = None
        self.stop_outcome: str | None = None
        self.exit_status: int | None = None
        self.container_id: str | None = None
        self.spec: dict[str, Any] | None = None
        self._image_attrs: dict[str, Any] = {}
        self._client = client
        self._owns_client = client is None
        self._on_spawn = on_spawn
        self._on_stop = on_stop
        self._container: Any = None
        self._created = False
        self._log: IO[bytes] | None = None
        self._log_thread: threading.Thread | None = None
        #: Seconds between SIGTERM and SIGKILL in ``stop()``; the run shortens it once it is interrupted.
        self.term_grace_s = float(STOP_TIMEOUT_S)

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def client(self) -> docker.DockerClient:
        if self._client is None:
            try:
                self._client = docker.from_env()
            except docker.errors.DockerException as exc:
                raise EngineError(f"{self.boot_id}: no Docker daemon answers ({exc})") from None
        return self._client

    # ------------------------------------------------------------------------------------ start

    def start(self) -> None:
        started(self, self._launch)

    def _launch(self, log: IO[bytes]) -> None:
        self._log = log
        image = self._resolve_image()
        self._image_attrs = dict(image.attrs)
        image_labels = (self._image_attrs.get("Config") or {}).get("Labels") or {}
        self.spec = self.container.create_kwargs(self.name, self.labels, image_mounts(image_labels))
        entrypoint = (self._image_attrs.get("Config") or {}).get("Entrypoint") or []
        self._write_log(
            f"# pytest-kvcache: docker container {self.name} of {self.image}: "
            f"{' '.join(redact_argv([*entrypoint, *self.spec['command']]))}\n"
        )
        self._created = True  # from here on stop() looks the container up by name if need be
        try:
            self._container = self.client.containers.create(**self.spec)
        except docker.errors.APIError as exc:
            self._created = False  # nothing of ours exists (a name conflict names someone else's container)
            raise EngineError(f"{self.boot_id}: cannot create the container {self.name}: {_explain(exc)}") from None
        self.container_id = self._container.id
        if self._on_spawn is not None:
            self._on_spawn(self)
        try:
            self._container.start()
        except docker.errors.APIError as exc:
            raise EngineError(f"{self.boot_id}: cannot start the container {self.name}: {_explain(exc)}") from None
        self._log_thread = threading.Thread(
            target=self._stream_logs, args=(self._container,), name=f"kvcache-log-{self.boot_id}", daemon=True
        )
        self._log_thread.start()

    def _resolve_image(self) -> Any:
        try:
            return self.client.images.get(self.image)
        except docker.errors.ImageNotFound:
            if not self.pull:
                raise EngineError(
                    f"{self.boot_id}: image {self.image!r} is not present locally (pass --kv-pull to pull it)"
                ) from None
        except docker.errors.APIError as exc:
            raise EngineError(f"{self.boot_id}: cannot inspect image {self.image!r}: {_explain(exc)}") from None
        self._write_log(f"# pytest-kvcache: pulling {self.image}\n")
        try:
            return self.client.images.pull(self.image)
        except docker.errors.APIError as exc:
            raise EngineError(f"{self.boot_id}: cannot pull image {self.image!r}: {_explain(exc)}") from None

    def _write_log(self, text: str) -> None:
        if self._log is not None:
            self._log.write(text.encode())
            self._log.flush()

    def _stream_logs(self, container: Any) -> None:
        """Copy the container's output into the log file until the container stops."""
        try:
            for chunk in container.logs(stream=True, follow=True):
                log = self._log
                if log is None:
                    return
                log.write(chunk)
                log.flush()
        except Exception:  # the container was removed, the daemon went away, the file was closed
            return

    def _drain_logs(self) -> None:
        thread = self._log_thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=LOG_DRAIN_S)

    # ----------------------------------------------------------------------------------- status

    def _state(self) -> dict[str, Any] | None:
        container = self._container
        if container is None:
            return None
        try:
            container.reload()
        except docker.errors.NotFound:
            return {"Status": "removed", "ExitCode": -1}
        except docker.errors.DockerException:
            return {}
        state: dict[str, Any] = container.attrs.get("State") or {}
        return state

    def exit_code(self) -> int | None:
        """The container's exit code once it stopped (after its last log lines were written); else None."""
        state = self._state()
        if state is None or state.get("Status") not in ("exited", "dead", "removed"):
            return None
        self._drain_logs()
        code = state.get("ExitCode")
        self.exit_status = code if isinstance(code, int) else -1
        return self.exit_status

    def alive(self) -> bool:
        state = self._state()  # a daemon that does not answer for a moment is not a dead engine
        return state is not None and state.get("Status") not in ("exited", "dead", "removed")

    # ------------------------------------------------------------------------------------- stop

    def stop(self) -> None:
        container, self._container = self._container, None
        if container is None and self._created and self._client is not None:
            # Interrupted inside create(): the container may exist without us holding it.
            with contextlib.suppress(docker.errors.DockerException):
                container = self._client.containers.get(self.name)
        self._created = False
        if container is not None:
            self.stop_outcome = self._stop_container(container)
            if self._on_stop is not None:
                self._on_stop(self)
        self._drain_logs()
        self._log_thread = None
        log, self._log = self._log, None
        if log is not None:
            log.close()
        if self._owns_client and self._client is not None:
            with contextlib.suppress(Exception):
                self._client.close()
            self._client = None

    def _stop_container(self, container: Any) -> str:
        outcome = "removed"
        try:
            container.reload()
            status = container.status
            if status in ("running", "restarting", "paused"):
                container.stop(timeout=max(1, math.ceil(self.term_grace_s)))  # SIGTERM, SIGKILL after it
                container.reload()
                code = (container.attrs.get("State") or {}).get("ExitCode")
                self.exit_status = code
                outcome = "killed" if code == 137 else "terminated"
            else:
                code = (container.attrs.get("State") or {}).get("ExitCode")
                self.exit_status = code
                outcome = "never started" if status == "created" else f"already {status}"
        except docker.errors.NotFound:
            return "already gone"
        except docker.errors.DockerException as exc:
            outcome = f"stop failed ({exc}); forced"
        try:
            container.remove(force=True)
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError as exc:
            if "already in progress" not in str(exc):
                outcome += f"; remove failed: {_explain(exc)}"
        return outcome

    # ---------------------------------------------------------------------------------- evidence

    def describe(self) -> dict[str, Any]:
        attrs = self._image_attrs
        digests = list(attrs.get("RepoDigests") or [])
        config = attrs.get("Config") or {}
        spec = self.spec or {}
        return {
            "launcher": "docker",
            "url": self.url,
            "image": self.image,
            "image_id": attrs.get("Id"),
            "image_digest": digests[0] if digests else attrs.get("Id"),
            "image_repo_digests": digests,
            "container_id": self.container_id,
            "container_name": self.name,
            "config": {
                "entrypoint": config.get("Entrypoint"),
                "command": redact_argv(spec.get("command") or [*self.container.engine_args]),
                "env": redact_env(self.container.env),
                "labels": dict(self.labels),
                "ports": {k: list(v) for k, v in (spec.get("ports") or {}).items()},
                "device_requests": [dict(r) for r in spec.get("device_requests") or []],
                "mounts": list(spec.get("volumes") or []),
                "ipc_mode": spec.get("ipc_mode"),
                "shm_size": spec.get("shm_size"),
            },
            "ready_s": self.ready_s,
            "stop": self.stop_outcome,
            "exit_code": self.exit_status,
        }


def _explain(exc: docker.errors.APIError) -> str:
    explanation = exc.explanation
    if isinstance(explanation, bytes):
        explanation = explanation.decode(errors="replace")
    return str(explanation or exc)
