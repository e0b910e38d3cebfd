from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pytest_kvcache.config.constants import SettingsError
from pytest_kvcache.config.kinds import resolve_arms
from pytest_kvcache.config.plan import BootPlan
from pytest_kvcache.config.settings import OPTIONS
from pytest_kvcache.engines.kinds.vllm import ALIASES, KV_CACHE_DTYPES
from tests.factories import make_settings

settings = make_settings


def test_no_arms_means_inactive(tmp_path: Path) -> None:
    assert not settings(tmp_path).active


def test_aliases_resolve_explicitly(tmp_path: Path) -> None:
    s = settings(tmp_path, {"arms": "bf16,fp8,e5m2"})
    assert [(a.name, a.kv_cache_dtype, a.source) for a in s.arms] == [
        ("bf16", "auto", "alias"),
        ("fp8", "fp8_e4m3", "alias"),
        ("e5m2", "fp8_e5m2", "alias"),
    ]
    assert s.baseline.name == "bf16"


def test_raw_vllm_dtype_is_an_arm(tmp_path: Path) -> None:
    s = settings(tmp_path, {"arms": "auto,fp8_e5m2"})
    assert [a.kv_cache_dtype for a in s.arms] == ["auto", "fp8_e5m2"]


def test_same_arm_twice_is_a_and_a(tmp_path: Path) -> None:
    s = settings(tmp_path, {"arms": "auto,auto,auto"})
    assert [a.name for a in s.arms] == ["auto", "auto.2", "auto.3"]
    assert [b.boot_id for b in BootPlan.of(s).boots] == ["auto", "auto.2", "auto.3"]


def test_unknown_arm_lists_the_valid_names(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match=r"unknown arm 'fp9'.*fp8_e4m3.*int8_per_token_head"):
        settings(tmp_path, {"arms": "auto,fp9"})


def test_gpu_only_dtype_on_cpu_default_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match=r"int8 \(int8_per_token_head\) need a GPU"):
        settings(tmp_path, {"arms": "fp8,int8"})


