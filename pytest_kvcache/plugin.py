"""pytest-kvcache's pytest wiring: options, markers, arm parametrization, fixtures.

Nothing here launches, measures or computes; the library modules do, and ``session.py`` holds the run.
Heavy layers (the run, the report: numpy, pandas) are imported only once ``--kv-arms`` makes the plugin
active, or for ``--kv-rerender``: a plain ``pytest`` in a project that has the plugin installed pays
nothing for it.
"""

from __future__ import annotations

import os
import platform
import tomllib
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_kvcache import distributed, hookspecs
from pytest_kvcache.client import Client
from pytest_kvcache.config.constants import SettingsError
from pytest_kvcache.config.hostcpu import fp8_kv_unsupported_reason
from pytest_kvcache.config.locations import store_location
from pytest_kvcache.config.options import pick
from pytest_kvcache.config.plan import Boot, BootPlan
from pytest_kvcache.config.resolve import resolve
from pytest_kvcache.config.settings import OPTION_BY_NAME, OPTIONS, Settings
from pytest_kvcache.engines import make_engine
from pytest_kvcache.engines.base import EngineError
from pytest_kvcache.engines.kinds.base import load_entry_points
from pytest_kvcache.probes import registry as probe_registry
from pytest_kvcache.run import rounds
from pytest_kvcache.run.measure import ArmClient, death_notice
from pytest_kvcache.session import KvSession
from pytest_kvcache.stored import Stored, open_stored, report_options

if TYPE_CHECKING:
    from pytest_kvcache.engines.base import Engine
    from pytest_kvcache.engines.registry import EngineRegistry
    from pytest_kvcache.model.records import FidelityRecord, Record, RetrievalRecord
    from pytest_kvcache.run.measure import ArmClient, Server
    from pytest_kvcache.sample import Sample
    from pytest_kvcache.session import KvSession

#: The key under which the active run's session object lives in ``config.stash`` (see ``get_session``).
SESSION_KEY = pytest.StashKey["KvSession"]()


def _marker_line(spec: probe_registry.ProbeSpec) -> str:
    return f"{spec.marker}: {spec.marker_help or spec.title}"


def markers() -> dict[str, str]:
    """Every probe's marker (from the registry) and the group markers (``depth``)."""
    found = {s.marker: _marker_line(s) for s in probe_registry.specs()}
    return {**found, **probe_registry.GROUP_MARKERS}


def get_session(config: pytest.Config) -> KvSession | None:
    return config.stash.get(SESSION_KEY, None)


SUITE_DIR = Path(__file__).parent / "suite"
_LISTENER_KEY = pytest.StashKey[Callable[[probe_registry.ProbeSpec], None]]()


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    pluginmanager.add_hookspecs(hookspecs)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("kvcache", "pytest-kvcache: A/B-test vLLM serving variants")
    for spec in OPTIONS:
        help_text = f"{spec.help} [ini: {spec.ini}; env: {spec.env}]".replace("%", "%%")  # argparse formats help
        if spec.flag:
            group.addoption(spec.cli, dest=spec.dest, action="store_true", default=None, help=help_text)
            parser.addini(spec.ini, spec.help, type="bool", default=False)
        elif spec.repeatable:
            group.addoption(
                spec.cli, dest=spec.dest, action="append", default=None, metavar=spec.metavar, help=help_text
            )
            parser.addini(spec.ini, spec.help, type="linelist", default=[])
        else:
            group.addoption(spec.cli, dest=spec.dest, default=None, metavar=spec.metavar, help=help_text)
            parser.addini(spec.ini, spec.help, type="string", default="")


def _named_arms(config: pytest.Config) -> dict[str, Any]:
    candidates = [config.inipath] if config.inipath and config.inipath.name == "pyproject.toml" else []
    candidates.append(config.rootpath / "pyproject.toml")
    for path in candidates:
        if path is not None and path.is_file():
            try:
                data = tomllib.loads(path.read_text(encoding="utf-8"))
            except tomllib.TOMLDecodeError as exc:
                raise SettingsError(f"{path}: {exc}") from None
            arms = data.get("tool", {}).get("pytest_kvcache", {}).get("arms", {})
            if not isinstance(arms, dict) or not all(isinstance(v, dict) for v in arms.values()):
                raise SettingsError(f"{path}: [tool.pytest_kvcache.arms] must hold one table per arm")
            return arms
    return {}


