"""Real vLLM (CPU build): the plugin's main path and the failures a real engine produces."""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from pytest_kvcache.engines.registry import reap_orphans
from pytest_kvcache.probes import judging
from pytest_kvcache.run.folder import read_records
from tests.engine.conftest import SECOND_ARM, SECOND_DTYPE, Run, default_sigint, run_pytest, vllm_processes

pytestmark = pytest.mark.engine


def test_ab_run_passes_and_leaves_nothing_running(ab_run: Run) -> None:
    """Every probe test passes; the run exits 1 only for its quality gate, which the random-weight baseline
    cannot judge (an error with the reason, never PASS or FAIL)."""
    assert ab_run.returncode == 1, ab_run.output
    # 14 of the stock speed probes, 8 fidelity (4 texts × 2 arms), 2 of the user's probe the engine rejects
    assert "24 passed" in ab_run.output
    assert not vllm_processes(ab_run.tag)


def test_a_random_weight_baseline_cannot_judge_quality(ab_run: Run) -> None:
    report = json.loads((ab_run.folder / "report.json").read_text())
    check = report["baseline_check"]
    assert check["baseline"] == "auto" and check["can_judge"] is False and check["vocab"] == 4096
    assert check["nll_share"] > 0.9  # random weights: NLL ≈ ln(vocabulary)
    # its tokenizer is a trained BPE of 4,096 tokens (1.81 characters a token on the four texts): not the reason
    assert check["chars_per_token"] > judging.MIN_CHARS_PER_TOKEN
    assert check["problems"] and not [p for p in check["problems"] if "characters a token" in p]
    (gate,) = report["gates"]
    assert gate["outcome"] == "error" and "the baseline auto cannot judge quality: its NLL is" in gate["reason"]
    assert "cannot judge quality" in (ab_run.folder / "report.md").read_text().split("## Arms")[0]
    assert "cannot judge quality" in ab_run.output


def test_requests_the_engine_rejects_are_in_every_output_and_the_verdict_block(ab_run: Run) -> None:
    """The user's probe asked for more tokens than the model's context (HTTP 400 from real vLLM, at once):
    its point fails every request in both arms, and report.json, report.md, report.html (its verdict
    block) and the terminal all say so, with vLLM's own message."""
    report = json.loads((ab_run.folder / "report.json").read_text())
    found = report["failures"]
    rows = [r for r in found["rows"] if r["probe"] == "overflow"]
    assert [(r["arm"], r["kind"], r["count"], r["points_removed"]) for r in rows] == [
        ("auto", "http_error", 2, ["past_context"]),
        (SECOND_ARM, "http_error", 2, ["past_context"]),
    ]
    assert rows[0]["first_message"].startswith("HTTP 400: ") and "max_model_len=131072" in rows[0]["first_message"]
    assert found["failed"] >= 4
    md = (ab_run.folder / "report.md").read_text()
    assert "## Failures and exclusions" in md and "| auto | overflow | failed | http_error | 2 |" in md
    assert "FAILED (2 of 2: http_error)" in md
    html = (ab_run.folder / "report.html").read_text()
    verdict = html[html.index('<section id="verdict"') : html.index("</section>")]
    assert f"{found['failed']} failed requests</span>" in verdict and 'class="chip bad"' in verdict
    assert f"failures and exclusions: {found['failed']} of {found['measured']} measured request(s) failed" in (
        ab_run.output
    )


def test_ab_run_is_in_the_run_store_history(ab_run: Run, private_run_store: Path) -> None:
    """The finished real-engine run added its row to the store (this tier's own, never the user's), with
    every summary point and the comparability of a real vLLM boot."""
    from pytest_kvcache.store.sqlite import SqliteStore

    run_id = json.loads((ab_run.folder / "run.json").read_text())["run_id"]
    with SqliteStore(private_run_store) as store:
        rows = {r["run_id"]: r for r in store.runs()}
    row = rows[run_id]
    assert row["arms"] == ["auto", SECOND_ARM] and row["comparable_on"]["engine_versions"]
    assert {p["probe"] for p in row["points"]} >= {"short", "prefill", "agentic"}
    assert all(p["mean"] is not None for p in row["points"] if p["n"])


