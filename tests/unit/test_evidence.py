from __future__ import annotations

from pathlib import Path

from pytest_kvcache.config.hostcpu import cpu_flags, fp8_kv_unsupported_reason
from pytest_kvcache.engines.base import EngineError, redact_argv, redact_env, salient_error, tail
from pytest_kvcache.engines.kinds.vllm import CACHE_CONFIG_INFO, parse_log
from pytest_kvcache.metrics import prometheus
from pytest_kvcache.model.evidence import kv_capacity_tokens, resolved_cache_dtype, speculative

# Lines as vLLM 0.25.1 (the seed's GPU logs) and 0.32.0 (the CPU build here) print them.
GPU_LOG = """\
(APIServer pid=1) INFO 07-27 15:30:55 [api_utils.py:273] non-default args: {'model': '/m', 'tensor_parallel_size': 4, 'kv_cache_dtype': 'int8_per_token_head', 'enable_prefix_caching': True}
(EngineCore pid=205) INFO 07-27 15:31:51 [core.py:114] Initializing a V1 LLM engine (v0.25.1) with config: model='/m', dtype=torch.float16, kv_cache_dtype=int8_per_token_head, device_config=cuda, seed=0
(Worker_TP0 pid=215) INFO 07-27 15:32:18 [cuda.py:476] Using TRITON_ATTN attention backend out of potential backends: ['TRITON_ATTN'].
(EngineCore pid=205) INFO 07-27 15:33:01 [kv_cache_utils.py:1087] GPU KV cache size: 788,288 tokens
"""
CPU_LOG = """\
(EngineCore pid=6218) INFO 11-30 05:00:40 [core.py:101] Initializing a V1 LLM engine (v0.32.0) with config: model='/t', kv_cache_dtype=fp8_e4m3, device_config=cpu
(EngineCore pid=6218) INFO 11-30 05:00:52 [kv_cache_utils.py:2327] CPU KV cache size: 2,097,152 tokens, Maximum concurrency for 131,072 tokens per request: 16.00x
"""


def test_parse_gpu_log() -> None:
    found = parse_log(GPU_LOG)
    assert found["attention_backend"] == "TRITON_ATTN"
    assert found["attention_candidates"] == ["TRITON_ATTN"]
    assert found["engine_version"] == "0.25.1"
    assert found["kv_cache_dtype"] == "int8_per_token_head"
    assert found["kv_cache_size_tokens"] == 788288
    assert found["kv_cache_device"] == "GPU"
    assert found["non_default_args"]["tensor_parallel_size"] == 4


def test_parse_cpu_log_has_no_backend_line() -> None:
    found = parse_log(CPU_LOG)
    assert "attention_backend" not in found
    assert (found["kv_cache_dtype"], found["kv_cache_size_tokens"]) == ("fp8_e4m3", 2097152)


def test_flashinfer_candidates() -> None:
    line = "Using FLASHINFER attention backend out of potential backends: ['FLASHINFER', 'TRITON_ATTN']"
    assert parse_log(line)["attention_candidates"] == ["FLASHINFER", "TRITON_ATTN"]


METRICS = """\
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="128",cache_dtype="fp8_e4m3",enable_prefix_caching="True",kv_cache_size_tokens="2097152",mamba_cache_dtype="auto"} 1.0
# HELP vllm:prefix_cache_queries_total Prefix cache queries
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 512.0
vllm:prefix_cache_queries_total{engine="1",model_name="m"} 128.0
"""


def test_cache_config_and_counters() -> None:
    scraped = prometheus.parse(METRICS)
    cache = scraped.labels(CACHE_CONFIG_INFO)
    assert cache is not None and cache["cache_dtype"] == "fp8_e4m3"
    assert scraped.total("vllm:prefix_cache_queries_total") == 640.0
    assert scraped.total("vllm:prefix_cache_queries_total", engine="1") == 128.0
    assert scraped.total("vllm:absent_total") is None
    later = prometheus.parse(METRICS.replace("512.0", "600.0"))
    assert prometheus.delta(scraped, later, "vllm:prefix_cache_queries_total") == 88.0