def _raw(config: pytest.Config) -> tuple[dict[str, Any], dict[str, Any]]:
    cli = {spec.name: config.getoption(spec.dest) for spec in OPTIONS}
    ini = {spec.name: config.getini(spec.ini) for spec in OPTIONS}
    return cli, ini


def load_settings(config: pytest.Config, lanes: int = 1) -> Settings:
    """The run's settings, resolved once from the CLI, the environment and the ini file (``lanes``: the
    pytest-xdist workers the boots are placed on)."""
    load_entry_points()  # the engine kinds other packages register: --kv-engine takes their names
    cli, ini = _raw(config)
    return resolve(
        cli,
        os.environ,
        ini,
        _named_arms(config),
        config.rootpath,
        fp8_kv_unsupported=fp8_kv_unsupported_reason(),
        lanes=lanes,
    )


def open_run_store(config: pytest.Config, settings: Settings) -> Stored:
    """The run store checked and the stored runs ``--kv-compare``/``--kv-noise`` name loaded, before any boot."""
    cli, ini = _raw(config)
    _, origin = store_location(cli, os.environ, ini, config.rootpath)
    return open_stored(settings, os.environ, origin)


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> int | None:
    """``--kv-rerender=RUN_DIR``: rebuild a stored run's report and gates; no collection, no boots.

    ``--kv-fail``, ``--kv-inconclusive``, ``--kv-compare``, ``--kv-noise`` and ``--kv-allow-diff`` come
    from the CLI, the environment or the ini file exactly as for a run (``settings.report_options``).
    """
    spec = OPTION_BY_NAME["rerender"]
    cli, ini = _raw(config)
    raw = cli.get("rerender") or os.environ.get(spec.env) or ini.get("rerender")
    if not raw:
        return None
    from pytest_kvcache.cli import rerender

    path = Path(str(raw)).expanduser()
    if not path.is_absolute():
        path = Path.cwd() / path
    try:
        options, notes = report_options(cli, os.environ, ini, config.rootpath)
    except SettingsError as exc:
        raise pytest.UsageError(f"pytest-kvcache: {exc}") from None
    for note in notes:
        print(f"kvcache: {note}")  # as a run says it in its report header
    return rerender(path, options)


def _register_marker(config: pytest.Config) -> Callable[[probe_registry.ProbeSpec], None]:
    def listener(spec: probe_registry.ProbeSpec) -> None:
        config.addinivalue_line("markers", _marker_line(spec))

    return listener


def pytest_configure(config: pytest.Config) -> None:
    for marker in markers().values():
        config.addinivalue_line("markers", marker)
    listener = _register_marker(config)
    probe_registry.add_listener(listener)  # a user's probe that registers later gets its marker too
    config.stash[_LISTENER_KEY] = listener
    role = None
    cli, ini = _raw(config)
    if config.pluginmanager.hasplugin("xdist") and pick(OPTION_BY_NAME["arms"], cli, os.environ, ini)[0] is not None:
        role = distributed.role_of(config)  # its lanes are part of resolution: Settings is never patched after
    try:
        settings = load_settings(config, lanes=role.lanes if role is not None else 1)
    except SettingsError as exc:
        raise pytest.UsageError(f"pytest-kvcache: {exc}") from None
    if not settings.active:
        return
    if role is not None:
        try:
            distributed.check(settings, role)
            if role.kind == "worker" or distributed.all_local(config):
                host = "this host" if role.kind == "controller" else f"worker host {platform.node()}"
                count = distributed.nvml_count()
                if role.kind == "controller":
                    distributed.check_shared_cards(settings, role, count)
                for lane in [role.lane] if role.kind == "worker" else range(role.lanes):
                    distributed.check_lane_cards(settings, lane, count, host)
        except SettingsError as exc:
            raise pytest.UsageError(f"pytest-kvcache: {exc}") from None
    if role is None and settings.gpu_groups:
        raise pytest.UsageError("pytest-kvcache: --kv-gpu-groups needs pytest-xdist (-n N or --tx), one group a worker")
    try:
        stored = open_run_store(config, settings)
    except SettingsError as exc:
        raise pytest.UsageError(f"pytest-kvcache: {exc}") from None

    session = KvSession(config=config, settings=settings, role=role, boot_plan=BootPlan.of(settings), stored=stored)
    config.stash[SESSION_KEY] = session
    config.pluginmanager.register(session, "kvcache-session")
    if role is not None:
        side = distributed.Controller(session) if role.kind == "controller" else distributed.Worker(session)
        config.pluginmanager.register(side, f"kvcache-{role.kind}")
    session.install()
    if settings.suite and str(SUITE_DIR) not in config.args:
        # The folder, not its files: node ids then read ``test_short.py::test_short[fp8-code]``.
        config.args.append(str(SUITE_DIR))


