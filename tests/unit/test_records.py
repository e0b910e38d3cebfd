from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest

from pytest_kvcache.probes import registry
from pytest_kvcache.probes.runner import run_repeated
from pytest_kvcache.report.comparison import summary_rows
from pytest_kvcache.report.frame import frame
from pytest_kvcache.report.outputs.terminal import summary_lines
from pytest_kvcache.run.folder import SCHEMA_VERSION, RunFolder, make_record, read_records
from pytest_kvcache.sample import Sample
from pytest_kvcache.stats import describe


def ok_sample(**kw: object) -> Sample:
    base = dict(
        ok=True,
        first_token_s=0.1,
        last_token_s=1.1,
        end_s=1.2,
        prompt_tokens=20,
        completion_tokens=101,
        cached_tokens=4,
        token_clock="usage",
    )
    base.update(kw)
    return Sample(**base)  # type: ignore[arg-type]


def test_measures_follow_the_documented_formulas() -> None:
    metrics, flags, voided = ok_sample().measures()
    assert metrics["ttft_s"] == pytest.approx(0.1)
    assert metrics["wall_tps"] == pytest.approx(101 / 1.2)
    assert metrics["decode_tps"] == pytest.approx(100 / 1.0)  # first token excluded from the window
    assert metrics["prefill_tps"] == pytest.approx((20 - 4) / 0.1)
    assert flags == [] and voided == {}


def test_short_decode_window_voids_decode_tps_only() -> None:
    metrics, flags, voided = ok_sample(first_token_s=5.0, last_token_s=5.1, end_s=5.1).measures()
    assert flags == ["decode_window_short"] and voided == {"decode_tps": "decode_window_short"}
    assert metrics["ttft_s"] == 5.0 and metrics["wall_tps"] is not None


def test_single_token_and_content_clock() -> None:
    _, flags, voided = ok_sample(completion_tokens=1, token_clock="content").measures()
    assert voided == {"decode_tps": "single_token"} and flags == ["content_clock"]


def test_failed_sample_has_no_metrics() -> None:
    sample = Sample().fail("dropped", "connection dropped")
    assert all(v is None for v in sample.measures()[0].values())


def test_record_schema(tmp_path: Path) -> None:
    rec = make_record(
        ok_sample(first_token_s=5.0, last_token_s=5.1, end_s=5.1),
        run_id="r",
        arm="fp8",
        boot="fp8",
        replicate=1,
        probe="short",
        shape="code",
        phase="measured",
        index=2,
        test="t",
    )
    assert rec["schema_version"] == SCHEMA_VERSION
    assert (rec["arm"], rec["probe"], rec["shape"], rec["phase"], rec["index"], rec["test"]) == (
        "fp8",
        "short",
        "code",
        "measured",
        2,
        "t",
    )
    assert rec["depth"] is None and rec["turn"] is None and rec["session"] is None
    assert rec["metrics"]["decode_tps"] is None and rec["excluded_reason"] is None
    failed = make_record(Sample().fail("stall", "no chunk for 5 s"), run_id="r", arm="a", boot="a", replicate=1)
    assert failed["excluded_reason"] == "stall: no chunk for 5 s" and not failed["ok"]


def test_run_folder_appends_durably_and_links_latest(tmp_path: Path) -> None:
    run = RunFolder(tmp_path).create()
    run.append({"a": 1})
    # Visible to another reader at once, before close: the record is on disk.
    assert read_records(run.requests_path) == [{"a": 1}]
    run.append({"a": 2})
    with run.requests_path.open("a") as fh:
        fh.write('{"torn": ')  # a killed writer leaves half a line: it is skipped
    assert [r["a"] for r in read_records(run.requests_path)] == [1, 2]
    assert (tmp_path / "latest").resolve() == run.path.resolve()
    run.write("run.json", {"x": 1})
    assert json.loads((run.path / "run.json").read_text()) == {"x": 1}
    run.close()
    second = RunFolder(tmp_path).create()
    assert (tmp_path / "latest").resolve() == second.path.resolve()
    second.close()