def test_resolved_dtype_prefers_metrics_then_log() -> None:
    evidence = {
        "cache_config": {"cache_dtype": "auto", "kv_cache_size_tokens": "1048576"},
        "log": {"kv_cache_dtype": "fp8", "kv_cache_size_tokens": 5},
    }
    assert resolved_cache_dtype(evidence) == "auto"
    assert kv_capacity_tokens(evidence) == 1048576
    assert resolved_cache_dtype({"log": {"kv_cache_dtype": "fp8_e5m2"}}) == "fp8_e5m2"
    assert kv_capacity_tokens({"log": {"kv_cache_size_tokens": 7}}) == 7
    assert resolved_cache_dtype({}) is None


def test_salient_error_skips_wrappers_and_warnings() -> None:
    log = (
        "(APIServer pid=1) WARNING 11-30 05:00:20 [x.py:1] fd limit errors like `OSError: [Errno 24] Too many`\n"
        "(Worker pid=5) ERROR 11-30 04:59:39 [m.py:10] NotImplementedError: FP8 KV cache on CPU requires AVX-512.\n"
        "(EngineCore pid=4) ERROR 11-30 04:59:39 [core.py:1] RuntimeError: Engine core initialization failed. "
        "See root cause above.\n"
    )
    assert salient_error(log) == "NotImplementedError: FP8 KV cache on CPU requires AVX-512."
    assert salient_error("usage: a\napi_server.py: error: unrecognized arguments: --nope") == (
        "api_server.py: error: unrecognized arguments: --nope"
    )
    assert salient_error("all fine\n") is None


def test_engine_error_renders_headline_and_tail() -> None:
    err = EngineError("fp8: engine exited", "line 1\nline 2")
    assert str(err).splitlines() == [
        "fp8: engine exited",
        "  last lines of the engine log:",
        "    line 1",
        "    line 2",
    ]
    assert str(EngineError("just this")) == "just this"


def test_tail(tmp_path: Path) -> None:
    log = tmp_path / "engine.log"
    log.write_text("".join(f"line {i}\n" for i in range(100)))
    assert tail(log, 3) == "line 97\nline 98\nline 99"
    assert tail(tmp_path / "missing.log") == ""


def test_redaction() -> None:
    assert redact_env({"HF_TOKEN": "hf_x", "OPENAI_API_KEY": "k", "VLLM_X": "1"}) == {
        "HF_TOKEN": "***",
        "OPENAI_API_KEY": "***",
        "VLLM_X": "1",
    }
    assert redact_argv(["--api-key", "s3cret", "--hf-token=t", "--model", "m"]) == [
        "--api-key",
        "***",
        "--hf-token=***",
        "--model",
        "m",
    ]


def test_cpu_flags() -> None:
    avx2 = "model name\t: AMD EPYC\nflags\t\t: fpu sse4_1 sse4_2 avx avx2\n"
    avx512 = "model name\t: Intel Xeon\nflags\t\t: avx avx2 avx512f amx_tile\n"
    assert cpu_flags(avx2) == ("AMD EPYC", {"fpu", "sse4_1", "sse4_2", "avx", "avx2"})
    reason = fp8_kv_unsupported_reason(avx2)
    assert reason is not None and "AMD EPYC" in reason and "AVX-512 or AMX" in reason
    assert fp8_kv_unsupported_reason(avx512) is None
    assert fp8_kv_unsupported_reason("") is None  # unknown CPU: let the engine decide


SPEC_LINE = (
    "(EngineCore pid=9) INFO 12-01 12:00:00 [core.py:101] Initializing a V1 LLM engine (v0.32.0) with config: "
    "model='/t', speculative_config=SpeculativeConfig(method='ngram', model=None, num_spec_tokens=3), "
    "kv_cache_dtype=auto, device_config=cpu"
)


