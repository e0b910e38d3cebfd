"""The capacity probe through pytest on the stand-in engine, whose KV-capacity model (an LRU prefix cache the size
of the arm's --kv-cache-memory-bytes, TTFT growing with the uncached prompt) stands in for vLLM's: real vLLM's
search is tests/engine/test_vllm_cpu.py's."""

from __future__ import annotations

import json
import math

import pytest

from pytest_kvcache.run.folder import read_records
from tests.plugin.conftest import STANDIN, latest

BIG_ARM = """
[tool.pytest_kvcache.arms.big]
args = ["--kv-cache-memory-bytes", "6M"]
"""


def capacity_args(tag: str, *extra: str) -> list[str]:
    """A small search on the stand-in: 400-word sessions, a prefill of 1,000 words/s (a miss costs 0.4 s, a hit
    ~10 ms), an SLO of 150 ms, short trials. 3 MiB of KV is 1,536 tokens: about three sessions."""
    return [
        f"--kv-engine-cmd={STANDIN}",
        f"--kv-engine-args={tag} --max-model-len 1024 --standin-prefill-tps 1000 --standin-ttft 0.01",
        "--kv-startup-timeout=20",
        "--kv-no-self-check",
        "-p",
        "no:cacheprovider",
        "-m",
        "capacity",
        "--kv-cache-bytes=3M",
        "--kv-capacity-depths=400",
        "--kv-slo=ttft_p95<=150ms",
        "--kv-capacity-think=0.4",
        "--kv-capacity-window=1.5",
        "--kv-capacity-max-tokens=8",
        "--kv-capacity-start=2",
        "--kv-capacity-max-sessions=16",
        *extra,
    ]