def test_describe() -> None:
    stats = describe([1.0, 2.0, 3.0, None, 4.0])
    assert stats["n"] == 4 and stats["mean"] == 2.5 and stats["median"] == 2.5
    assert stats["std"] == pytest.approx(1.2909944)
    assert stats["cv_pct"] == pytest.approx(51.639778)
    assert (stats["min"], stats["max"]) == (1.0, 4.0)
    assert describe([])["n"] == 0 and describe([5.0])["std"] is None


def test_run_repeated_and_outcome() -> None:
    samples = iter([ok_sample(), ok_sample(), Sample().fail("http_error", "HTTP 500: boom"), ok_sample()])
    recorded: list[dict] = []

    def record(sample: Sample, **ctx: object) -> dict:
        rec = make_record(sample, run_id="r", arm="a", boot="a", replicate=1, **ctx)
        recorded.append(rec)
        return rec

    outcome = run_repeated(
        lambda phase, index: (next(samples), {"depth": 7}), record, label="short x", warmups=1, runs=3
    )
    assert {r["depth"] for r in recorded} == {7}
    assert [r["phase"] for r in recorded] == ["warmup", "measured", "measured", "measured"]
    assert len(outcome.valid) == 2
    assert outcome.problems() == [
        "measured request 1 failed: http_error: HTTP 500: boom",
        "2 of 3 measured samples are valid",
    ]


def test_run_repeated_stops_when_told() -> None:
    calls = []

    def send(phase: str, index: int) -> tuple[Sample, dict]:
        calls.append(1)
        return Sample().fail("engine_died", "gone"), {}

    outcome = run_repeated(
        send,
        lambda s, **c: make_record(s, run_id="r", arm="a", boot="a", replicate=1, **c),
        label="x",
        warmups=2,
        runs=5,
        stop_on_failure=lambda s: s.error_kind == "engine_died",
    )
    assert len(calls) == 1 and outcome.problems()[-1] == "0 of 5 measured samples are valid"


def test_summary_table_orders_arms_and_counts_exclusions() -> None:
    recs = []
    for arm, tps in (("fp8", [10.0, 12.0]), ("auto", [20.0, 22.0])):
        for i, v in enumerate(tps):
            s = ok_sample(last_token_s=0.1 + 100 / v)
            recs.append(
                make_record(
                    s,
                    run_id="r",
                    arm=arm,
                    boot=arm,
                    replicate=1,
                    probe="short",
                    shape="code",
                    phase="measured",
                    index=i,
                )
            )
    recs.append(
        make_record(
            Sample().fail("stall", "x"),
            run_id="r",
            arm="fp8",
            boot="fp8",
            replicate=1,
            probe="short",
            shape="code",
            phase="measured",
            index=2,
        )
    )
    specs = registry.resolve()
    rows = summary_rows(frame(recs, specs), ["auto", "fp8"], specs)
    decode = [r for r in rows if r["metric"] == "decode_tps"]
    assert [r["arm"] for r in decode] == ["auto", "fp8"]
    assert [r["mean"] for r in decode] == pytest.approx([21.0, 11.0])
    assert [r["excluded"] for r in decode] == [0, 1]
    lines = summary_lines({"summary": rows, "probes": [s.to_dict() for s in registry.specs()]})
    assert lines[1].startswith("Short-context probes") and "21.00" in "\n".join(lines)
    assert any("decode_tps" in line and "auto" in line for line in lines)


def test_an_interrupt_lost_in_a_finalizer_still_stops_the_loop_before_the_next_request() -> None:
    """Python drops a KeyboardInterrupt raised inside a finalizer ("Exception ignored in …"); the plugin's
    SIGINT handler also sets ``interrupt.INTERRUPTED``, and the loop stops on it before one more request."""
    from pytest_kvcache import interrupt

    sent: list[int] = []

    def send(phase: str, index: int) -> tuple[Sample, dict]:
        sent.append(index)
        if index == 1:
            with contextlib.suppress(KeyboardInterrupt):  # raised inside a finalizer: the flag stays, it goes
                interrupt.on_sigint(2, None)
        return ok_sample(), {}

    try:
        with pytest.raises(KeyboardInterrupt):
            run_repeated(send, lambda sample, **ctx: {"ok": sample.ok}, label="short x", warmups=0, runs=5)
    finally:
        interrupt.clear()
    assert sent == [0, 1]
