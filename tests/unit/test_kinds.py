"""The engine-kind registry: the built-in kinds, entry points of other packages, and abstract kinds refused."""

from __future__ import annotations

from importlib import metadata
from pathlib import Path
from typing import Any

import pytest

from pytest_kvcache.config.constants import SettingsError
from pytest_kvcache.config.kinds import resolve_arm
from pytest_kvcache.config.plan import Boot, BootPlan
from pytest_kvcache.config.settings import Settings
from pytest_kvcache.engines import kinds, make_engine
from pytest_kvcache.engines.base import EngineError
from pytest_kvcache.engines.docker import DockerEngine
from pytest_kvcache.engines.kinds import base
from pytest_kvcache.engines.kinds.llamacpp import LLAMACPP
from pytest_kvcache.engines.kinds.openai import OPENAI
from pytest_kvcache.engines.kinds.vllm import VLLM
from pytest_kvcache.engines.registry import EngineRegistry
from pytest_kvcache.metrics import prometheus
from pytest_kvcache.model.evidence import LogFacts
from tests.factories import make_settings


def test_each_builtin_kind_is_its_module_and_its_profile() -> None:
    assert kinds.kind_names()[:3] == ("vllm", "llamacpp", "openai")
    for name, profile in {"vllm": VLLM, "llamacpp": LLAMACPP, "openai": OPENAI}.items():
        kind = kinds.get_kind(name)
        assert kind.name == profile.kind == name and kind.profile is profile
        assert type(kind).__module__ == f"pytest_kvcache.engines.kinds.{name}"
    assert kinds.get_kind("vllm").counters["prefix_cache_hits"] == "vllm:prefix_cache_hits_total"
    assert not kinds.get_kind("llamacpp").counters and not kinds.get_kind("openai").counters
    assert resolve_arm("int8", {}, "llamacpp").kv_cache_dtype == "q8_0"  # the kind's own dtype names
    assert resolve_arm("fp8", {}, "vllm").kv_cache_dtype == "fp8_e4m3"


class _Entry:
    def __init__(self, name: str, loaded: Any) -> None:
        self.name, self.value, self._loaded = name, f"pkg.{name}", loaded

    def load(self) -> Any:
        if isinstance(self._loaded, Exception):
            raise self._loaded
        return self._loaded