def test_the_speculative_setup_is_read_from_the_config_line_then_the_non_default_args() -> None:
    assert parse_log(SPEC_LINE)["speculative_config"].startswith("SpeculativeConfig(method='ngram'")
    assert speculative({"log": parse_log(SPEC_LINE)}) == "ngram, 3 tokens"  # type: ignore[typeddict-item]
    assert speculative({"log": parse_log(CPU_LOG.replace("model='/t',", "speculative_config=None,"))}) == "none"
    mtp = {"non_default_args": {"speculative_config": {"method": "mtp", "num_speculative_tokens": 2, "model": "/d"}}}
    assert speculative({"log": mtp}) == "mtp, 2 tokens, model /d"  # type: ignore[typeddict-item]
    assert speculative({"log": {"non_default_args": {"model": "/m"}}}) == "none"  # listed args, no speculation
    assert speculative({"log": {}}) is None  # the log says nothing


def test_acceptance_from_the_counter_deltas_of_one_request() -> None:
    engine = {"spec_drafts": 10, "spec_draft_tokens": 30, "spec_accepted_tokens": 12}
    assert prometheus.spec_metrics(engine) == {"acceptance_length": 2.2, "acceptance_rate": 0.4}
    assert prometheus.spec_metrics({"spec_drafts": 0, "spec_draft_tokens": 0, "spec_accepted_tokens": 0}) == {}
    assert prometheus.spec_metrics({}) == {}


# torch.compile lines of vLLM 0.25.1 on the H200 (a first boot, then one that found the cache) and the
# older "takes" wording.
COMPILED_LOG = """\
(EngineCore pid=999) INFO 12-01 13:09:40 [backends.py:393] Compiling a graph for compile range (1, 8192) takes 31.19 s
(EngineCore pid=999) INFO 12-01 13:09:54 [monitor.py:53] torch.compile took 46.32 s in total
(EngineCore pid=999) INFO 12-01 13:11:43 [gpu_model_runner.py:6707] Graph capturing finished in 6 secs, took 0.66 GiB
(EngineCore pid=999) INFO 12-01 13:11:44 [core.py:337] init engine (profile, create kv cache, warmup model) took 157.11 s (compilation: 46.32 s)
"""
CACHED_LOG = """\
(EngineCore pid=4775) INFO 06-04 12:28:16 [backends.py:292] Directly load the compiled graph(s) for compile range (1, 8192) from the cache, took 1.874 s
(EngineCore pid=4775) INFO 06-04 12:28:16 [decorators.py:311] Directly load AOT compilation from path /root/.cache/vllm/torch_compile_cache/torch_aot_compile/cb15/rank_0_0/model
(EngineCore pid=4775) INFO 06-04 12:28:17 [monitor.py:34] torch.compile takes 4.99 s in total
(EngineCore pid=4775) INFO 06-04 12:28:40 [core.py:344] init engine (profile, create kv cache, warmup model) took 40.02 s
"""


def test_compile_facts_of_a_compiling_boot() -> None:
    found = parse_log(COMPILED_LOG)
    assert found["compile_cache"] == "miss"
    assert (found["compile_s"], found["init_engine_s"], found["graph_capture_s"]) == (46.32, 157.11, 6.0)


def test_compile_facts_of_a_boot_that_loaded_the_cache() -> None:
    found = parse_log(CACHED_LOG)
    assert (found["compile_cache"], found["compile_s"], found["init_engine_s"]) == ("hit", 4.99, 40.02)


def test_compile_cache_partly_hit_and_eager_boots_say_nothing() -> None:
    assert parse_log(CACHED_LOG + COMPILED_LOG)["compile_cache"] == "partial"
    assert "compile_cache" not in parse_log(CPU_LOG) and "compile_s" not in parse_log(CPU_LOG)