def test_twice_the_kv_capacity_sustains_about_twice_the_sessions(pytester: pytest.Pytester, tag: str) -> None:
    """Two arms whose KV budgets differ 2:1: the search finds each knee within one session of what the KV holds,
    tries it and the levels either side of it twice, the larger arm sustains about twice the sessions, its cache
    holds about twice the sessions (the KV-residency knee, the hit rate at least half), and the report, plot, gate
    and verdict say so; a re-render rebuilds them from the records alone. The gate's threshold is one the
    capacity's own band (a one-session step at a knee of 6: ×/÷ 1.53 at one boot a side) can decide at one boot."""
    pytester.makepyprojecttoml(BIG_ARM)
    gate = "--kv-fail=capacity[capacity@400]: big >= auto * 1.25"
    result = pytester.runpytest_subprocess(*capacity_args(tag, "--kv-arms=auto,big", gate))
    assert result.ret == 0, result.stdout.str()
    result.stdout.fnmatch_lines(
        [
            "*capacity: depths 400, SLO ttft_p95<=150ms, think 0.4 s, 1.5 s measured per trial*",
            "*1. auto.r1 (baseline): kv_cache_dtype=auto, KV budget 3 MiB (1,536 tokens at 2,048 B/token; "
            "max_model_len 1,024)*",
            "*2. big.r1: * KV budget 6 MiB (3,072 tokens at 2,048 B/token*",
            "kvcache: capacity@400 auto.r1 2 sessions (up): meets*",
        ]
    )
    run = latest(pytester)
    report = json.loads((run / "report.json").read_text())
    rows = {r["arm"]: r for r in report["capacity"]["rows"]}
    assert {a: r["kv_tokens"] for a, r in rows.items()} == {"auto": 1536, "big": 3072}  # the evidence proves it
    assert {a: r["kv_budget_bytes"] for a, r in rows.items()} == {"auto": 3 * 2**20, "big": 6 * 2**20}
    trials = report["capacity"]["trials"]
    for arm, row in rows.items():
        at = [t for t in trials if t["arm"] == arm and t["sessions"] == row["capacity"] and t["verdict"] == "meets"]
        knee = row["kv_tokens"] / at[0]["context_tokens"]  # the sessions of that context the KV cache holds
        assert abs(row["capacity"] - knee) <= 1.0, (arm, row["capacity"], knee)
        assert not row["censored"] and row["knee_cause"] == "kv"
        tried = [t["sessions"] for t in trials if t["arm"] == arm and t["verdict"] != "excluded"]
        assert tried[:2] == [2, 4] and row["first_broken"]["sessions"] == row["capacity"] + 1  # bisected to one
        k = int(row["capacity"])  # then the knee and its neighbours, twice each: the bracket says so
        assert all(tried.count(n) >= 2 for n in (k - 1, k, k + 1)), tried
        assert row["bracket"] == f"met at {k}, broke at {k + 1}; 2 trials each" and "interval_note" not in row
        # the residency knee (the hit rate at least half) from the same trials: from one session below what the KV
        # holds to 1.5 above it, at or above the SLO's knee (the cache set it), its neighbours tried twice too. The
        # stand-in evicts a request's tail before its head, as vLLM does, so a session past what the KV holds still
        # finds most of its prefix: on CI (2026-12-06) 6.76 sessions of KV gave a hit rate of 0.74-0.81 at 7 sessions
        # and 0.46-0.54 at 8, a knee of 8 (1.24 above)
        r = int(row["residency"])
        held = [t for t in trials if t["arm"] == arm and t["sessions"] == r and t["verdict"] != "excluded"]
        assert -1.0 <= r - row["kv_tokens"] / held[0]["context_tokens"] <= 1.5, (arm, r)
        assert k <= r <= k + 2 and all(tried.count(n) >= 2 for n in (r - 1, r, r + 1)), (r, tried)
        assert row["residency_bracket"] == f"held at {r}, hit rate below half at {r + 1}; 2 trials each"
        assert row["knee_bound"].startswith(f"KV (the cache holds {r} sessions"), row["knee_bound"]
        # the re-trials are around the two knees (the search goes on past the SLO's knee to the residency's)
        confirm = [t for t in trials if t["arm"] == arm and t["step"] == "confirm"]
        assert confirm and {t["sessions"] for t in confirm} <= {k - 1, k, k + 1, r - 1, r, r + 1}
        lo, hi = row["capacity_ci"]
        assert row["boots"] > 1 or (lo in tried and hi in tried)  # one boot: the interval's ends were tried
    ratio = rows["big"]["capacity"] / rows["auto"]["capacity"]
    assert 1.5 <= ratio <= 2.5 and rows["big"]["ratio"] == pytest.approx(ratio)
    lo, hi = rows["big"]["ratio_ci"]
    assert lo <= ratio <= hi
    # twice the KV holds about twice the sessions: the residency knees' ratio, its CI around it
    resident = rows["big"]["residency"] / rows["auto"]["residency"]
    assert 1.5 <= resident <= 2.5 and rows["big"]["residency_ratio"] == pytest.approx(resident)
    lo, hi = rows["big"]["residency_ratio_ci"]
    assert lo <= resident <= hi
    # every turn is a record: warmups and measured turns of every trial, with the trial's figures
    recs = [r for r in read_records(run / "requests.jsonl") if r["probe"] == "capacity"]
    assert {r["phase"] for r in recs} == {"warmup", "measured"} and all(r["capacity"]["slo"] for r in recs)
    engine = [r["capacity"]["engine"] for r in recs if r["phase"] == "measured"]
    assert all(e["prefix_cache_queries"] > 0 for e in engine)  # /metrics deltas over each window
    # the gate judges the capacity ratio through the normal path; the sentence and the plot say the same
    (judged,) = report["gates"]
    assert judged["value"] == pytest.approx(ratio) and judged["ci_low"] >= 1.25
    # decided by its evidence: at one boot a side on the capacity's own band (or the widest capacity spread, when
    # the host was busy), else after the boots a gate adds
    assert judged["outcome"] == "pass" and judged["evidence"]["kind"] in ("default band", "widest", "boots"), judged
    if judged["evidence"]["kind"] != "boots":
        assert "capacity" in judged["evidence"]["source"], judged
        assert report["bands"]["spreads"], report["bands"]  # the first screen names the spread it was judged with
    (sentence,) = [v for v in report["verdicts"] if v.startswith("big sustains")]
    cap = f"{rows['big']['capacity']:.0f}"
    assert sentence.startswith(f"big sustains {cap} [") and f" sessions at 400 ({rows['big']['bracket']})" in sentence
    assert f" vs auto's {rows['auto']['capacity']:.0f} [" in sentence and f"({rows['auto']['bracket']})" in sentence
    assert f": {ratio:.2f}× [" in sentence and "under ttft_p95<=150ms" in sentence
    assert f"; its cache holds {rows['big']['residency']:.0f} [" in sentence and f": {resident:.2f}× [" in sentence
    assert (run / "capacity_400.png").is_file()
    md = (run / "report.md").read_text()
    assert "## Capacity under the SLO" in md and "| 400 | big |" in md and "Trials:" in md
    html = (run / "report.html").read_text()
    assert "<h2>Capacity under the SLO</h2>" in html and "<h2>Capacity trials</h2>" in html
    assert 'alt="capacity_400"' in html and "Capacity at 400: goodput against concurrent sessions" in html
    result.stdout.fnmatch_lines(["verdict: big sustains*", "gate *: capacity[[]capacity@400]: big >= auto * 1.25*"])
    # the stored run's capacity section, plot and gates come back from its records alone
    (run / "capacity_400.png").unlink()
    again = pytester.runpytest_subprocess(
        f"--kv-rerender={run}", "--kv-fail=capacity[capacity@400]: >= 1", "-p", "no:cacheprovider"
    )
    assert again.ret == 0, again.stdout.str()
    after = json.loads((run / "report.json").read_text())
    assert after["capacity"]["rows"] == report["capacity"]["rows"] and (run / "capacity_400.png").is_file()
    assert {g["name"].split("(")[1].rstrip(")") for g in after["gates"]} == {"auto", "big"}
    assert all(g["ci_low"] is not None for g in after["gates"])
    assert (run / "report.md").read_text().count("## Capacity under the SLO") == 1


