"""Launchers: how an arm's engine is started (process, docker, an external endpoint), by the run's engine kind."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from pytest_kvcache.config.arms import Arm
from pytest_kvcache.config.plan import Boot
from pytest_kvcache.config.settings import Settings
from pytest_kvcache.engines.base import HOST, Engine, EngineError, free_port
from pytest_kvcache.engines.external import ExternalEngine
from pytest_kvcache.engines.kinds.base import EngineProfile, Kind, get_kind
from pytest_kvcache.engines.process import ProcessEngine
from pytest_kvcache.engines.registry import EngineRegistry


def engine_kind(settings: Settings) -> Kind:
    """The registered kind every arm of this run is (``--kv-engine``)."""
    return get_kind(settings.engine)


def engine_profile(settings: Settings) -> EngineProfile:
    return engine_kind(settings).profile


def prepare_embedded(settings: Settings, on_convert: Callable[[str], None] | None = None) -> str | None:
    """Before any boot: what the run's engines will serve of the embedded model, found, checked and (for
    vLLM) converted now; the error in one line when it cannot be (the plugin makes it a usage error)."""
    if not settings.active or not settings.embedded or settings.launcher == "external":
        return None
    from pytest_kvcache.engines.trained_model import TrainedModelError

    try:
        engine_kind(settings).prepare_embedded(settings, on_convert)
    except (TrainedModelError, OSError) as exc:
        return str(exc)
    return None


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
        kind = engine_kind(settings)
        cmd, args, env_overrides = kind.command(settings, boot, log_path)
        cards = settings.lane_cards(boot.lane)
        if cards is not None:  # this lane's GPU group (pytest-xdist): its engines see only those cards
            env_overrides["CUDA_VISIBLE_DEVICES"] = cards
        port = lane_port(settings, boot.lane)
        argv = [*cmd, *args, "--host", HOST, "--port", str(port)]
        inherited = dict(os.environ)
        if settings.kv_budget(boot.arm) is not None:  # what would override the budget (vLLM's CPU build's space)
            for name in kind.budget_env:
                if name not in env_overrides:
                    inherited.pop(name, None)
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
        from pytest_kvcache.engines.docker import ContainerSpec, DockerEngine

        image = boot.arm.image or settings.image
        assert image is not None  # settings refuse a docker arm without an image
        spec = engine_kind(settings).container(settings, boot)
        container = ContainerSpec(
            image,
            spec.args,
            spec.env,
            lane_port(settings, boot.lane),
            model_mount=spec.model_mount,
            hf_cache=settings.hf_cache if settings.hf_cache and settings.hf_cache.is_dir() else None,
            compile_cache=spec.compile_cache,
            gpus=settings.lane_cards(boot.lane) or settings.gpus,
            shm_size=settings.shm_size,
        )
        return DockerEngine(
            boot.boot_id,
            container,
            log_path=log_path,
            startup_timeout_s=settings.startup_timeout_s,
            run_id=arm_dir.parent.parent.name,
            arm=boot.arm.name,
            pull=settings.pull,
        )
    raise EngineError(f"{boot.boot_id}: unknown launcher {settings.launcher!r}")