def test_ab_evidence_shows_each_arms_resolved_cache(ab_run: Run) -> None:
    auto, second = ab_run.evidence("auto"), ab_run.evidence(SECOND_ARM)
    assert auto["cache_config"]["cache_dtype"] == "auto"
    assert second["cache_config"]["cache_dtype"] == SECOND_DTYPE
    assert auto["log"]["kv_cache_dtype"] == "auto" and second["log"]["kv_cache_dtype"] == SECOND_DTYPE
    auto_tokens = int(auto["cache_config"]["kv_cache_size_tokens"])
    second_tokens = int(second["cache_config"]["kv_cache_size_tokens"])
    # The same 2 GiB of KV space holds twice the tokens at one byte per element.
    assert second_tokens == (2 * auto_tokens if SECOND_DTYPE.startswith("fp8") else auto_tokens)
    for evidence in (auto, second):
        assert evidence["engine_version"] and evidence["max_model_len"] == 131072
        assert evidence["status"] == "stopped" and evidence["ready_s"] > 0
        assert evidence["stopped_unix_s"] <= second["started_unix_s"] or evidence is second
    lines = [line for line in ab_run.output.splitlines() if "→ cache_dtype=" in line]
    assert lines[0].startswith("auto: declared auto → cache_dtype=auto")
    assert lines[1].startswith(f"{SECOND_ARM}: declared {SECOND_DTYPE} → cache_dtype={SECOND_DTYPE}")


def test_ab_records_are_complete_and_token_identical(ab_run: Run) -> None:
    records = [r for r in ab_run.records() if r["probe"] == "short"]
    assert len(records) == 2 * 2 * (1 + 3)
    assert all(r["ok"] for r in records), [r["error"] for r in records if not r["ok"]]
    # Greedy + ignore_eos: every arm decodes exactly max_tokens, so decode windows are comparable.
    assert {r["sample"]["completion_tokens"] for r in records} == {32}
    assert all(r["sample"]["token_clock"] == "usage" for r in records)
    measured = [r for r in records if r["phase"] == "measured"]
    assert all(r["metrics"]["ttft_s"] > 0 for r in measured)
    # decode_tps is there unless a flag voided it (a stall on a loaded machine can), and then it says why.
    assert all(r["metrics"]["decode_tps"] or r["voided"].get("decode_tps") for r in measured)
    # How many keep it is the host's doing, not the tool's, so it is not asserted: on a quiet 2-core host
    # (2026-12-06) every measured auto decode arrived in one burst at the end of its request (window 0.3% of
    # the wall: the engine's worker threads starve its API server) while every fp8 one streamed (window 90%);
    # on the CI machine 8 of 12 were voided. What is asserted: the report's decode_tps n per arm and shape
    # counts exactly the samples that kept it, so a voided decode never becomes a speed. A shape where no arm
    # kept one has no decode_tps row at all (CI, 2026-12-07: both arms' code decodes and auto's narrative ones
    # were voided, so the summary had two rows, auto's with n=0): the rows cover every kept pair, no more.
    kept = collections.Counter((r["arm"], r["shape"]) for r in measured if r["metrics"]["decode_tps"])
    report = json.loads((ab_run.folder / "report.json").read_text())
    rows = {
        (s["arm"], s["point"]): s["n"]
        for s in report["summary"]
        if s["probe"] == "short" and s["metric"] == "decode_tps"
    }
    assert set(kept) <= set(rows) and all(n == kept[key] for key, n in rows.items()), (rows, kept)
    assert {point for _, point in rows} == {shape for _, shape in kept}, (rows, kept)
    assert "Short-context probes (measured samples" in ab_run.output


def test_engine_rejecting_an_argument_errors_with_its_log_tail(tmp_path: Path) -> None:
    run = run_pytest(tmp_path, "--kv-arms=auto", "--kv-engine-args=--no-such-flag", "-m", "short")
    assert run.returncode == 1, run.output
    assert "2 errors" in run.output
    assert "auto: engine exited with code 2 during startup" in run.output
    assert "unrecognized arguments: --no-such-flag" in run.output
    assert "last lines of the engine log:" in run.output
    assert "Traceback" not in run.output.split("= ERRORS =")[1].split("= kvcache =")[0]
    assert not vllm_processes(run.tag)


