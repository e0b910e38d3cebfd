"""The fidelity probe's arithmetic and its report: prompt-logprob parsing, windows at depths, the per-position
measures (|Δ logprob|, Δ NLL, the top-k KL lower bound), blocks, pairing, the section and the gates."""

from __future__ import annotations

import hashlib
import json
import math
import re
from importlib import resources
from typing import Any

import numpy as np
import pandas as pd
import pytest

from pytest_kvcache.config.constants import FIDELITY_TEXTS, SettingsError
from pytest_kvcache.engines.kinds.vllm import parse_prompt_logprobs
from pytest_kvcache.engines.scoring import Scored, Window, windows
from pytest_kvcache.model.records import FidelityRecord
from pytest_kvcache.probes import fidelity
from pytest_kvcache.report import fidelity as report_fidelity
from pytest_kvcache.report.gates import evaluate, parse
from tests.factories import make_settings


def _windows(ids: Any, scored: list[Scored], depths: list[int], window: int) -> tuple[list[Window], list[int]]:
    """The windows of a prompt scored in one request (vLLM's prompt logprobs: position p is ``scored[p - 1]``)."""
    return windows(ids, depths, window, 3, lambda position: scored[position - 1])


def body_for(ids: list[int], top: int = 3, shift: float = 0.0) -> dict[str, Any]:
    """A vLLM-shaped completion body with prompt_logprobs: token t at position p has logprob −(1 + t % 5)
    − shift·p/100, alternatives 1000+j ranked 1..top."""
    entries: list[dict[str, Any] | None] = [None]
    for p in range(1, len(ids)):
        entry = {str(1000 + j): {"logprob": -0.5 - j, "rank": j + 1, "decoded_token": "x"} for j in range(top)}
        entry[str(ids[p])] = {"logprob": -(1 + ids[p] % 5) - shift * p / 100, "rank": 50, "decoded_token": "y"}
        entries.append(entry)
    return {"choices": [{"index": 0, "text": "", "prompt_logprobs": entries}]}


IDS = list(range(1, 201))