def test_a_budget_too_small_for_max_model_len_is_a_usage_error(pytester: pytest.Pytester, tag: str) -> None:
    args = [a for a in capacity_args(tag, "--kv-arms=auto") if not a.startswith("--kv-engine-args")]
    result = pytester.runpytest_subprocess(*args, f"--kv-engine-args={tag}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["*arm auto: a KV budget of 3 MiB holds 1,536 tokens at 2,048 bytes a token (auto KV on bfloat16 weights; "
         "tiny-qwen3: 4 layers × 2 KV heads × 64), fewer than max_model_len 131,072*"]
    )  # fmt: skip


def test_capacity_runs_on_a_generic_server_without_metrics(pytester: pytest.Pytester, tag: str) -> None:
    """--kv-engine=openai: no /metrics, so no engine figures; the hit rate comes from the turns' usage, and the
    stand-in's own KV model (here --standin-kv-tokens: a budget is vLLM's) still bounds the sessions."""
    args = [  # one trial a level: no re-trials at the knee (nothing here reads an interval)
        a
        for a in capacity_args(tag, "--kv-arms=auto", "--kv-engine=openai", "--kv-capacity-trials=1")
        if a != "--kv-cache-bytes=3M"
    ]
    args = [a for a in args if not a.startswith("--kv-engine-args")]
    engine = f"--kv-engine-args={tag} --standin-generic --standin-kv-tokens 1536 --standin-prefill-tps 1000 "
    result = pytester.runpytest_subprocess(*args, engine + "--standin-ttft 0.01 --max-model-len 1024")
    assert result.ret == 0, result.stdout.str()
    report = json.loads((latest(pytester) / "report.json").read_text())
    (row,) = report["capacity"]["rows"]
    assert row["kv_tokens"] is None and 1 <= row["capacity"] <= 10 and not row["censored"]
    trials = report["capacity"]["trials"]
    assert all(t["hit_rate_source"] == "usage" and t["preemptions"] is None for t in trials if t["turns"])
    assert not math.isnan(float(row["capacity"]))