def test_ctrl_c_mid_run_stops_vllm_and_keeps_records(tmp_path: Path) -> None:
    tag = f"kvtest-{uuid.uuid4().hex[:10]}"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "--kv-arms=auto",
            "--kv-warmups=0",
            "--kv-runs=200",
            "--kv-max-tokens=64",
            f"--kv-engine-args=--served-model-name {tag}",
        ],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        preexec_fn=default_sigint,  # a shell that started us in the background may ignore SIGINT
    )
    try:
        path = tmp_path / ".kvcache" / "runs" / "latest" / "requests.jsonl"
        deadline = time.monotonic() + 300
        while not (path.exists() and len(read_records(path)) >= 2):
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.5)
        assert vllm_processes(tag)
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:  # the test failed half-way: leave nothing running
            proc.kill()
            proc.communicate()
            reap_orphans(tmp_path / ".kvcache" / "runs")
    assert proc.returncode == pytest.ExitCode.INTERRUPTED, out.decode()
    assert not vllm_processes(tag)
    assert len(read_records(path)) >= 2


def test_prefill_samples_are_exact_depth_and_proven_cold(ab_run: Run) -> None:
    prefill = [r for r in ab_run.records() if r["probe"] == "prefill"]
    assert len(prefill) == 2 * 2 * (1 + 2)
    for r in prefill:
        assert r["ok"] and r["excluded_reason"] is None, r
        assert abs(r["sample"]["prompt_tokens"] - r["depth"]) <= 0.01 * r["depth"], r["sample"]
        assert r["cold_proof"] == "metrics" and r["engine"]["prefix_cache_hits"] == 0
        assert r["metrics"]["prefill_tps"] > 0 and r["metrics"]["engine_prefill_s"] > 0
    # Arm A's k-th request is byte-identical to arm B's; no two requests of one arm are.
    by_arm: dict[str, list[str]] = {}
    for r in prefill:
        by_arm.setdefault(r["arm"], []).append(r["prompt_sha256"])
    assert by_arm["auto"] == by_arm[SECOND_ARM]
    assert len(set(by_arm["auto"])) == len(by_arm["auto"])
    assert "Fresh-prefill probes (measured samples" in ab_run.output


def test_concurrency_streams_are_read_by_the_many_stream_client(ab_run: Run) -> None:
    """Real vLLM's chunked SSE through the many-stream client: 8 streams a trial, all timed by the token clock,
    sent together, each record carrying the trial's client load; the report states that load."""
    conc = [r for r in ab_run.records() if r["probe"] == "concurrency" and r["phase"] == "measured"]
    assert len(conc) == 2 * 3 * 8 and all(r["ok"] and r["sample"]["token_clock"] == "usage" for r in conc)
    assert all(r["sample"]["completion_tokens"] == 32 and r["metrics"]["ttft_s"] > 0 for r in conc)
    for boot in ("auto", SECOND_ARM):
        for trial in range(3):
            streams = [r for r in conc if r["boot"] == boot and r["index"] == trial]
            sends = [r["sample"]["send_unix_s"] for r in streams]
            (text,) = {json.dumps(r["client"], sort_keys=True) for r in streams}  # one load per trial
            load = json.loads(text)
            assert len(streams) == 8 and load["streams"] == 8 and load["processes"] == 1
            # sent together, or flagged: on 2 cores vLLM's CPU build can keep the client off the CPU for 100s of ms
            assert max(sends) - min(sends) < 0.05 or load["saturated"]
    report = json.loads((ab_run.folder / "report.json").read_text())
    assert report["client_load"]["trials"] == 2 * 3
    assert "Many-stream client over 6 measured concurrency trial(s)" in (ab_run.folder / "report.md").read_text()
    saturated = [t["arm"] for t in report["client_load"]["saturated"]]  # excluded from the figures, if any
    agg = {s["arm"]: s["n"] for s in report["summary"] if s["metric"] == "aggregate_tps"}
    assert agg == {arm: 3 - saturated.count(arm) for arm in ("auto", SECOND_ARM)}