def test_prompt_logprobs_parse_into_the_actual_tokens_logprob_and_the_ranked_top_k() -> None:
    scored = parse_prompt_logprobs(body_for(IDS), IDS, 3)
    assert len(scored) == len(IDS) - 1
    actual, top = scored[0]  # position 1: token 2
    assert actual == -3.0 and top == [(1000, -0.5), (1001, -1.5), (1002, -2.5)]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"choices": [{"text": ""}]}, "no choices[0].prompt_logprobs"),
        ({"choices": [{"prompt_logprobs": [None, {}]}]}, "2 prompt_logprobs entries for a prompt of 200 tokens"),
        ({"choices": [{"prompt_logprobs": [None] + [{"7": {"logprob": -1}}] * 199}]}, "lacks the prompt's own token 2"),
        ({"choices": [{"prompt_logprobs": [None] + [{"x": {"logprob": -1}}] * 199}]}, "is not '<token id>: logprob'"),
    ],
)
def test_a_response_without_usable_prompt_logprobs_says_what_is_missing(body: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        parse_prompt_logprobs(body, IDS, 3)


def test_windows_keep_the_last_positions_before_each_depth_and_name_the_depths_too_deep() -> None:
    scored = parse_prompt_logprobs(body_for(IDS), IDS, 3)
    kept, short = _windows(IDS, scored, [50, 200, 300], 64)
    assert short == [300]
    first, second = kept
    assert (first.depth, first.start, len(first.logprob)) == (50, 1, 49)  # clamped at position 1
    assert (second.start, len(second.ids)) == (136, 64) and second.ids == tuple(IDS[136:200])
    assert second.logprob[0] == -(1 + IDS[136] % 5)
    assert Window.from_dict(second.to_dict()) == second


def _window(shift: float, top: int = 3) -> Window:
    scored = parse_prompt_logprobs(body_for(IDS, top, shift), IDS, top)
    return _windows(IDS, scored, [200], 128)[0][0]


def test_identical_windows_give_zero_drift_and_zero_kl() -> None:
    per = fidelity.compare_windows(_window(0.0), _window(0.0))
    for name in ("logprob_drift", "nll_delta", "kl_topk"):
        assert np.all(per[name] == 0.0), name


def test_drift_and_nll_delta_follow_the_shift_of_the_actual_tokens_logprob() -> None:
    per = fidelity.compare_windows(_window(0.0), _window(1.0))
    positions = np.arange(72, 200)
    assert per["logprob_drift"] == pytest.approx(positions / 100)
    assert per["nll_delta"] == pytest.approx(positions / 100)  # less likely in the arm: NLL up
    assert np.all(per["kl_topk"] > 0)


def test_the_top_k_kl_is_a_lower_bound_of_the_full_kl() -> None:
    rng = np.random.default_rng(7)
    for _ in range(50):
        logits = rng.normal(size=64) * 3
        p = np.exp(logits) / np.exp(logits).sum()
        q_logits = logits + rng.normal(size=64) * 0.3
        q = np.exp(q_logits) / np.exp(q_logits).sum()
        full = float(np.sum(p * np.log(p / q)))
        top_p = {int(i): math.log(p[i]) for i in np.argsort(-p)[:5]}
        top_q = {int(i): math.log(q[i]) for i in np.argsort(-q)[:5]}
        coarse = fidelity._kl_coarse(top_p, top_q)
        assert coarse is None or 0.0 <= coarse <= full + 1e-12


def test_blocks_average_positions_and_drop_a_short_tail() -> None:
    values = {"x": np.arange(76, dtype=float)}
    blocks = fidelity.block_metrics(values, block=32)
    assert [b["x"] for b in blocks] == [15.5, 47.5]  # 12 trailing positions < half a block: dropped
    assert [b["x"] for b in fidelity.block_metrics({"x": np.arange(48, dtype=float)}, block=32)] == [15.5, 39.5]


def test_the_committed_texts_load_with_their_sha256_and_an_unknown_one_is_refused() -> None:
    assert fidelity.TEXTS == ("prose", "code", "data", "markup") == FIDELITY_TEXTS
    folder = resources.files("pytest_kvcache") / "data" / "fidelity"
    for name in fidelity.TEXTS:
        text = fidelity.load_text(name)
        data = (folder / f"{name}-v1.txt").read_bytes()
        recorded = (folder / f"{name}-v1.txt.sha256").read_text()
        assert recorded == f"{hashlib.sha256(data).hexdigest()}  {name}-v1.txt\n" and text.sha256 == recorded[:64]
        # ~450,000 characters, cut at a line end (fixtures/make_fidelity_texts.py)
        assert 440_000 < len(text.text) <= 450_000 and text.text.endswith("\n"), name
    with pytest.raises(fidelity.TextError, match="unknown fidelity text 'poetry'"):
        fidelity.load_text("poetry")


def test_the_data_text_is_json_lines_and_the_markup_shows_nothing_of_the_machine() -> None:
    text = fidelity.load_text("data").text
    # JSON Lines: every line break ends a record (invisible characters are \\uXXXX escapes: no U+0085, U+2028)
    assert text.splitlines() == text.split("\n")[:-1]
    records = [json.loads(line) for line in text.splitlines()]
    assert records[0] == {"unicode_version": "14.0.0", "source": "Unicode Character Database"}
    assert records[1]["code_point"] == "U+0020"  # controls left out: every record has a name
    assert records[34] == {
        "code_point": "U+0041",
        "char": "A",
        "name": "LATIN CAPITAL LETTER A",
        "category": "Lu",
        "bidi_class": "L",
        "combining_class": 0,
        "mirrored": False,
        "east_asian_width": "Na",
        "lower": "a",
    }
    markup = fidelity.load_text("markup").text
    assert markup.startswith("<!DOCTYPE html>") and markup.count("<title>Python: ") >= 10
    assert "Lib/json/__init__.py" in markup and "file:" not in markup and "/root/" not in markup
    assert re.search(r"0x[0-9a-f]{5,}", markup) is None  # object addresses read "at 0x0"


# ------------------------------------------------------------------------------------------ the report


def record(arm: str, replicate: int, text: str, shift: float, **extra: Any) -> FidelityRecord:
    scored = parse_prompt_logprobs(body_for(IDS, 3, shift), IDS, 3)
    kept, _ = _windows(IDS, scored, [100, 200], 64)
    entry: FidelityRecord = {
        "arm": arm,
        "boot": f"{arm}.r{replicate}",
        "replicate": replicate,
        "text": text,
        "text_sha256": "s" * 64,
        "ids_sha256": fidelity.ids_sha256(IDS),
        "prompt_tokens": len(IDS),
        "ok": True,
        "windows": [w.to_dict() for w in kept],
        "short_depths": [],
    }
    entry.update(extra)  # type: ignore[typeddict-item]
    return entry


def test_arms_pair_with_the_baseline_per_replicate_and_boots_with_their_first() -> None:
    arms = (("a", 0.0), ("b", 1.0))
    records = [record(arm, rep, text, shift) for arm, shift in arms for rep in (1, 2) for text in ("prose", "code")]
    found = report_fidelity.blocks(records, ["a", "b"])
    between = found[found["kind"] == "between arms"]
    assert set(between["arm"]) == {"b"} and set(zip(between["boot"], between["baseline_boot"], strict=True)) == {
        ("b.r1", "a.r1"),
        ("b.r2", "a.r2"),
    }
    across = found[found["kind"] == "across boots"]
    assert set(across["arm"]) == {"a", "b"} and float(across["logprob_drift"].abs().max()) == 0.0
    section = report_fidelity.section(found, records, ["a", "b"], {"fidelity_top_k": 3, "fidelity_window": 64}, 0)
    rows = {(r["kind"], r["arm"], r["point"]): r for r in section["rows"]}
    deep = rows[("between arms", "b", "200")]
    assert (deep["texts"], deep["boots"], deep["positions"], deep["ci_method"]) == (2, 2, 256, "texts")
    assert deep["logprob_drift"] == pytest.approx(np.mean(np.arange(136, 200) / 100))
    # two texts: no CI, however many blocks and boots
    assert deep["logprob_drift_ci"] == [None, None] and deep["ci_basis"] == "over texts" and "ci_df" not in deep
    assert deep["no_ci"].startswith("fewer than 3 texts (2: code, prose)")
    assert rows[("across boots", "a", "200")]["logprob_drift"] == 0.0
    frame = report_fidelity.frame_rows(found)
    assert set(frame["arm"]) == {"b"} and set(frame["probe"]) == {"fidelity"} and frame["valid"].all()


#: Four texts of the between-arms lossy arm "b", each with its own shift (drift at depth 200: 1.675 × shift).
SHIFTS = {"prose": 1.0, "code": 2.0, "data": 0.5, "markup": 1.5}


def _texts_run(shifts: dict[str, float], replicates: tuple[int, ...] = (1,)) -> tuple[pd.DataFrame, list[Any]]:
    records = [record("a", rep, text, 0.0) for rep in replicates for text in shifts]
    records += [record("b", rep, text, shift) for rep in replicates for text, shift in shifts.items()]
    return report_fidelity.blocks(records, ["a", "b"]), records


def test_four_texts_give_a_t_interval_over_the_per_text_means_and_gates_use_it() -> None:
    from scipy import stats as scipy_stats

    found, records = _texts_run(SHIFTS, replicates=(1, 2, 3))
    section = report_fidelity.section(found, records, ["a", "b"], {}, 0)
    deep = next(r for r in section["rows"] if r["kind"] == "between arms" and r["point"] == "200")
    per_text = [1.675 * shift for shift in SHIFTS.values()]
    assert deep["per_text"] == pytest.approx(dict(zip(SHIFTS, per_text, strict=True)))
    assert (deep["texts"], deep["boots"], deep["ci_df"], deep["ci_method"]) == (4, 3, 3, "texts")
    # Student's t over the 4 per-text means, 3 df: 3 boots of each text add nothing (they are identical)
    want = scipy_stats.t.interval(0.95, 3, loc=np.mean(per_text), scale=scipy_stats.sem(per_text))
    assert deep["logprob_drift"] == pytest.approx(np.mean(per_text))
    assert deep["logprob_drift_ci"] == pytest.approx(list(want), rel=1e-12)
    assert deep["logprob_drift_ci"] == pytest.approx([0.373, 3.814], abs=1e-3)
    floor = next(r for r in section["rows"] if r["kind"] == "across boots" and r["arm"] == "b" and r["point"] == "200")
    assert floor["logprob_drift_ci"] == [0.0, 0.0] and floor["texts"] == 4  # the A/A: exactly 0 on 4 texts, real
    frame = report_fidelity.frame_rows(found)
    (result,) = evaluate([parse("logprob_drift[fidelity@200]: b <= 10", arms=["a", "b"])], frame, ["a", "b"], seed=0)
    assert result["outcome"] == "pass" and result["ci_method"] == "texts" and "boots_to_decide" not in result
    assert (result["ci_low"], result["ci_high"]) == tuple(deep["logprob_drift_ci"])
    assert result["evidence"] == {
        "kind": "texts",
        "texts": 4,
        "df": 3,
        "text": "CI over texts (4: code, data, markup, prose: t-interval, 3 df)",
    }
    # the texts differ 1:2:0.5:1.5 by design: 4 texts cannot rule out a drift of 0.5, and show it is above 0.3
    outcomes = [
        evaluate([parse(f"logprob_drift[fidelity@200]: b {cond}", arms=["a", "b"])], frame, ["a", "b"], seed=0)[0]
        for cond in ("<= 0.5", "<= 0.3", ">= 0.3")
    ]
    assert [r["outcome"] for r in outcomes] == ["inconclusive", "fail", "pass"]
    from pytest_kvcache.report.rounds import _open

    assert not _open(outcomes[0])  # another boot cannot decide a gate over texts: no adaptive round for it


def test_fewer_than_three_texts_give_no_ci_and_every_gate_on_them_is_undecided_with_the_reason() -> None:
    found, records = _texts_run({"prose": 1.0, "code": 2.0}, replicates=(1, 2, 3))
    rows = report_fidelity.section(found, records, ["a", "b"], {}, 0)["rows"]
    deep = next(r for r in rows if r["kind"] == "between arms" and r["point"] == "200")
    assert deep["logprob_drift"] == pytest.approx(1.675 * 1.5)
    assert all(deep[f"{m}_ci"] == [None, None] for m in ("logprob_drift", "nll_delta", "kl_topk"))
    records += [record("c", rep, text, 3.0) for rep in (1, 2, 3) for text in ("prose", "code")]
    arms = ["a", "b", "c"]
    frame = report_fidelity.frame_rows(report_fidelity.blocks(records, arms))
    for cond in ("b <= 100", "b <= 0.001", "<= 100", "b <= c * 2"):
        for result in evaluate([parse(f"logprob_drift[fidelity@200]: {cond}", arms=arms)], frame, arms, seed=0):
            assert result["outcome"] == "inconclusive", (cond, result)
            assert result["evidence"]["kind"] == "texts" and result["evidence"]["texts"] == 2
            assert "boots_to_decide" not in result and result["ci_low"] is None
    (result,) = evaluate([parse("logprob_drift[fidelity@200]: b <= 100", arms=arms)], frame, arms, seed=0)
    assert result["reason"].startswith("fewer than 3 texts (2: code, prose): fidelity is deterministic across boots")
    from pytest_kvcache.report.outputs.md_verdict import gate_evidence

    assert gate_evidence(result) == result["reason"]  # what the terminal and report.md print after the gate
    (sentence,) = report_fidelity.sentences(rows, [], ["a", "b"])
    assert "at 200 (no CI: fewer than 3 texts, undecided)" in sentence


def test_identical_per_text_values_give_a_zero_width_interval() -> None:
    found, records = _texts_run({"prose": 0.1, "code": 0.1, "data": 0.1})
    rows = report_fidelity.section(found, records, ["a", "b"], {}, 0)["rows"]
    deep = next(r for r in rows if r["kind"] == "between arms" and r["point"] == "200")
    lo, hi = deep["logprob_drift_ci"]
    assert lo == hi == deep["logprob_drift"] and deep["ci_df"] == 2
    assert report_fidelity.over_texts({"x": 0.1, "y": 0.1, "z": 0.1}) == (0.1, 0.1, 0.1)
    assert report_fidelity.over_texts({"x": 0.1, "y": 0.1}) == (0.1, None, None)
    assert report_fidelity.over_texts({}) == (None, None, None)


def test_a_ratio_between_two_arms_is_judged_on_fiellers_interval_over_texts() -> None:
    from scipy import stats as scipy_stats

    arm = {"prose": 0.30, "code": 0.52, "data": 0.21, "markup": 0.44}
    other = {"prose": 0.50, "code": 0.81, "data": 0.40, "markup": 0.70, "extra": 9.0}  # "extra": not paired
    ratio, lo, hi, n = report_fidelity.ratio_over_texts(arm, other)
    x, y = np.array(list(arm.values())), np.array([other[t] for t in arm])
    assert n == 4 and ratio == pytest.approx(x.mean() / y.mean())
    assert lo is not None and hi is not None and lo < ratio < hi
    # the bounds are the ratios r at which a paired t-test of arm − r·other over the texts has p = 0.05
    for r in (lo, hi):
        assert scipy_stats.ttest_1samp(x - r * y, 0.0).pvalue == pytest.approx(0.05, rel=1e-9)
    # proportional per-text values: a zero-width interval at the ratio; fewer than 3 texts: none
    half = {t: 0.5 * other[t] for t in arm}
    assert report_fidelity.ratio_over_texts(half, other)[1:3] == pytest.approx((0.5, 0.5), abs=1e-12)
    assert report_fidelity.ratio_over_texts({"prose": 1.0, "code": 2.0}, other)[1:] == (None, None, 2)
    # a denominator not distinguishable from 0 over the texts: Fieller's set is unbounded, no interval
    assert report_fidelity.ratio_over_texts(arm, {"prose": 1.0, "code": -1.0, "data": 0.5})[1:3] == (None, None)


def _other_ids(entry: FidelityRecord) -> FidelityRecord:
    for w in entry["windows"]:
        w["ids"] = [i + 1 for i in w["ids"]]  # another tokenizer's ids
    entry["ids_sha256"] = "other"
    return entry


def test_records_not_compared_are_named_in_the_notes() -> None:
    broken = record("a", 2, "prose", 0.0)
    broken["windows"][0]["top_ids"] = broken["windows"][0]["top_ids"][:3]
    records = [
        record("a", 1, "prose", 0.0),
        _other_ids(record("b", 1, "prose", 1.0)),
        record("a", 1, "code", 0.0, excluded_reason="not cold: 64 prefix-cache hit tokens > one block (16)"),
        record("b", 1, "code", 1.0, short_depths=[90_000]),
        {"arm": "b", "boot": "b.r1", "replicate": 1, "text": "code", "ok": False, "error": "HTTP 400: bad"},
        broken,
    ]
    found = report_fidelity.blocks(records, ["a", "b"])
    # only a.r2 prose against a.r1 prose, at the depth whose window is whole
    assert set(zip(found["kind"], found["point"], strict=True)) == {("across boots", "200")}
    notes = report_fidelity.section(found, records, ["a", "b"], {}, 0)["notes"]
    assert any("a.r2 prose: a window left out: malformed fidelity window at depth 100" in n for n in notes)
    assert any("b.r1 prose: other token ids than a's" in n for n in notes)
    assert any(n.startswith("a.r1 code: excluded: not cold") for n in notes)
    assert any("b.r1 code: depth(s) 90k beyond the 200 tokens" in n for n in notes)
    assert "b.r1 code: not scored: HTTP 400: bad" in notes


def test_across_boots_starts_from_each_texts_first_usable_boot() -> None:
    records = [
        record("a", 1, "prose", 0.0, ok=False, error="HTTP 500"),
        record("a", 2, "prose", 0.0),
        record("a", 3, "prose", 0.0),
        record("a", 1, "code", 0.0),
        record("a", 2, "code", 0.0),
    ]
    found = report_fidelity.blocks(records, ["a"])
    pairs = set(zip(found["text"], found["baseline_boot"], found["boot"], strict=True))
    assert pairs == {("prose", "a.r2", "a.r3"), ("code", "a.r1", "a.r2")}


def test_without_top_k_there_is_no_kl() -> None:
    scored = parse_prompt_logprobs(body_for(IDS, 0), IDS, 0)
    base, arm = (_windows(IDS, s, [200], 64)[0][0] for s in (scored, scored))
    assert np.isnan(fidelity.compare_windows(base, arm)["kl_topk"]).all()


def test_fidelity_gates_judge_every_arm_but_the_baseline_and_refuse_ratios_to_it() -> None:
    from pytest_kvcache.probes import registry
    from pytest_kvcache.report.gates import GateError

    specs = {s.name: s for s in registry.specs()}
    records = [
        record(arm, 1, text, shift)
        for arm, shift in (("a", 0.0), ("b", 1.0), ("c", 0.0))
        for text in ("prose", "code", "data")
    ]
    frame = report_fidelity.frame_rows(report_fidelity.blocks(records, ["a", "b", "c"]))
    gate = parse("logprob_drift[fidelity@100]: <= 0.5", arms=["a", "b", "c"], specs=specs)
    results = evaluate([gate], frame, ["a", "b", "c"], seed=0, specs=specs)
    assert [(r["name"].rsplit(" ", 1)[1], r["outcome"]) for r in results] == [("(b)", "fail"), ("(c)", "pass")]
    for text in ("logprob_drift[fidelity]: <= +10%", "logprob_drift[fidelity]: <= saved"):
        with pytest.raises(GateError, match="differences from the baseline arm already"):
            parse(text, arms=["a", "b"], specs=specs)
    with pytest.raises(GateError, match="unknown metric 'decode_tps' for probe fidelity"):
        parse("decode_tps[fidelity]: >= 1", arms=["a", "b"], specs=specs)
    between = parse("logprob_drift[fidelity@200]: c <= b * 0.5", arms=["a", "b", "c"], specs=specs)
    (result,) = evaluate([between], frame, ["a", "b", "c"], seed=0, specs=specs)
    # over the 3 texts: c's drift is 0 on each, b's the same on each — the ratio is 0, its interval [0, 0]
    assert result["outcome"] == "pass" and result["evidence"]["kind"] == "texts" and result["value"] == 0.0
    assert (result["ci_low"], result["ci_high"]) == (0.0, 0.0) and result["name"].endswith("(c/b)")


def test_the_verdict_sentence_puts_speed_and_fidelity_together() -> None:
    records = [record(arm, 1, "prose", shift) for arm, shift in (("a", 0.0), ("b", 1.0))]
    found = report_fidelity.blocks(records, ["a", "b"])
    rows = report_fidelity.section(found, records, ["a", "b"], {}, 0)["rows"]
    deltas: list[Any] = [
        {"arm": "b", "probe": "short", "metric": "decode_tps", "point": "narrative", "delta_pct": 2.9},
        {"arm": "b", "probe": "prefill", "metric": "prefill_tps", "point": "1k", "delta_pct": -12.0},
        {"arm": "b", "probe": "prefill", "metric": "prefill_tps", "point": "32k", "delta_pct": -89.0},
    ]
    (sentence,) = report_fidelity.sentences(rows, deltas, ["a", "b"])
    assert sentence.startswith("b vs a: +2.9% short decode, -12.0% prefill at 1k; |Δ logprob| 1.675 nats/token at 200")
    assert "KL ≥ " in sentence


def test_fidelity_settings_resolve_with_cpu_defaults_and_refuse_unknown_texts(tmp_path: Any) -> None:
    def settings(**cli: Any) -> Any:
        return make_settings(tmp_path, arms="auto,fp8", **cli)

    cpu = settings()  # the embedded trained model: a narrower window (256 positions) keeps it quick on 2 cores
    assert (cpu.fidelity_depths, cpu.fidelity_texts, cpu.fidelity_top_k, cpu.fidelity_window) == (
        (1000, 4000),
        ("prose", "code", "data", "markup"),
        5,
        256,
    )
    tiny = settings(model="embedded:tiny-qwen3")
    assert (tiny.fidelity_depths, tiny.fidelity_window) == ((1000, 4000), 512)
    gpu = settings(model="org/model", fidelity_depths="1k,32k", fidelity_texts="code", fidelity_topk="0")
    assert (gpu.fidelity_depths, gpu.fidelity_texts, gpu.fidelity_top_k) == ((1000, 32000), ("code",), 0)
    with pytest.raises(SettingsError, match="fidelity texts from prose, code, data, markup"):
        settings(fidelity_texts="poetry")
    with pytest.raises(SettingsError, match=">= 32"):
        settings(fidelity_window="8")


def test_an_empty_fidelity_log_adds_nothing_to_the_frame() -> None:
    assert report_fidelity.frame_rows(pd.DataFrame()).empty
    assert report_fidelity.section(pd.DataFrame(), [], ["a"], {}, 0)["rows"] == []
