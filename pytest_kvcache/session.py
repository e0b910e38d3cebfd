"""The pytest side of a run: hook implementations only. The run itself — folder, boots, records,
agreement — is :class:`pytest_kvcache.run.run.Run`; the report is :mod:`pytest_kvcache.report.pipeline`.

Imported by the plugin only once ``--kv-arms`` makes it active (it pulls in the run and report layers).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections import Counter
from collections.abc import Generator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

import pytest

from pytest_kvcache import interrupt
from pytest_kvcache.config.context import planned_points
from pytest_kvcache.config.grammars import GateError
from pytest_kvcache.config.plan import Boot, BootPlan
from pytest_kvcache.config.settings import Settings
from pytest_kvcache.distributed import EVENTS_KEY, LANE_KEY
from pytest_kvcache.engines import prepare_embedded
from pytest_kvcache.engines.base import Engine
from pytest_kvcache.engines.kinds.base import DEFAULT_KIND, get_kind
from pytest_kvcache.engines.registry import EngineRegistry
from pytest_kvcache.model.base import Json
from pytest_kvcache.model.report import Report
from pytest_kvcache.probes import registry as probe_registry
from pytest_kvcache.run.forward import ForwardingListener, Outbox
from pytest_kvcache.run.lanes import Lanes
from pytest_kvcache.run.plan_text import budget_text, kv_plan_lines
from pytest_kvcache.run.progress import Mode, Progress
from pytest_kvcache.run.run import Run
from pytest_kvcache.stored import Stored

if TYPE_CHECKING:
    from pytest_kvcache.distributed import Role
    from pytest_kvcache.report.pipeline import Outcome


class TerminalWriter:
    """``run.progress.Writer`` over pytest's terminal reporter (found when first used)."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config

    def _reporter(self) -> Any:
        return self.config.pluginmanager.get_plugin("terminalreporter")

    def isatty(self) -> bool:
        reporter = self._reporter()
        return bool(reporter is not None and reporter.isatty)

    def _shown(self) -> contextlib.AbstractContextManager[object]:
        """Output capture off while writing: boots and requests happen inside tests (fixture setup)."""
        capman = self.config.pluginmanager.getplugin("capturemanager")
        return capman.global_and_fixture_disabled() if capman is not None else contextlib.nullcontext()

    def line(self, text: str) -> None:
        reporter = self._reporter()
        if reporter is None:
            return
        with self._shown():
            writer = getattr(reporter, "_tw", None)
            if reporter.currentfspath is None and writer is not None and writer.width_of_current_line:
                reporter.write("\n")  # after pytest's progress dots (write_line breaks the line after a path)
            reporter.write_line(text)
            reporter.currentfspath = None  # pytest starts its next dots on a line of their own

    def rewrite(self, text: str) -> None:
        reporter = self._reporter()
        if reporter is not None:
            with self._shown():
                reporter.rewrite(text, erase=True)


def _hurry(signum: int, frame: FrameType | None) -> None:
    """SIGINT while an interrupted run winds down: engines being stopped are killed now (no exception)."""
    interrupt.HURRY.set()


def _restore_sigint() -> None:
    """The session's end: Python's own SIGINT handler again, and no interrupt left for a later session in the
    same process (pytester's in-process runs)."""
    if signal.getsignal(signal.SIGINT) in (_hurry, interrupt.on_sigint):
        signal.signal(signal.SIGINT, signal.default_int_handler)
    interrupt.clear()


def boot_of(item: pytest.Item | None) -> Boot | None:
    callspec = getattr(item, "callspec", None)
    value = callspec.params.get("kv_arm") if callspec is not None else None
    return value if isinstance(value, Boot) else None


def _probe_order(item: pytest.Item) -> int:
    """Within one boot, probes run in the registry's order (the seed's: short, prefill, agentic, …)."""
    orders = [s.order for m in item.iter_markers() if (s := probe_registry.get(m.name)) is not None]
    return min(orders) if orders else 1000