def test_agentic_replay_prompts_are_identical_across_arms(ab_run: Run) -> None:
    agentic = [r for r in ab_run.records() if r["probe"] == "agentic"]
    assert len(agentic) == 2 * 2 * 3 and all(r["ok"] for r in agentic)
    hashes = {(r["arm"], r["session"], r["turn"]): r["prompt_sha256"] for r in agentic}
    for (_arm, session, turn), digest in hashes.items():
        assert digest == hashes[("auto", session, turn)]
    assert hashes[("auto", 1, 1)] != hashes[("auto", 2, 1)], "each session has its own salt"
    first_turns = [r for r in agentic if r["turn"] == 1]
    assert all(r["sample"]["cached_tokens"] == 0 for r in first_turns), "session 2 must miss session 1's cache"
    later = [r for r in agentic if r["turn"] > 1]
    assert all(r["sample"]["cached_tokens"] > 0 for r in later), "within a session, earlier turns are cached"
    assert {r["sample"]["completion_tokens"] for r in agentic} == {48}
    assert "agentic decode-at-depth" in ab_run.output and "TTFT grew" in ab_run.output


# ------------------------------------------------------------------ a clean A/B (issue: replicated boots)


def test_ab_outputs_are_compared_and_the_boots_are_clean(ab_run: Run) -> None:
    report = json.loads((ab_run.folder / "report.json").read_text())
    assert report["confounds"]["status"] == "clean", report["confounds"]["confounds"]
    assert report["confounds"]["compared"] > 40  # argv, env, non-default args, cache_config, version, model
    declared = {d["path"] for d in report["confounds"]["declared"]}
    assert {"argv.--kv-cache-dtype", "cache_config.cache_dtype", "non_default_args.kv_cache_dtype"} <= declared
    rows = {(r["kind"], r["arm"], r["shape"]): r for r in report["agreement"]["rows"]}
    for shape in ("narrative", "code"):
        between = rows[("between arms", SECOND_ARM, shape)]
        assert between["pairs"] == 2 and between["length"] == 32
        assert 0 <= between["identical_share"] <= 1
        within = rows[("within a boot", "auto", shape)]
        assert within["pairs"] == 1
    assert report["self_check"]["summary"].startswith("Measuring-client self-check (quick")


def test_fidelity_aa_across_boots_is_zero_and_the_second_kv_type_is_judged_against_it(replicates_run: Run) -> None:
    """The trained model on the CPU build (bf16 weights): the same arm booted twice scores identical prompt
    logprobs at every depth on every text (the measure's floor: a CI of [0, 0] over the 4 texts, real). fp8
    KV (AVX-512/AMX) moves them beyond that floor, its CI over the 4 texts (3 df) wholly above it; float16 KV
    (AVX2) scores exactly what bf16 KV does — vLLM 0.32's CPU build computes the prompt's attention alike
    with either (seen also with 256-token prefill chunks, which read the cache back): the llama.cpp tier
    shows q4_0's effect there."""
    run = replicates_run
    assert run.returncode == 0, run.output
    scored = [json.loads(line) for line in (run.folder / "fidelity.jsonl").read_text().splitlines()]
    assert len(scored) == 16 and all(r["ok"] and not r["excluded_reason"] for r in scored)  # 4 texts × 2 × 2
    assert {r["cold_proof"] for r in scored} == {"metrics"} and len({r["ids_sha256"] for r in scored}) == 4
    for r in scored:
        assert [w["depth"] for w in r["windows"]] == [500, 1000] and len(r["windows"][1]["ids"]) == 256
        nll = -sum(r["windows"][1]["logprob"]) / 256
        assert nll < 4.0  # a trained model: ~1-3 nats/token on English and code, not random weights' ~10.8
    report = json.loads((run.folder / "report.json").read_text())
    rows = {(r["kind"], r["arm"], r["point"]): r for r in report["fidelity"]["rows"]}
    for arm in ("auto", SECOND_ARM):
        for point in ("500", "1k"):
            floor = rows[("across boots", arm, point)]
            assert floor["logprob_drift"] == pytest.approx(0.0, abs=1e-6) and floor["positions"] == 1024
            assert floor["texts"] == 4 and floor["logprob_drift_ci"] == pytest.approx([0.0, 0.0], abs=1e-6)
    for point in ("500", "1k"):
        ab = rows[("between arms", SECOND_ARM, point)]
        assert (ab["boots"], ab["texts"], ab["ci_basis"], ab["ci_df"]) == (2, 4, "over texts", 3), ab
        floor_high = rows[("across boots", "auto", point)]["logprob_drift_ci"][1]
        if SECOND_ARM == "fp8":
            # every text moves beyond its floor (exactly 0); how far varies by kind of text — structured data
            # least — so the CI over 4 texts (t on 3 df) is wide: it is asked to clear the floor at the deeper
            # depth only (0.015–0.201 there on this project's AVX-512 machine, data 0.03 and code 0.16 a text;
            # 0.011–0.245 at 500)
            assert all(drift > 0.0 for drift in ab["per_text"].values()), ab
            lo, hi = ab["logprob_drift_ci"]
            assert lo < ab["logprob_drift"] < hi and (point != "1k" or lo > floor_high), ab
        else:
            assert ab["logprob_drift"] == pytest.approx(0.0, abs=1e-6), ab
    verdict = "nats/token at 1k (95% CI over 4 texts "
    assert any(v.startswith(f"{SECOND_ARM} vs auto: ") and verdict in v for v in report["verdicts"])
    assert "## Fidelity at depth" in (run.folder / "report.md").read_text()
    assert (run.folder / "fidelity.png").is_file()


