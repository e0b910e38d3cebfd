"""The run's monitors of the machine: the GPU state (power limit, idle check, settle, the sampler behind
``gpu.jsonl``) with each boot's snapshots before, at ready and after, and the host-CPU sampler
(``hostcpu.jsonl``: CPU busy outside the engines and this process)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from pytest_kvcache.config.settings import Settings
from pytest_kvcache.engines import visible_devices
from pytest_kvcache.engines.base import Engine
from pytest_kvcache.gpu.snapshot import diff as gpu_diff
from pytest_kvcache.gpu.snapshot import memory_used_mib
from pytest_kvcache.gpu.state import GpuOptions, GpuState
from pytest_kvcache.model.evidence import Evidence, GpuSnapshot
from pytest_kvcache.run.folder import RunFolder
from pytest_kvcache.run.hostload import HostSampler, MeasuredProcesses

#: ``single``: one process boots and measures; under pytest-xdist a ``worker`` boots and measures its lane's
#: blocks and forwards every write (``run.forward``), and the ``controller`` collects them into the run's
#: one folder and builds the report, booting nothing. (Here: what the GPU monitor opens depends on it.)
Role = Literal["single", "controller", "worker"]


def open_gpu(settings: Settings, path: Path, role: Role, lane: int, lanes_used: set[int]) -> Any:
    """The run's GpuState, opened on every card its boots will see (a worker: its own lane's)."""
    st = settings
    gpu = GpuState(
        GpuOptions(
            power_limit=st.gpu_power_limit,
            require_idle=st.gpu_require_idle,
            settle=st.gpu_settle,
            hz=st.gpu_hz,
            max_temp_c=st.gpu_max_temp,
        )
    )
    lanes = lanes_used if role == "single" else {lane}
    gpu.open(path, devices=[visible_devices(st, arm, lane) for arm in st.arms for lane in lanes])
    return gpu


def start_hostcpu(settings: Settings, folder: RunFolder, engines: Callable[[], list[Engine]]) -> HostSampler | None:
    """The host-CPU sampler, started, when ``--kv-host-cpu-max`` asks for it; ``engines`` is asked at every
    reading (the processes measured are the engines running then)."""
    if settings.host_cpu_max_pct is None or settings.host_cpu_action == "off":
        return None
    measured = MeasuredProcesses(engines)
    return HostSampler(measured, lambda line: folder.log("hostcpu.jsonl", line)).start()


def at_ready(gpu: Any, cards: Any, evidence: Evidence) -> None:
    """The boot's GPU snapshot once its engine is ready, and the VRAM in use then."""
    ready: GpuSnapshot = gpu.snapshot(cards)
    evidence["gpu_ready"] = ready
    evidence["vram_ready_mib"] = memory_used_mib(ready)


def vram_in_use(gpu: Any, cards: Any) -> dict[str, int]:
    """VRAM in use on the boot's cards now (before its engine stops); empty without a GPU."""
    return memory_used_mib(gpu.snapshot(cards)) if gpu is not None and gpu.available else {}


def after_stop(gpu: Any, cards: Any, evidence: Evidence, engine: Engine, vram_before_stop: dict[str, int]) -> None:
    """The boot's GPU snapshot after its engine stopped, what changed since before it booted (other
    processes' VRAM, clocks …), and the state's warnings."""
    after: GpuSnapshot = gpu.snapshot(cards)
    evidence["gpu_after"] = after
    evidence["vram_before_stop_mib"] = vram_before_stop
    own = [p for p in [getattr(engine, "pid", None)] if isinstance(p, int)]
    before = evidence.get("gpu_before") or {}
    if before.get("gpu"):
        evidence["gpu_changes"] = gpu_diff(before, after, own_pids=own)
    evidence.setdefault("warnings", []).extend(gpu.check(after))