def test_gpu_only_dtype_allowed_with_a_model(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    s = settings(tmp_path, {"arms": "fp8,int8", "model": str(model)})
    assert s.model == str(model)
    assert s.arms[1].kv_cache_dtype == "int8_per_token_head"


def test_fp8_refused_when_the_cpu_cannot_serve_it(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match=r"fp8 \(fp8_e4m3\) cannot run.*AVX-512"):
        settings(tmp_path, {"arms": "auto,fp8"}, fp8_kv_unsupported="needs AVX-512 or AMX")
    tiny = {"arms": "auto,float16", "model": "embedded:tiny-qwen3"}
    assert settings(tmp_path, tiny, fp8_kv_unsupported="x").arms[1].kv_cache_dtype == "float16"


def test_missing_model_path(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match=r"model folder '\./nope' does not exist"):
        settings(tmp_path, {"arms": "auto", "model": "./nope"})


def test_hub_id_model_is_passed_through(tmp_path: Path) -> None:
    s = settings(tmp_path, {"arms": "fp8,int8", "model": "Lorbus/Qwen3.6-27B-int4-AutoRound"})
    assert s.model == "Lorbus/Qwen3.6-27B-int4-AutoRound"


def test_named_arms_from_pyproject(tmp_path: Path) -> None:
    named = {
        "mtp": {"kv_cache_dtype": "fp8", "args": ["--speculative-config", '{"method":"mtp"}'], "env": {"X": 1}},
        "noprefix": {"args": "--no-enable-prefix-caching"},
    }
    s = settings(tmp_path, {"arms": "auto,mtp,noprefix"}, named=named)
    mtp, noprefix = s.arms[1], s.arms[2]
    assert mtp.kv_cache_dtype == "fp8_e4m3" and mtp.args[0] == "--speculative-config"
    assert dict(mtp.env) == {"X": "1"} and mtp.source == "pyproject"
    assert noprefix.kv_cache_dtype is None and noprefix.args == ("--no-enable-prefix-caching",)
    assert noprefix.expected_cache_dtype == "auto"


def test_named_arm_with_unknown_key(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match=r"\[tool.pytest_kvcache.arms.x\]: unknown key\(s\) dtype"):
        settings(tmp_path, {"arms": "x"}, named={"x": {"dtype": "fp8"}})


def test_precedence_cli_over_env_over_ini(tmp_path: Path) -> None:
    ini = {"arms": "auto", "runs": "7", "warmups": "2", "sampling": "sampled"}
    env = {"PYTEST_KVCACHE_RUNS": "9", "PYTEST_KVCACHE_WARMUPS": "4"}
    s = settings(tmp_path, {"warmups": "1"}, env=env, ini=ini)
    assert (s.warmups, s.runs, s.sampling) == (1, 9, "sampled")


def test_env_arms(tmp_path: Path) -> None:
    assert [a.name for a in settings(tmp_path, env={"PYTEST_KVCACHE_ARMS": "auto,fp8"}).arms] == ["auto", "fp8"]


@pytest.mark.parametrize(
    ("cli", "message"),
    [
        ({"runs": "0"}, "--kv-runs: expected a whole number >= 1, got '0'"),
        ({"warmups": "x"}, "--kv-warmups: expected a whole number, got 'x'"),
        ({"startup_timeout": "-3"}, "--kv-startup-timeout: expected a positive number"),
        ({"sampling": "beam"}, "--kv-sampling: expected one of greedy, sampled; got 'beam'"),
        ({"launcher": "k8s"}, "--kv-launcher: expected one of process, docker, external"),
        ({"port": "70000"}, "--kv-port: expected a TCP port"),
        ({"engine_args": "--a 'unterminated"}, "--kv-engine-args: cannot split"),
    ],
)
def test_malformed_values_name_the_option(tmp_path: Path, cli: dict[str, str], message: str) -> None:
    with pytest.raises(SettingsError) as exc:
        settings(tmp_path, {"arms": "auto", **cli})
    assert message in str(exc.value)


def test_env_origin_is_named(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match="PYTEST_KVCACHE_RUNS: expected a whole number"):
        settings(tmp_path, {"arms": "auto"}, env={"PYTEST_KVCACHE_RUNS": "many"})


def test_endpoints(tmp_path: Path) -> None:
    s = settings(
        tmp_path, {"arms": "fp8,int8", "launcher": "external", "endpoint": ["fp8=http://h:8000/", "int8=http://h:8001"]}
    )
    assert dict(s.endpoints) == {"fp8": "http://h:8000", "int8": "http://h:8001"}


@pytest.mark.parametrize(
    ("cli", "message"),
    [
        ({"endpoint": ["auto=http://h:1"]}, "--kv-endpoint requires --kv-launcher=external"),
        ({"launcher": "external", "endpoint": ["auto=http://h:1"]}, "needs --kv-endpoint ARM=URL for: float16"),
        (
            {"launcher": "external", "endpoint": ["auto=http://h:1", "float16=http://h:2", "x=http://h:3"]},
            "names arm(s) not in --kv-arms: x",
        ),
        ({"launcher": "external", "endpoint": ["auto"]}, "expected ARM=URL, got 'auto'"),
        ({"launcher": "external", "endpoint": ["auto=ftp://h"]}, "expected an http(s) URL"),
    ],
)
def test_endpoint_errors(tmp_path: Path, cli: dict[str, Any], message: str) -> None:
    with pytest.raises(SettingsError) as exc:
        settings(tmp_path, {"arms": "auto,float16", **cli})
    assert message in str(exc.value)


def test_report_dir_relative_to_rootdir(tmp_path: Path) -> None:
    assert settings(tmp_path, {"arms": "auto"}).report_dir == tmp_path / ".kvcache/runs"
    assert settings(tmp_path, {"arms": "auto", "report_dir": "out"}).report_dir == tmp_path / "out"


def test_option_table_is_consistent() -> None:
    names = [o.name for o in OPTIONS]
    assert len(names) == len(set(names))
    assert all(o.cli.startswith("--kv-") and o.ini.startswith("kv_") for o in OPTIONS)
    assert set(ALIASES.values()) <= set(KV_CACHE_DTYPES)


def test_arm_names_must_be_simple() -> None:
    with pytest.raises(SettingsError, match="must be letters"):
        resolve_arms(["a b"], {})


def test_dtype_list_matches_installed_vllm() -> None:
    """Our one list of --kv-cache-dtype values equals vLLM's own ``CacheDType`` Literal, where installed.

    Read from vLLM's source with ``ast`` (importing vLLM costs ~10 s; the unit tier must stay fast).
    """
    import ast
    import importlib.util

    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("vLLM is not installed")
    source = Path(next(iter(spec.submodule_search_locations))) / "config" / "cache.py"
    tree = ast.parse(source.read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "CacheDType":
            values = {elt.value for elt in node.value.slice.elts}  # type: ignore[attr-defined]
            break
    else:
        pytest.fail(f"no CacheDType in {source}")
    assert values == set(KV_CACHE_DTYPES)


def test_compile_cache_option_reaches_the_engine(tmp_path: Path) -> None:
    from pytest_kvcache.engines.docker import ContainerSpec
    from pytest_kvcache.engines.kinds.vllm import build_engine_args, compile_cache_mount

    assert settings(tmp_path, {"arms": "auto"}).compile_cache == "auto"
    auto = settings(tmp_path, {"arms": "auto"})
    assert not {"VLLM_CACHE_ROOT", "VLLM_DISABLE_COMPILE_CACHE"} & set(build_engine_args(auto, auto.arms[0], "m")[1])
    off = settings(tmp_path, {"arms": "auto", "compile_cache": "off"})
    assert build_engine_args(off, off.arms[0], "m")[1]["VLLM_DISABLE_COMPILE_CACHE"] == "1"
    assert compile_cache_mount(off) is None
    folder = settings(tmp_path, {"arms": "auto", "compile_cache": str(tmp_path / "cc")})
    assert build_engine_args(folder, folder.arms[0], "m")[1]["VLLM_CACHE_ROOT"] == str(tmp_path / "cc")
    mount = compile_cache_mount(folder)
    assert mount == (tmp_path / "cc", "/root/.cache/vllm") and (tmp_path / "cc").is_dir()
    spec = ContainerSpec("i", [], {}, 1, compile_cache=mount).create_kwargs("n", {})
    assert f"{tmp_path / 'cc'}:/root/.cache/vllm:rw" in spec["volumes"]
    docker = settings(
        tmp_path, {"arms": "auto", "compile_cache": str(tmp_path / "cc"), "launcher": "docker", "image": "i"}
    )
    assert "VLLM_CACHE_ROOT" not in build_engine_args(docker, docker.arms[0], "m")[1]  # mounted instead
    with pytest.raises(SettingsError, match="--kv-compile-cache"):
        settings(tmp_path, {"arms": "auto", "compile_cache": " "})


def test_the_gpu_state_follows_the_cards_each_launcher_gives_its_engine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pytest_kvcache.engines import visible_devices

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    named = {"a": {"kv_cache_dtype": "auto", "env": {"CUDA_VISIBLE_DEVICES": "0,1"}}, "b": {"kv_cache_dtype": "auto"}}
    process = settings(tmp_path, {"arms": "a,b"}, named=named)
    assert [visible_devices(process, arm) for arm in process.arms] == ["0,1", "3"]  # the arm's env, else ours
    docker = {"arms": "auto", "launcher": "docker", "image": "i"}
    for gpus, seen in ((None, ""), ("all", None), ("2,3", "2,3")):  # no --kv-gpus: the container sees no card
        chosen = settings(tmp_path, {**docker, **({"gpus": gpus} if gpus else {})})
        assert visible_devices(chosen, chosen.arms[0]) == seen