def pytest_report_header(config: pytest.Config) -> list[str]:
    """What resolving baselines in the run store did (an old ``.kvcache/baselines/NAME`` imported), once."""
    session = get_session(config)
    return [f"kvcache: {note}" for note in session.stored.notes] if session is not None and session.stored else []


def pytest_unconfigure(config: pytest.Config) -> None:
    listener = config.stash.get(_LISTENER_KEY, None)
    if listener is not None:
        probe_registry.remove_listener(listener)
    session = get_session(config)
    if session is not None:
        session.uninstall()
        config.pluginmanager.unregister(session)
        del config.stash[SESSION_KEY]


@pytest.hookimpl(tryfirst=True)
def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Every test that uses ``kv_server`` (or ``kv_arm``) runs once per boot: ``test_x[fp8-...]``."""
    if "kv_arm" not in metafunc.fixturenames:
        return
    session = get_session(metafunc.config)
    if session is None:
        return
    settings = session.settings
    boots = session.boot_plan.boots
    metafunc.parametrize("kv_arm", boots, indirect=True, scope="session", ids=[b.boot_id for b in boots])
    for spec in probe_registry.specs():  # each probe's own axis (``ProbeSpec.axis``): kv_depth over --kv-depths …
        if spec.axis is not None and spec.axis.fixture in metafunc.fixturenames:
            values = spec.axis.of(settings)
            metafunc.parametrize(spec.axis.fixture, values, ids=[spec.axis.ids(v) for v in values])


@pytest.hookimpl(trylast=True)
def pytest_kvcache_make_engine(
    config: pytest.Config, settings: Settings, boot: Boot, arm_dir: Path, registry: EngineRegistry
) -> Engine:
    return make_engine(settings, boot, arm_dir, registry)


# ---------------------------------------------------------------------------------------- fixtures


def _session(config: pytest.Config) -> KvSession:
    session = get_session(config)
    if session is None:
        pytest.skip("pytest-kvcache is inactive: no --kv-arms given")
    return session


@pytest.fixture(scope="session")
def kv_settings(pytestconfig: pytest.Config) -> Settings:
    """The resolved settings of this run."""
    return _session(pytestconfig).settings


@pytest.fixture(scope="session")
def kv_arm(request: pytest.FixtureRequest) -> Boot:
    """The boot (arm × replicate) this test runs against; parametrized by the plugin."""
    _session(request.config)
    param = getattr(request, "param", None)
    if not isinstance(param, Boot):
        pytest.skip("pytest-kvcache: this test is not parametrized by arm")
    return param


@pytest.fixture(scope="session")
def kv_server(request: pytest.FixtureRequest, kv_arm: Boot) -> Iterator[Server]:
    """The running engine of this test's arm: ``url``, ``arm``, ``model``, ``evidence``."""
    run = _session(request.config).run
    skipped = rounds.skip_reason(run, kv_arm)
    if skipped:
        pytest.skip(f"adaptive round {kv_arm.replicate} not booted: {skipped}")
    failure: str | None = None
    try:
        server = run.boot(kv_arm)
    except EngineError as exc:
        failure = exc.render()
    if failure is not None:
        pytest.fail(failure, pytrace=False)  # outside the except block: no chained traceback
    yield server
    run.end_boot(kv_arm.boot_id)


@pytest.fixture
def kv_client(kv_server: Server, kv_settings: Settings) -> Iterator[ArmClient]:
    """A measuring client for this arm's server (``stream_chat(payload) -> Sample``, ``measure(payload)``)."""
    if not kv_server.engine.alive():
        pytest.fail(
            EngineError(*death_notice(kv_server)).render() + "\n(the engine died before this test)", pytrace=False
        )
    client = Client(kv_server.url, headers_at_once=kv_server.profile.headers_at_once, **kv_settings.client_kwargs())
    arm_client = ArmClient(client, kv_server)
    yield arm_client
    arm_client.close()