def test_the_trained_default_can_judge_quality(replicates_run: Run) -> None:
    """SmolLM2-135M-Instruct reads the fidelity texts far from chance, through a subword tokenizer, and its greedy
    continuations do not loop on a few characters (docs/models.md has the figures)."""
    report = json.loads((replicates_run.folder / "report.json").read_text())
    check = report["baseline_check"]
    assert check["can_judge"] is True, check
    assert check["vocab"] == 49152 and check["nll_share"] < 0.4 and check["chars_per_token"] > 2.5
    assert check["unchecked"] == [] and check["greedy"]
    assert "can judge quality." in replicates_run.output


def test_two_workers_boot_counterbalanced_blocks_side_by_side(replicates_run: Run) -> None:
    """``-n 2``, 2 arms × 2 replicates on real vLLM: 4 boots, 2 per worker, lane 0 A B and lane 1 B A at
    the same time; one run folder and one report with the block table; no engine left."""
    run = replicates_run
    assert run.returncode == 0, run.output
    assert not vllm_processes(run.tag)
    lanes = {"lane 0": ["auto.r1", f"{SECOND_ARM}.r1"], "lane 1": [f"{SECOND_ARM}.r2", "auto.r2"]}
    report = json.loads((run.folder / "report.json").read_text())
    assert report["ci"]["lane_order"] == lanes and report["ci"]["method"] == "within-boot"
    assert [(b["lane"], b["boots"], b["status"]) for b in report["blocks"]] == [
        (0, lanes["lane 0"], "complete"),
        (1, lanes["lane 1"], "complete"),
    ]
    for boots in lanes.values():  # each lane: one boot after the other
        first, second = (run.evidence(b) for b in boots)
        assert first["stopped_unix_s"] <= second["started_unix_s"]
    a, b = run.evidence("auto.r1"), run.evidence(f"{SECOND_ARM}.r2")  # the lanes: side by side
    assert a["started_unix_s"] < b["stopped_unix_s"] and b["started_unix_s"] < a["stopped_unix_s"]
    all_boots = [*lanes["lane 0"], *lanes["lane 1"]]
    short = [r for r in run.records() if r["probe"] == "short" and r["phase"] == "measured"]
    assert {(r["boot"], r["shape"]) for r in short if r["ok"]} == {
        (b, shape) for b in all_boots for shape in ("narrative", "code")
    }
    # Two vLLM engines, two workers and their clients on 2 cores starve each other's streams: the tokens
    # of a short decode often arrive in one burst, and the client voids its decode_tps rather than report a
    # speed it did not see (each voided sample says so). TTFT is measured on every sample.
    assert all(r["metrics"]["ttft_s"] is not None for r in short)
    assert all(r["metrics"]["decode_tps"] is not None or "decode_window_short" in r["flags"] for r in short)
    assert report["confounds"]["status"] == "clean", report["confounds"]["confounds"]
    rows = {(r["kind"], r["arm"], r["shape"]): r for r in report["agreement"]["rows"]}
    across = rows[("across boots", "auto", "code")]  # the same arm booted twice, on two lanes: auto vs auto
    assert across["pairs"] == 1 and across["length"] == 32
    md = (run.folder / "report.md").read_text()
    assert f"Order on lane 0: auto.r1 → {SECOND_ARM}.r1" in md and "## Blocks (pytest-xdist lanes)" in md
    assert "CIs cover within-boot noise only" in md