@pytest.fixture
def fresh_entry_points(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(base, "_SCANNED", [])
    monkeypatch.setattr(base, "_LOADED", [])


def test_an_entry_point_registers_its_kind(monkeypatch: pytest.MonkeyPatch, fresh_entry_points: None) -> None:
    class Theirs(kinds.Kind):
        profile = kinds.EngineProfile(kind="theirs", title="their server")

        def command(self, settings: Settings, boot: Boot, log_path: Path) -> kinds.Command:
            return ("their-server",), [], {}

        def parse_log(self, text: str) -> LogFacts:
            return LogFacts()

    def entry_points(group: str) -> list[_Entry]:
        assert group == kinds.ENTRY_POINT_GROUP == "pytest_kvcache.engine_kinds"
        return [_Entry("theirs", Theirs)]

    monkeypatch.setattr(metadata, "entry_points", entry_points)
    try:
        assert kinds.load_entry_points() == ["theirs"]
        assert kinds.get_kind("theirs").title == "their server" and "theirs" in kinds.kind_names()
        assert kinds.load_entry_points() == ["theirs"]  # once
    finally:
        kinds.unregister_kind("theirs")


def test_a_broken_entry_point_is_one_line(monkeypatch: pytest.MonkeyPatch, fresh_entry_points: None) -> None:
    monkeypatch.setattr(metadata, "entry_points", lambda group: [_Entry("broken", ImportError("no module x"))])
    with pytest.raises(SettingsError, match=r"^engine kind entry point 'broken' \(pkg.broken\) failed to load: "):
        kinds.load_entry_points()


def test_a_kind_without_a_command_or_a_log_parser_is_refused(
    monkeypatch: pytest.MonkeyPatch, fresh_entry_points: None
) -> None:
    """The base kind is abstract: a kind must say how it starts and what its log states, or registering it says
    which it lacks (an entry point's: a usage error naming the entry point), never a vLLM default in disguise."""

    class Half(kinds.Kind):
        profile = kinds.EngineProfile(kind="half", title="half a server")

        def parse_log(self, text: str) -> LogFacts:
            return LogFacts()

    with pytest.raises(TypeError, match=r"engine kind 'half' \(.*Half\) must define command$"):
        kinds.register_kind("half")(Half)
    assert "half" not in kinds.kind_names()

    monkeypatch.setattr(metadata, "entry_points", lambda group: [_Entry("half", Half)])
    with pytest.raises(SettingsError, match=r"engine kind entry point 'half' .*must define command"):
        kinds.load_entry_points()


def test_an_sglang_kind_is_one_module_docker_included(tmp_path: Path) -> None:
    """A newcomer's SGLang kind (``sglang_kind.py``, outside the package) is one module and one import line: its
    arms, its command line, its container (the docker launcher holds nothing of any kind's), its log and its
    counters are all it declares; and nothing of vLLM's leaks in from the base kind."""
    from tests.unit import sglang_kind

    kinds.register_kind("sglang")(sglang_kind.SglangKind)  # again: another test may have unregistered it
    model = tmp_path / "qwen"
    model.mkdir()
    try:
        assert resolve_arm("fp8", {}, "sglang").kv_cache_dtype == "fp8_e4m3"
        assert resolve_arm("fp4_e2m1", {}, "sglang").kv_cache_dtype == "fp4_e2m1"
        with pytest.raises(SettingsError, match="unknown arm 'int8'; valid arms: fp8, bf16, fp4, auto"):
            resolve_arm("int8", {}, "sglang")  # vLLM's names are vLLM's
        with pytest.raises(SettingsError, match="unknown kv_cache_dtype 'int8_per_token_head'"):
            resolve_arm("mine", {"mine": {"kv_cache_dtype": "int8_per_token_head"}}, "sglang")
        with pytest.raises(SettingsError, match="--kv-cache-bytes"):  # no byte budget: refused up front
            make_settings(tmp_path, arms="auto,fp8", engine="sglang", model=str(model), cache_bytes="1GiB")

        settings = make_settings(tmp_path, arms="auto,fp8", engine="sglang", model=str(model))
        _auto, fp8 = BootPlan.of(settings).boots
        program, args, _ = kinds.get_kind("sglang").command(settings, fp8, tmp_path / "log")
        assert program == ("python", "-m", "sglang.launch_server")
        assert args == ["--model-path", str(model), "--kv-cache-dtype", "fp8_e4m3", "--enable-metrics"]

        boxed = make_settings(
            tmp_path, arms="auto,fp8", engine="sglang", model=str(model), launcher="docker", image="lmsysorg/sglang:1"
        )
        boot = BootPlan.of(boxed).boots[1]
        engine = make_engine(boxed, boot, tmp_path / "runs" / "r1" / "fp8", EngineRegistry(tmp_path / "reg"))
        assert isinstance(engine, DockerEngine) and engine.image == "lmsysorg/sglang:1"
        container = engine.container
        assert container.engine_args == ["--model-path", "/model", "--kv-cache-dtype", "fp8_e4m3", "--enable-metrics"]
        assert container.model_mount == (str(model), "/model") and container.compile_cache is None
        assert not any(k.startswith("VLLM_") for k in container.env)

        log = "server_args=ServerArgs(kv_cache_dtype='fp8_e4m3', …)\nKV Cache is allocated. #tokens: 411230, K size…"
        assert kinds.get_kind("sglang").parse_log(log) == {"kv_cache_size_tokens": 411230, "kv_cache_dtype": "fp8_e4m3"}
        before = prometheus.parse("sglang:prompt_tokens_total 10\nsglang:generation_tokens_total 4\n")
        after = prometheus.parse("sglang:prompt_tokens_total 110\nsglang:generation_tokens_total 36\n")
        counters = kinds.get_kind("sglang").counters
        assert prometheus.engine_delta(before, after, counters) == {"prompt_tokens": 100, "generation_tokens": 32}
    finally:
        kinds.unregister_kind("sglang")


def test_a_kind_without_the_container_hook_cannot_run_in_docker(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, arms="auto", launcher="docker", image="vllm:1")
    (boot,) = BootPlan.of(settings).boots

    class Plain(kinds.Kind):
        profile = kinds.EngineProfile(kind="plain", title="a plain server")

        def command(self, settings: Settings, boot: Boot, log_path: Path) -> kinds.Command:
            return ("plain",), [], {}

        def parse_log(self, text: str) -> LogFacts:
            return LogFacts()

    kinds.register_kind("plain")(Plain)
    try:
        with pytest.raises(EngineError, match="--kv-engine=plain has no container launcher"):
            kinds.get_kind("plain").container(settings, boot)
    finally:
        kinds.unregister_kind("plain")