@pytest.fixture
def kv_openai(kv_server: Server, kv_settings: Settings) -> Iterator[Any]:
    """An ``openai.OpenAI`` client pointed at this arm's server, for calls that are not timed: checking a
    tool call's JSON or an answer's content. Its requests are not recorded; timed requests stay on
    ``kv_client``. ``kv_server.model`` is the model name to pass."""
    import openai

    client = openai.OpenAI(
        base_url=f"{kv_server.url}/v1", api_key="EMPTY", timeout=kv_settings.request_timeout_s, max_retries=0
    )
    yield client
    client.close()


@pytest.fixture
def kv_benchmark(request: pytest.FixtureRequest) -> Any:
    """pytest-benchmark's ``benchmark`` fixture when it is active, else None.

    Probes never *request* ``benchmark`` (so ``--benchmark-skip`` cannot skip them); with
    ``--benchmark-disable``/``--benchmark-skip`` they run on their own loop and feed nothing to it.
    """
    bs = request.config.pluginmanager.getplugin("pytest-benchmark")  # its BenchmarkSession, by its registered name
    if bs is None or bs.skip or bs.disabled:
        return None
    return request.getfixturevalue("benchmark")


class Recorder:
    """``kv_record(sample, probe=..., phase=..., index=..., **context)`` appends one record to
    ``requests.jsonl``; ``kv_record.sampling(info, **context)`` says why an adaptive loop stopped;
    ``kv_record.fidelity(entry)`` logs one scored text of the fidelity probe (``fidelity.jsonl``);
    ``kv_record.retrieval(entry)`` one asked needle of the retrieval probe (``retrieval.jsonl``);
    ``kv_record.left_out(probe=..., point=..., reason=...)`` says a request was not sent: it cannot fit."""

    def __init__(self, session: KvSession, server: Server, test: str) -> None:
        self.session, self.server, self.test = session, server, test

    def __call__(self, sample: Sample, **context: Any) -> Record:
        return self.session.run.record(sample, self.server.boot, test=self.test, **context)

    def sampling(self, info: Mapping[str, object], **context: object) -> None:
        boot = self.server.boot
        entry = {"kind": "requests", "boot": boot.boot_id, "arm": boot.arm.name, "test": self.test, **context}
        self.session.run.log("sampling.jsonl", {**entry, **info})

    def fidelity(self, entry: FidelityRecord) -> FidelityRecord:
        """Append one scored text to ``fidelity.jsonl`` (the fidelity probe)."""
        return self.session.run.record_fidelity(self.server.boot, {**entry, "test": self.test})

    def retrieval(self, entry: RetrievalRecord) -> RetrievalRecord:
        """Append one asked needle to ``retrieval.jsonl`` (the retrieval probe)."""
        return self.session.run.record_retrieval(self.server.boot, {**entry, "test": self.test})

    def left_out(self, *, probe: str, point: str, reason: str, **detail: object) -> None:
        """A planned request not sent because it cannot fit the engine's context: ``left_out.jsonl``, a
        progress line and the report's "Left out by design" section (never a failure)."""
        self.session.run.left_out(self.server.boot, probe=probe, point=point, reason=reason, test=self.test, **detail)


@pytest.fixture
def kv_record(request: pytest.FixtureRequest, kv_server: Server) -> Recorder:
    """Records measured samples of this test into the run folder (see :class:`Recorder`)."""
    return Recorder(_session(request.config), kv_server, request.node.nodeid)


Agree = Callable[[str, Mapping[str, Any]], None]


@pytest.fixture
def kv_agreement(request: pytest.FixtureRequest, kv_server: Server) -> Agree:
    """``kv_agreement(shape, payload)``: queue the unmeasured greedy token-id requests of output agreement;
    they are sent when this boot's probes are done (logged to ``agreement.jsonl``; nothing with
    ``--kv-no-agreement``)."""
    session = _session(request.config)

    def agree(shape: str, payload: Mapping[str, Any]) -> None:
        if session.settings.agreement:
            session.run.queue_agreement(kv_server.boot, test=request.node.nodeid, shape=shape, payload=payload)

    return agree