def test_a_users_kv_openai_probe_checks_the_trained_models_answer(replicates_run: Run) -> None:
    """``kv_openai``: an ``openai.OpenAI`` client on the arm's server; the trained model names Paris in every
    boot, whichever KV type. Its call is not a measured request (no record)."""
    out = replicates_run.output
    for boot in ("auto.r1", f"{SECOND_ARM}.r1", f"{SECOND_ARM}.r2", "auto.r2"):
        assert f"PASSED test_answers.py::test_the_trained_model_names_the_capital[{boot}]" in out, out[-4000:]
    assert not [r for r in replicates_run.records() if "test_answers" in r["test"]]


CONFOUNDED_ARM = """
[tool.pytest_kvcache.arms.f16x]
kv_cache_dtype = "float16"
args = ["--speculative-config", '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3}']
knobs = ["kv_cache_dtype"]
"""


def test_an_undeclared_speculative_config_is_a_confound_and_its_acceptance_is_reported(tmp_path: Path) -> None:
    """vLLM's CPU build serves ngram speculative decoding: the arm that turns it on without declaring it
    makes the A/B CONFOUNDED, and its acceptance (from the per-request counter deltas) is in the report."""
    (tmp_path / "pyproject.toml").write_text(CONFOUNDED_ARM)
    run = run_pytest(
        tmp_path,
        "--kv-arms=auto,f16x",
        "--kv-model=embedded:tiny-qwen3",
        "-m",
        "short",
        "-k",
        "code",
        "--kv-warmups=0",
        "--kv-runs=2",
        "--kv-max-tokens=64",
        "--kv-no-agreement",
        "--kv-no-self-check",
    )
    assert run.returncode == 1, run.output
    assert "2 passed" in run.output
    assert "  argv.--speculative-config: " in run.output and " in f16x vs absent in auto" in run.output
    assert "the A/B is CONFOUNDED (see above): exit code 1" in run.output
    report = json.loads((run.folder / "report.json").read_text())
    found = {c["path"] for c in report["confounds"]["confounds"]}
    assert "argv.--speculative-config" in found and any(p.startswith("non_default_args.speculative") for p in found)
    assert {a["name"]: a["resolved"]["speculative"] for a in report["arms"]} == {
        "auto": "none",
        "f16x": "ngram, 3 tokens",
    }
    spec = report["spec_decode"]
    assert spec["config"] == {"auto": "none", "f16x": "ngram, 3 tokens"}
    (row,) = spec["rows"]
    assert (row["arm"], row["probe"], row["point"], row["requests"]) == ("f16x", "short", "code", 2)
    assert row["drafts"] > 0 and 1.0 <= row["acceptance_length"] <= 4.0 and len(row["per_position"]) == 3
    assert row["drafts"] <= row["drafted"] <= 3 * row["drafts"] and row["accepted"] <= row["drafted"]
    lengths = [s for s in report["summary"] if s["metric"] == "acceptance_length" and s.get("mean") is not None]
    assert [s["arm"] for s in lengths] == ["f16x"]
    assert lengths[0]["mean"] == pytest.approx(row["acceptance_length_mean"])
    # several tokens a chunk
    measured = [rec for rec in run.records() if rec["arm"] == "f16x" and rec["phase"] == "measured"]
    assert all(rec["sample"]["token_chunks"] < rec["sample"]["completion_tokens"] for rec in measured)
    # with no warm-up the first request after boot may spend over 95% of its time before its first token: its
    # decode rate is then voided, and the record names why (CI at 5e21306: decode_tps None); a rate is > 0
    rates = [rec["metrics"]["decode_tps"] for rec in measured]
    assert all(
        rate > 0 if rate is not None else rec["voided"].get("decode_tps") in ("decode_window_short", "no_decode_window")
        for rate, rec in zip(rates, measured, strict=True)
    )
    assert any(rate is not None for rate in rates), [rec["voided"] for rec in measured]
    assert "## Speculative decoding" in (run.folder / "report.md").read_text()
    assert (run.folder / "spec_decode.png").is_file() is False  # short shapes have no depth curve
    assert not vllm_processes(run.tag)