@dataclass(eq=False)
class KvSession:
    """Registered as the ``kvcache-session`` plugin while a run is active; delegates to :class:`Run`."""

    config: pytest.Config
    settings: Settings
    #: The pytest-xdist role (None: a plain single-process run).
    role: Role | None = None
    #: The boot plan, built once at configure from the resolved settings.
    boot_plan: BootPlan = field(kw_only=True)
    #: The run store and the stored runs --kv-compare/--kv-noise name, opened at configure.
    stored: Stored | None = field(default=None, kw_only=True)
    run: Run = field(init=False)
    outcome: Outcome | None = None
    _previous_sigterm: Any = None
    _machine_info: Json = None
    #: the markers of the probes (and probe groups: ``depth``) the collected tests measure
    _planned: frozenset[str] = frozenset()
    #: A pytest-xdist worker refused the run on its host (exit 4): no report of an empty run.
    usage_error: str | None = None

    def __post_init__(self) -> None:
        kind = self.role.kind if self.role is not None else "single"
        worker = kind == "worker"
        self.run = Run(
            self.settings,
            make_engine=self._make_engine,
            machine_info=self._benchmark_machine_info,
            role="worker" if worker else "controller" if kind == "controller" else "single",
            lane=self.role.lane if self.role is not None else 0,
            run_id=self.role.run_id if self.role is not None else None,
            outbox=Outbox() if worker else None,
            boot_plan=self.boot_plan,
        )
        #: what a pytest-xdist controller learns of its lanes (the scheduler and its hooks report into it)
        self.lanes = Lanes(self.run, self.boot_plan, self.settings)
        self.progress: Progress | None = None
        if worker:  # its progress is the controller's to tell: boots go there with the records
            assert self.run.outbox is not None
            self.run.listeners.append(ForwardingListener(self.run.outbox))
        elif self.settings.progress != "off":
            writer = TerminalWriter(self.config)
            mode: Mode = "live" if self.settings.progress == "auto" and writer.isatty() else "lines"
            quiet = self.config.get_verbosity() < 0
            self.progress = Progress(writer, self.settings, mode=mode, quiet=quiet)
            self.run.listeners.append(self.progress)

    def _make_engine(self, boot: Boot, arm_dir: Path, registry: EngineRegistry) -> Engine | None:
        engine: Engine | None = self.config.hook.pytest_kvcache_make_engine(
            config=self.config, settings=self.settings, boot=boot, arm_dir=arm_dir, registry=registry
        )
        return engine

    def _benchmark_machine_info(self) -> Json:
        """pytest-benchmark's machine and commit info, as evidence of where the run happened."""
        bs = self.config.pluginmanager.getplugin("pytest-benchmark")  # the BenchmarkSession it registers
        if bs is None:
            return None
        if self._machine_info is None:
            try:
                from pytest_benchmark.utils import get_commit_info

                self._machine_info = {"machine": bs.get_machine_info(), "commit": get_commit_info()}  # type: ignore[no-untyped-call]
            except Exception as exc:  # evidence only: never fail a run over it
                self._machine_info = {"error": f"{type(exc).__name__}: {exc}"}
        return self._machine_info

    # ------------------------------------------------------------------ signals

    def install(self) -> None:
        interrupt.clear()
        if threading.current_thread() is threading.main_thread():
            self._previous_sigterm = signal.signal(signal.SIGTERM, self._on_sigterm)
            if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
                # Python's own, plus a flag the measuring loops read: a KeyboardInterrupt raised inside a
                # finalizer is lost, the flag is not (pytest_kvcache.interrupt)
                signal.signal(signal.SIGINT, interrupt.on_sigint)
            # registered now so that it runs last: pytest's own unconfigure (gc passes: seconds) comes before it
            self.config.add_cleanup(_restore_sigint)

    def interrupted(self) -> None:
        """The run is interrupted (Ctrl-C, or SIGTERM) and winds down. A further Ctrl-C from now on only hurries
        the engines' stop: raised as a second KeyboardInterrupt it would escape pytest's handling of the first
        (exit 130 and a traceback instead of exit 2 and the one line)."""
        self.run.interrupted = True
        interrupt.INTERRUPTED.set()
        main = threading.current_thread() is threading.main_thread()
        if main and signal.getsignal(signal.SIGINT) in (signal.default_int_handler, interrupt.on_sigint):
            signal.signal(signal.SIGINT, _hurry)

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        # Unwind pytest like Ctrl-C does, so fixtures finalize and every engine is stopped.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if self.run.interrupted:  # after a Ctrl-C, while the run winds down: hurry, do not unwind again
            _hurry(signum, frame)
            return
        self.interrupted()
        raise KeyboardInterrupt("SIGTERM")

    def uninstall(self) -> None:
        self.run.close(status="interrupted" if self.run.interrupted else "finished")
        if self._previous_sigterm is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._previous_sigterm)
            self._previous_sigterm = None

    # ------------------------------------------------------------------ collection

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        """Group tests by boot explicitly: all of arm A, then all of arm B (stable within a boot)."""
        order = {b.boot_id: b.index for b in self.boot_plan}

        def key(item: pytest.Item) -> tuple[int, int]:
            boot = boot_of(item)
            return (-1 if boot is None else order.get(boot.boot_id, len(order))), _probe_order(item)

        items[:] = sorted(items, key=key)
        for item in items:  # --benchmark-only must not skip probes: they are benchmarks (fed via pedantic)
            if boot_of(item) is not None:
                item.own_markers = [
                    m
                    for m in item.own_markers
                    if not (m.name == "skip" and "--benchmark-only" in str(m.kwargs.get("reason", "")))
                ]
        counts = Counter(boot.boot_id for item in items if (boot := boot_of(item)) is not None)
        self.run.set_plan(counts)
        self._planned = frozenset(m.name for i in items if boot_of(i) is not None for m in i.iter_markers())
        if self.progress is not None:
            self.progress.planned(counts)

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        """Every test file is imported now, so a user's probe has registered its spec: check the gates
        against the registry before anything boots (a gate on an unknown probe is a usage error)."""
        from pytest_kvcache.report.gates import check_all

        specs = probe_registry.resolve()
        # the probes the selected tests measure (-m, -k): a gate on another one would have nothing to judge. A probe
        # test that carries no probe's marker may record any probe: then the selection tells nothing.
        tests = [i for i in session.items if boot_of(i) is not None]
        marked = [{s.name for s in specs.values() if i.get_closest_marker(s.marker)} for i in tests]
        selected = set().union(*marked) if all(marked) and self.role is None else None
        try:
            check_all(
                self.settings.gates,
                [a.name for a in self.settings.arms],
                specs,
                selected,
                planned_points(self.settings),
            )
        except GateError as exc:
            raise pytest.UsageError(f"pytest-kvcache: --kv-fail: {exc}") from None
        boots_here = self.role is None or self.role.kind == "worker"  # a pytest-xdist controller boots nothing
        if boots_here and not self.config.option.collectonly and any(e.get("tests") for e in self.run.plan):
            self.prepare_model()

    def prepare_model(self) -> None:
        """The embedded model found, checked and (for vLLM, once per machine) converted before any boot; a
        missing wheel, a GGUF or cache that fails its check, or a failed conversion is a usage error."""
        writer = TerminalWriter(self.config)
        error = prepare_embedded(self.settings, on_convert=lambda message: writer.line(f"kvcache: {message}"))
        if error is not None:
            raise pytest.UsageError(f"pytest-kvcache: {error}")

    def pytest_report_collectionfinish(self) -> list[str]:
        return self.plan_lines()

    def plan_lines(self) -> list[str]:
        st = self.settings
        spec = st.embedded_spec
        kind = get_kind(st.engine)
        default = (
            "as served by each --kv-endpoint"
            if st.launcher == "external"
            else f"embedded:{spec.name} — {spec.title}"
            + (", dummy weights" if not spec.trained else "")
            + (
                f", {st.embedded_dtype} on vLLM"
                + (
                    " (an arm's float16/bfloat16 KV cache: vLLM's CPU build serves those wrongly on float32 weights)"
                    if st.embedded_dtype == "bfloat16"
                    else ""
                )
                if spec.trained and kind.embedded_dtype
                else ""
            )
        )
        model = st.model or default
        order = f", order {st.order}" if st.replicates >= 2 else ""
        engine = f", engine {kind.title}" if kind.name != DEFAULT_KIND else ""
        lines = [f"kvcache boot plan — launcher {st.launcher}{engine}, model {model}{order}:"]
        if st.context_tokens is not None:
            lines.append(f"  context {st.context_tokens:,} tokens ({st.context_source}): no request beyond it is sent")
        for probe in probe_registry.specs():  # each probe's own line (``ProbeSpec.plan``), when its tests are selected
            if probe.plan is not None and probe.marker in self._planned and (line := probe.plan(st)):
                lines += [f"  {line}"] if f"  {line}" not in lines else []
        lines += [f"  {note}" for note in st.context_notes]
        if st.max_replicates:
            lines.append(
                f"  boot budget: up to {st.rounds} boots per arm (--kv-max-replicates; {st.replicates} planned): "
                f"{'round' if st.rounds == st.replicates + 1 else 'rounds'} {st.replicates + 1}"
                f"{'' if st.rounds == st.replicates + 1 else f'–{st.rounds}'} boot only while "
                f"{self.adaptive_condition()}"
            )
        lines += kv_plan_lines(self.run.plan)
        for i, entry in enumerate(self.run.plan, 1):
            args = entry.get("args") or []
            extra = f" args={' '.join(args)}" if args else ""
            baseline = " (baseline)" if i == 1 else ""
            adaptive = f" (adaptive: only while {self.adaptive_condition()})" if entry.get("extra") else ""
            lane = (
                f" [lane {entry['lane']}{', GPUs ' + str(entry['gpus']) if entry.get('gpus') else ''}]"
                if "lane" in entry
                else ""
            )
            lines.append(
                f"  {i}. {entry.get('boot')}{baseline}{lane}: kv_cache_dtype={entry.get('kv_cache_dtype') or 'default'}"
                f"{extra}{budget_text(st, entry)} — {entry.get('tests', 0)} test(s){adaptive}"
            )
        return lines

    def adaptive_condition(self) -> str:
        """When an adaptive round boots, in words: a gate is undecided, or a CI is wider than the target."""
        st = self.settings
        parts = ["a gate is undecided"] if st.gates else []
        if st.target_ci_pct is not None and st.replicates >= 2:
            parts.append(f"a CI is wider than ±{st.target_ci_pct:g}%")
        return " or ".join(parts) or "needed"

    # ------------------------------------------------------------------ the run loop

    @pytest.hookimpl(trylast=True)
    def pytest_runtest_teardown(self, item: pytest.Item, nextitem: pytest.Item | None) -> None:
        """Stop an arm's engine as soon as its last test is done, before the next arm boots."""
        current, following = boot_of(item), boot_of(nextitem)
        if current is not None and (following is None or following.boot_id != current.boot_id):
            self.run.end_boot(current.boot_id)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtestloop(self, session: pytest.Session) -> Generator[None, object, object]:
        """After the probes (also when some failed): stop everything, then the report and the gates."""
        try:
            return (yield)
        except KeyboardInterrupt:  # Ctrl-C, or SIGTERM (turned into one): no agreement requests on the way out
            self.interrupted()
            raise
        finally:
            self.run.stop_all()
            self.finish_run()

    def finish_run(self) -> None:
        if self.run.folder is None:
            return
        path = self.run.folder.path
        if self.run.role == "controller":
            self.lanes.reap()
        if self.usage_error is not None:
            self.run.close(status="usage error")
            return
        self.run.close(status="interrupted" if self.run.interrupted else "finished")
        if self.run.interrupted or self.run.role == "worker":
            return  # Ctrl-C means now: the records are on disk, and kvcache-report builds the report later
        from pytest_kvcache.finish import finish
        from pytest_kvcache.report.pipeline import Outcome, ReportInputError, produce  # pandas: seconds to import

        try:
            options = self.settings.report_options()
            self.outcome = finish(produce(path, options), options)
        except ReportInputError as exc:
            self.outcome = Outcome(run=path, error=f"{exc}")
        except Exception as exc:  # the pipeline catches its own; this is the last line of defence
            self.outcome = Outcome(run=path, error=f"{type(exc).__name__}: {exc}")
        if self.outcome.report is not None:
            self.junit_properties(self.outcome.report)
        if self.outcome.report is not None and self.outcome.error is None:
            self.config.hook.pytest_kvcache_report(config=self.config, report=self.outcome.report)
            summary = os.environ.get("GITHUB_STEP_SUMMARY")
            if summary:
                from pytest_kvcache.report.outputs.md_verdict import gate_summary

                try:
                    with open(summary, "a", encoding="utf-8") as fh:
                        fh.write(gate_summary(self.outcome.report))
                        fh.write((path / "report.md").read_text(encoding="utf-8"))
                except OSError as exc:  # the report stands; the job summary is a copy
                    self.outcome.messages.append(f"warning: GITHUB_STEP_SUMMARY: cannot append to {summary}: {exc}")

    def junit_properties(self, report: Report) -> None:
        """Gate outcomes (value, CI, threshold, deciding evidence) and the failed-request count as test-suite
        properties of ``--junitxml`` (what ``record_testsuite_property`` writes; valid in every junit family)."""
        xml = next((p for p in self.config.pluginmanager.get_plugins() if hasattr(p, "add_global_property")), None)
        if xml is None:
            return
        from pytest_kvcache.report.outputs.md_verdict import gate_evidence

        gates = report.get("gates") or []
        for outcome in ("fail", "error", "inconclusive", "pass"):
            xml.add_global_property(
                f"kv_gates_{ {'fail': 'failed', 'pass': 'passed'}.get(outcome, outcome) }",
                str(sum(1 for g in gates if g["outcome"] == outcome)),
            )
        for g in gates:
            xml.add_global_property(
                f"kv_gate {g['name']}",
                f"{g['outcome'].upper()} value {g['value_text']} CI {g['ci_text']} needs {g['threshold_text']} — "
                f"{gate_evidence(g)}",
            )
        failures = report.get("failures")
        if failures is not None:
            xml.add_global_property("kv_failed_requests", str(failures["failed"]))

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]) -> None:
        """Per-test figures as JUnit XML properties (``--junitxml``): arm and mean of each metric."""
        if call.when != "call" or boot_of(item) is None:
            return
        mine = [r for r in self.run.records if r.get("test") == item.nodeid and r.get("phase") == "measured"]
        if not mine:
            return
        item.user_properties.append(("kv_arm", mine[0].get("arm")))
        valid = [r for r in mine if r.get("ok") and not r.get("excluded_reason")]
        item.user_properties.append(("kv_valid_samples", len(valid)))
        for metric in probe_registry.CLIENT_METRICS:
            values = [v for r in valid if (v := (r.get("metrics") or {}).get(metric)) is not None]
            if values:
                item.user_properties.append((f"kv_{metric}_mean", round(sum(values) / len(values), 6)))

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """A probe test that skipped is remembered with its reason: a run where every probe skipped
        says why (terminal and report notes) without ``-rs``. A finished probe test moves the ETA."""
        events = getattr(report, "kvcache_events", None)
        node = getattr(report, "node", None)
        if events and node is not None and self.run.role == "controller":
            self.lanes.forwarded(int(node.workerinput[LANE_KEY]), events)
        if report.when == "teardown" and "[" in report.nodeid and self.progress is not None:
            self.progress.test_done(report.nodeid.split("::")[-1])
        if not report.skipped or report.when not in ("setup", "call"):
            return
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        reason = str(reason).removeprefix("Skipped: ")
        if "[" in report.nodeid:  # parametrized by arm: a probe test
            self.run.skipped.append(f"{report.nodeid.split('::')[-1]}: {reason}")

    @pytest.hookimpl(tryfirst=True)  # before the terminal's (its traceback takes seconds to render)
    def pytest_keyboard_interrupt(self) -> None:
        """Ctrl-C or SIGTERM: stop as fast as possible (no agreement requests on the way out)."""
        self.interrupted()

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        """The one exit-code rule (``report.judge``): failed gates, CONFOUNDED and a report that could not
        be built change pytest's exit status here, for every way the run can end."""
        self.run.stop_all()
        if self.run.role == "worker":  # what the last reports did not carry goes with the worker's end
            self.run.close(status="interrupted" if self.run.interrupted else "finished")
            outbox = self.run.outbox
            self.config.workeroutput[EVENTS_KEY] = outbox.drain() if outbox is not None else []  # type: ignore[attr-defined]
            return
        if self.run.role == "controller":
            self.lanes.reap()  # after pytest-xdist stopped its workers (Ctrl-C: it may have killed them)
        if exitstatus == pytest.ExitCode.INTERRUPTED:
            self.run.close(status="interrupted")
            return
        if self.outcome is None:
            return
        from pytest_kvcache.report.judge import combine

        session.exitstatus = combine(int(exitstatus), self.outcome.exit_code)

    # ------------------------------------------------------------------ pytest-xdist (controller)

    def planned_remote(self, tests_per_boot: Mapping[str, int]) -> None:
        """The scheduler saw the workers' collection: the boot plan, as a plain run's collection sets it."""
        self.run.set_plan(tests_per_boot)
        self.run.write_meta(status="running")
        if self.progress is not None:
            self.progress.planned(tests_per_boot)
        writer = TerminalWriter(self.config)
        for line in self.plan_lines():
            writer.line(line)

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        tr = terminalreporter
        if self.run.folder is None and not self.run.reaped:
            return
        tr.section("kvcache")
        for message in self.run.reaped:
            tr.line(message, yellow=True)
        if self.run.folder is not None:
            tr.line(f"run folder: {self.run.folder.path}")
        if self.run.interrupted and self.run.folder is not None:
            kept = len(self.run.records)
            tr.line(
                f"interrupted: {kept} record(s) kept; build the report with: kvcache-report {self.run.folder.path}",
                yellow=True,
            )
        if self.outcome is None:
            return
        from pytest_kvcache.report.outputs.terminal import outcome_lines

        for line in outcome_lines(self.outcome):
            tr.line(line.text, red=line.tone == "red", yellow=line.tone == "yellow")
