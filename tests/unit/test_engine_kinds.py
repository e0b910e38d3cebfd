"""Engine kinds (``--kv-engine``): request fields per profile, llama.cpp arms and arguments, its log facts,
the embedded GGUF and the build cache key."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pytest_kvcache.config.arms import Arm
from pytest_kvcache.config.constants import SettingsError
from pytest_kvcache.config.kinds import resolve_arms
from pytest_kvcache.config.resolve import resolve
from pytest_kvcache.config.settings import Settings
from pytest_kvcache.datafiles import embedded_model_path
from pytest_kvcache.engines.kinds.llamacpp import LLAMACPP, build_llamacpp_args, parse_llamacpp_log
from pytest_kvcache.engines.kinds.openai import OPENAI
from pytest_kvcache.engines.kinds.vllm import VLLM
from pytest_kvcache.engines.llamacpp_build import build_key, cached_server
from pytest_kvcache.model.evidence import resolved_cache_dtype
from pytest_kvcache.probes.agreement import agreement_payload, parse_response
from pytest_kvcache.probes.short import chat_payload
from tests.factories import fake_llamacpp_sdist

GREEDY = chat_payload("m", [{"role": "user", "content": "hi"}], "greedy", 8)


def test_vllm_gets_its_own_fields() -> None:
    assert VLLM.adapt(GREEDY) == GREEDY
    assert VLLM.adapt(agreement_payload("m", "hi", 8))["return_tokens_as_token_ids"] is True


def test_a_generic_server_gets_no_vllm_only_field() -> None:
    sent = OPENAI.adapt(GREEDY)
    assert not {"ignore_eos", "min_tokens"} & set(sent)
    assert sent["stream_options"] == {"include_usage": True}
    assert sent["temperature"] == 0.0 and sent["max_tokens"] == 8 and sent["messages"] == GREEDY["messages"]
    assert "return_tokens_as_token_ids" not in OPENAI.adapt(agreement_payload("m", "hi", 8))
    assert GREEDY["stream_options"]["continuous_usage_stats"] is True  # adapt copies, never edits


def test_llamacpp_keeps_ignore_eos_and_drops_the_rest() -> None:
    sent = LLAMACPP.adapt(GREEDY)
    assert sent["ignore_eos"] is True and "min_tokens" not in sent
    assert sent["timings_per_token"] is True  # its per-chunk token count: the token clock
    assert "continuous_usage_stats" not in sent["stream_options"]
    assert LLAMACPP.cold_fields == {"cache_prompt": False}
    asked = LLAMACPP.adapt(agreement_payload("m", "hi", 8))
    assert asked["logprobs"] is True and asked["top_logprobs"] == 1  # 0 gives no logprobs at all there
    assert "return_tokens_as_token_ids" not in asked and "min_tokens" not in asked


def test_missing_evidence_is_listed_per_kind() -> None:
    assert VLLM.missing_evidence() == []
    assert any("/metrics" in m for m in OPENAI.missing_evidence())
    assert any("tokenizer endpoint" in m for m in OPENAI.missing_evidence())
    assert not any("/metrics" in m for m in LLAMACPP.missing_evidence())
    # no prompt logprobs, but forced one-token continuations score the fidelity windows
    assert not any("prompt logprobs" in m for m in LLAMACPP.missing_evidence())
    assert LLAMACPP.forced_scoring and not LLAMACPP.prompt_logprobs
    assert not any("per-chunk" in m for m in LLAMACPP.missing_evidence())


def test_llamacpp_logprob_entries_give_token_ids() -> None:
    body = {"choices": [{"logprobs": {"content": [{"id": 17, "token": "a", "logprob": -0.5}]}}]}
    assert parse_response(body).ids == (17,)


@pytest.mark.parametrize(
    ("typed", "cache_type"),
    [("f16", "f16"), ("q8_0", "q8_0"), ("q4_0", "q4_0"), ("q8", "q8_0"), ("int4", "q4_0"), ("auto", "f16")],
)
def test_llamacpp_arms_are_its_cache_types(typed: str, cache_type: str) -> None:
    (arm,) = resolve_arms([typed], {}, "llamacpp")
    assert arm.kv_cache_dtype == cache_type and arm.expected_cache_dtype == cache_type


def test_llamacpp_refuses_a_vllm_dtype_and_a_named_arm_takes_args() -> None:
    with pytest.raises(SettingsError, match=r"unknown llama\.cpp arm 'fp8'"):
        resolve_arms(["fp8"], {}, "llamacpp")
    (arm,) = resolve_arms(["kq8"], {"kq8": {"kv_cache_dtype": "q8", "args": ["--flash-attn", "on"]}}, "llamacpp")
    assert arm.kv_cache_dtype == "q8_0" and arm.args == ("--flash-attn", "on")
    with pytest.raises(SettingsError, match=r"unknown llama\.cpp kv_cache_dtype 'fp8'"):
        resolve_arms(["bad"], {"bad": {"kv_cache_dtype": "fp8"}}, "llamacpp")


def test_llamacpp_args_set_k_and_v_and_user_args_win() -> None:
    settings = Settings(arms=(), engine="llamacpp")
    args, _ = build_llamacpp_args(settings, Arm("q8_0", "q8_0"), "/m.gguf")
    assert args[:2] == ["--model", "/m.gguf"]
    assert args[args.index("--cache-type-k") + 1] == args[args.index("--cache-type-v") + 1] == "q8_0"
    assert "--metrics" in args and "--ctx-size" in args  # the embedded default's context
    assert args[args.index("--log-verbosity") + 1] == "4"  # the KV-cache line is logged
    args, _ = build_llamacpp_args(settings, Arm("mixed", "q8_0", args=("-ctv", "f16")), "/m.gguf")
    assert args.count("--cache-type-k") == 1 and "--cache-type-v" not in args and args[-2:] == ["-ctv", "f16"]


def test_engine_option_is_checked(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match="not docker"):
        resolve({"arms": "f16", "engine": "llamacpp", "launcher": "docker", "image": "x"}, {}, {}, {}, tmp_path)
    with pytest.raises(SettingsError, match="needs --kv-engine-cmd"):
        resolve({"arms": "auto", "engine": "openai"}, {}, {}, {}, tmp_path)
    with pytest.raises(SettingsError, match="GGUF file"):
        resolve({"arms": "f16", "engine": "llamacpp", "model": str(tmp_path)}, {}, {}, {}, tmp_path)
    with pytest.raises(SettingsError, match="--kv-engine"):
        resolve({"arms": "f16", "engine": "sglang"}, {}, {}, {}, tmp_path)
    settings = resolve({"arms": "f16,q8_0", "engine": "llamacpp"}, {}, {}, {}, tmp_path)
    assert settings.engine == "llamacpp" and settings.depths == (1_000, 4_000) and settings.context_tokens == 8192
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    settings = resolve({"arms": "q8_0", "engine": "llamacpp", "model": "./m.gguf"}, {}, {}, {}, tmp_path)
    assert settings.model == str(tmp_path / "m.gguf") and not settings.embedded


# llama-server's own lines (llama.cpp of llama-cpp-python 0.3.36, the tiny GGUF, q8_0 K and V)
LLAMA_LOG = """\
0.00.003.136 I cmn  common_param: common_params_print_info: build 0 (unknown) with GNU 12.2.0 for Linux x86_64
0.00.027.463 I llama_init_from_model: enabling flash_attn since it is required for quantized V cache
0.00.027.528 I llama_context: n_ctx                 = 20480
0.00.027.598 I llama_context: flash_attn            = enabled
0.00.028.271 I llama_kv_cache:        CPU KV buffer size =    21.25 MiB
0.00.042.064 I llama_kv_cache: size =   21.25 MiB ( 20480 cells,   4 layers,  1/1 seqs), K (q8_0):   10.62 MiB, V (q8_0):   10.62 MiB
"""


def test_llamacpp_log_facts() -> None:
    facts = parse_llamacpp_log(LLAMA_LOG)
    assert facts["kv_cache_type_k"] == facts["kv_cache_type_v"] == facts["kv_cache_dtype"] == "q8_0"
    assert facts["kv_cache_size_tokens"] == 20480 and facts["kv_cache_mib"] == 21.25 and facts["n_ctx"] == 20480
    assert facts["flash_attn"] == "enabled" and facts["engine_version"] == "0 (unknown)"
    mixed = parse_llamacpp_log(LLAMA_LOG.replace("V (q8_0)", "V (f16)"))
    assert mixed["kv_cache_dtype"] == "k=q8_0,v=f16"
    assert resolved_cache_dtype({"log": mixed}) == "k=q8_0,v=f16"  # refused against a declared q8_0


def test_embedded_gguf_is_deterministic_and_cached(tmp_path: Path) -> None:
    gguf = pytest.importorskip("gguf")
    from pytest_kvcache.engines.gguf_model import tiny_gguf, write_gguf

    path = tiny_gguf(embedded_model_path(), root=tmp_path)
    assert tiny_gguf(embedded_model_path(), root=tmp_path) == path
    again = tmp_path / "again.gguf"
    write_gguf(embedded_model_path(), again)
    assert again.read_bytes() == path.read_bytes()
    reader = gguf.GGUFReader(str(path))
    names = {t.name for t in reader.tensors}
    assert {"token_embd.weight", "blk.3.ffn_down.weight", "output_norm.weight"} <= names
    assert reader.fields["general.architecture"].contents() == "qwen3"


def test_build_cache_key_is_stable(tmp_path: Path) -> None:
    assert build_key() == build_key() and len(build_key()) == 16
    assert cached_server(tmp_path) is None
    binary = tmp_path / build_key() / "bin" / "llama-server"
    binary.parent.mkdir(parents=True)
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    assert cached_server(tmp_path) == binary


def test_no_llama_server_is_a_headline_not_a_traceback(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from pytest_kvcache.engines import llamacpp_build as build
    from pytest_kvcache.engines.base import EngineError
    from pytest_kvcache.engines.kinds.llamacpp import llama_server_cmd

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # an empty cache: it would have to build
    monkeypatch.setattr(build.shutil, "which", lambda name: None)  # … with no cmake, no llama-server on PATH
    with pytest.raises(EngineError) as info:
        llama_server_cmd(Settings(arms=(), engine="llamacpp"), "f16")
    assert info.value.headline == "f16: no llama-server: building llama-server needs cmake and a C++ compiler on " + (
        "PATH (or give --kv-engine-cmd)"
    )
    assert llama_server_cmd(Settings(arms=(), engine="llamacpp", engine_cmd=("/x/llama-server",)), "f16") == (
        "/x/llama-server",
    )


def test_a_tampered_sdist_is_refused(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from pytest_kvcache.engines.llamacpp_build import SDIST_ENV, BuildError, find_sdist

    fake = tmp_path / "llama_cpp_python-0.3.36.tar.gz"
    fake.write_bytes(b"not the sdist")
    monkeypatch.setenv(SDIST_ENV, str(fake))
    with pytest.raises(BuildError, match="sha256 is not the pinned"):
        find_sdist(tmp_path, tmp_path / "build.log")


def test_the_terminal_names_a_llamacpp_boot_as_llamacpp() -> None:
    from pytest_kvcache.report.outputs.terminal import evidence_lines

    log = parse_llamacpp_log(LLAMA_LOG)
    (line,) = evidence_lines("q8_0", {"engine_kind": "llamacpp", "declared_kv_cache_dtype": "q8_0", "log": log})
    assert "cache_dtype=q8_0" in line and "kv_cache=21.25 MiB" in line and "llama.cpp 0 (unknown)" in line
    assert "vLLM" not in line


def test_llama_server_failures_are_the_headline() -> None:
    from pytest_kvcache.engines.base import salient_error

    assert salient_error("# pytest-kvcache: llama-server …\nerror: invalid argument: --bogus\n") == (
        "error: invalid argument: --bogus"
    )
    assert salient_error('error while handling argument "--cache-type-k": Unsupported cache type: x\n') == (
        'error while handling argument "--cache-type-k": Unsupported cache type: x'
    )
    log = "0.00.019 I llama_model_loader: loaded\n0.00.020.1 E llama_model_load: error loading model: bad magic\n"
    assert salient_error(log) == "llama_model_load: error loading model: bad magic"


def test_progress_shows_a_llama_server_build_and_its_startup(tmp_path: Path) -> None:
    from pytest_kvcache.run.progress import engine_phase

    log = tmp_path / "engine.log"
    log.write_text("# pytest-kvcache: building llama-server (llama.cpp from llama-cpp-python 0.3.36) into /c\n")
    assert (engine_phase(log) or "").startswith("# pytest-kvcache: building llama-server")
    log.write_text(LLAMA_LOG)
    assert "llama_kv_cache: size" in (engine_phase(log) or "")


def test_ensure_server_builds_once_into_the_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The build's own steps (find the pinned sdist, extract its llama.cpp, configure, build, move the binary
    in at the end), with a cmake that only writes the binary: a second call builds nothing."""

    from pytest_kvcache.engines import llamacpp_build as build

    fake_llamacpp_sdist(tmp_path / "dl", monkeypatch)
    bin_dir = tmp_path / "fakebin"
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    cmake = bin_dir / "cmake"
    cmake.write_text(
        "#!/bin/sh\n"
        f'echo "$@" >> {calls}\n'
        'if [ "$1" = "-S" ]; then test -f "$2/CMakeLists.txt"; exit $?; fi\n'
        'mkdir -p "$2/bin" && printf "#!/bin/sh\\n" > "$2/bin/llama-server" && chmod +x "$2/bin/llama-server"\n'
    )
    cmake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    root = tmp_path / "cache"
    said: list[str] = []
    found = build.ensure_server(root, on_build=said.append)
    assert found == root / build.build_key() / "bin" / "llama-server" and found.is_file()
    assert len(said) == 1 and "building llama-server" in said[0]
    lines = calls.read_text().splitlines()
    assert len(lines) == 2 and "-DLLAMA_CURL=OFF" in lines[0] and "--target llama-server -j" in lines[1]
    assert "built in" in (root / build.build_key() / "BUILD").read_text()
    assert [p.name for p in root.iterdir() if p.is_dir()] == [build.build_key()]  # no leftover temporary folder
    assert build.ensure_server(root, on_build=said.append) == found and len(said) == 1  # cached: nothing built