# ------------------------------------------------------------------ capacity under an SLO (3 boots)


def test_capacity_follows_the_kv_budget_and_an_a_a_covers_one(capacity_run: Run) -> None:
    """Real vLLM with --kv-cache-memory-bytes: every search re-tries its knee and the levels either side of it,
    the report brackets each knee between tried levels and its intervals end on tried levels; the A/A's ratio,
    judged on its interval widened by capacity's own band, covers 1, and twice the KV budget sustains more
    sessions (the knees' ratio above 1) and that judged interval covers the ratio of the KV tokens the engines
    report; the smaller arm's knee is 4–8. Coverage, not width: a busy host widens them. The KV-residency knee
    (the prefix-cache hit rate at least half) of twice the budget is clearly larger (at least 1.5×)."""
    run = capacity_run
    assert run.returncode == 0, run.output
    assert "3 passed" in run.output and not vllm_processes(run.tag)
    tokens = {}
    for boot, budget in (("auto", 40), ("auto.2", 40), ("big", 80)):
        evidence = run.evidence(boot)
        cache = evidence["cache_config"]
        assert int(cache["kv_cache_memory_bytes"]) == budget * 2**20  # the budget reached the engine
        assert "VLLM_CPU_KVCACHE_SPACE" not in (evidence.get("env") or {})  # it would have overridden it
        tokens[boot] = int(cache["kv_cache_size_tokens"])
    assert tokens == {"auto": 20480, "auto.2": 20480, "big": 40960}
    assert "KV budget 40 MiB (20,480 tokens at 2,048 B/token; max_model_len 8,192)" in run.output
    report = json.loads((run.folder / "report.json").read_text())
    rows = {r["arm"]: r for r in report["capacity"]["rows"]}
    assert 4 <= rows["auto"]["capacity"] <= 8 and not rows["auto"]["censored"]
    trials = report["capacity"]["trials"]
    for arm, row in rows.items():
        judged = [t["sessions"] for t in trials if t["arm"] == arm and t["verdict"] != "excluded"]
        assert any(t["step"] == "confirm" for t in trials if t["arm"] == arm), judged  # the knee was re-tried
        k, broke = int(row["capacity"]), row["first_broken"]["sessions"]
        assert row["bracket"].startswith(f"met at {k}, broke at {broke}; "), row["bracket"]
        lo, hi = row["capacity_ci"]
        if "interval_note" in row:  # the knee moved past the re-centre: no interval, and the report says why
            assert lo is None and hi is None, row
        else:  # the knee and its neighbours had 2 trials each; the interval's ends are levels that were tried, or 0
            # where the smallest level tried breaks in a bootstrap replicate (on a busy host: auto.2's lower end was 0)
            assert all(judged.count(n) >= 2 for n in (k - 1, k, k + 1) if 1 <= n <= 16), judged
            assert (lo in judged or lo == 0) and hi in judged and lo <= k <= hi, row
    deltas = {d["arm"]: d for d in report["deltas"] if d["probe"] == "capacity" and d["metric"] == "capacity"}
    aa, big = deltas["auto.2"], deltas["big"]
    # a ratio has no interval only where a knee moved past its re-centre (its row's interval_note), and says so
    assert (aa["decided_ci"] is None) == ("ci_note" in aa) and (big["decided_ci"] is None) == ("ci_note" in big)
    if aa["decided_ci"] is not None:
        # judged on the within-boot interval widened by capacity's own band (one boot a side), named on the first
        # screen (or the widest capacity spread, when the host was busy)
        assert "capacity" in aa["spread"]["text"], aa
        assert any("capacity" in line for line in report["bands"]["spreads"].values()), report["bands"]
        lo, hi = aa["decided_ci"]
        assert lo <= 1.0 <= hi, aa  # coverage, not width: the width is the host's load
    # twice the KV sustains more sessions in this run (the knees' ratio above 1), and the interval it is judged on
    # covers what the KV allows. On a 2-core host the CPU binds big's knee before its KV does, at ~10-12 sessions,
    # so its own interval can reach below 1: big's knee was 9, 1.50× [1.33, 1.50], judged on [0.97, 2.31], with
    # the plugin tier running; at de663c7 its 10 broke one of two trials (ttft_p95 0.27 s against 0.25 s) and its
    # knee 11 had [5, 11], 1.83× [0.83, 1.83], judged on [1.02, 3.28]. The KV's own claim is the residency knee's,
    # below (2.14× [1.86, 2.29] there).
    assert big["ratio"] > 1.0, big
    if big["decided_ci"] is not None:
        lo, hi = big["decided_ci"]
        assert lo <= tokens["big"] / tokens["auto"] <= hi, big
    assert rows["auto"]["knee_cause"] == "kv"  # the prefix-cache hit rate fell past the knee
    # the KV-residency knee (the hit rate at least half), from the same trials: twice the budget holds clearly
    # more sessions (~6.4 and ~12.8 of 3K fit), the A/A's within a session of each other
    held = {arm: row["residency"] for arm, row in rows.items()}
    assert all(isinstance(v, float) for v in held.values()), held
    assert not rows["auto"]["residency_censored"] and not rows["auto.2"]["residency_censored"], rows
    # big's hit rate can stay at half or more up to the search's top (16 sessions: vLLM evicts a sequence's tail
    # blocks first, so 16 × 3K against 40,960 tokens still hits on most prefixes); its knee is then a lower bound,
    # shown "≥ 16" and named in the notes, and the claim holds on that bound (CI at acdb282: big 16, auto 7)
    censored = {arm for arm, row in rows.items() if row["residency_censored"]}
    assert censored <= {"big"} and all(held[arm] == 16 for arm in censored), (censored, held)
    if censored:
        assert any("the cache holds at least 16 sessions" in n for n in report["capacity"]["notes"]), report
    assert held["big"] >= 1.5 * held["auto"] and abs(held["auto.2"] - held["auto"]) <= 1, held
    assert 5 <= held["auto"] <= 9, held
    for arm, row in rows.items():
        judged = [t["sessions"] for t in trials if t["arm"] == arm and t["verdict"] != "excluded"]
        fell = "none below half" if arm in censored else "hit rate below half at "
        assert row["residency_bracket"].startswith(f"held at {held[arm]:.0f}, {fell}"), row
        lo, hi = row["residency_ci"]
        assert (lo is None) == ("residency_interval_note" in row)
        assert lo is None or ((lo in judged or lo == 0) and hi in judged), row
    resident = next(d for d in report["deltas"] if d["arm"] == "big" and d["metric"] == "kv_residency")
    assert resident["ratio"] == pytest.approx(held["big"] / held["auto"])
    assert resident["ci_low"] is None or resident["ci_low"] > 1.0, resident
    recs = [r for r in run.records() if r["probe"] == "capacity" and r["phase"] == "measured"]
    assert all(r["capacity"]["engine"]["prefix_cache_queries"] > 0 for r in recs)
    assert all(r["sample"]["completion_tokens"] == 8 for r in recs if r["ok"])
    (gate,) = report["gates"]
    assert gate["value"] == pytest.approx(rows["big"]["ratio"])
    assert (gate["ci_low"] is None) == (big["decided_ci"] is None), gate  # the gate reads the delta's interval
    assert any(v.startswith("big sustains") and "vs auto's" in v for v in report["verdicts"])
    assert (run.folder / "capacity_3k.png").is_file()
