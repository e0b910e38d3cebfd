"""The fidelity probe's arithmetic and its report: prompt-logprob parsing, windows at depths, the per-position
measures (|Δ logprob|, Δ NLL, the top-k KL lower bound), blocks, pairing, the section and the gates."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd
import pytest

from pytest_kvcache import stats
from pytest_kvcache.config.settings import SettingsError
from pytest_kvcache.model import FidelityRecord
from pytest_kvcache.probes import fidelity
from pytest_kvcache.report import fidelity as report_fidelity
from pytest_kvcache.report.gates import evaluate, parse
from tests.factories import make_settings


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
    scored = fidelity.parse_prompt_logprobs(body_for(IDS), IDS, 3)
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
        fidelity.parse_prompt_logprobs(body, IDS, 3)


def test_windows_keep_the_last_positions_before_each_depth_and_name_the_depths_too_deep() -> None:
    scored = fidelity.parse_prompt_logprobs(body_for(IDS), IDS, 3)
    kept, short = fidelity.windows(IDS, scored, [50, 200, 300], window=64)
    assert short == [300]
    first, second = kept
    assert (first.depth, first.start, len(first.logprob)) == (50, 1, 49)  # clamped at position 1
    assert (second.start, len(second.ids)) == (136, 64) and second.ids == tuple(IDS[136:200])
    assert second.logprob[0] == -(1 + IDS[136] % 5)
    assert fidelity.Window.from_dict(second.to_dict()) == second


def _window(shift: float, top: int = 3) -> fidelity.Window:
    scored = fidelity.parse_prompt_logprobs(body_for(IDS, top, shift), IDS, top)
    return fidelity.windows(IDS, scored, [200], window=128)[0][0]


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
    for name in fidelity.TEXTS:
        text = fidelity.load_text(name)
        assert len(text.text) > 400_000 and len(text.sha256) == 64
    with pytest.raises(fidelity.TextError, match="unknown fidelity text 'poetry'"):
        fidelity.load_text("poetry")


# ------------------------------------------------------------------------------------------ the report


def record(arm: str, replicate: int, text: str, shift: float, **extra: Any) -> FidelityRecord:
    scored = fidelity.parse_prompt_logprobs(body_for(IDS, 3, shift), IDS, 3)
    kept, _ = fidelity.windows(IDS, scored, [100, 200], window=64)
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
    assert (deep["texts"], deep["boots"], deep["positions"], deep["ci_method"]) == (2, 2, 256, "blocks")
    assert deep["logprob_drift"] == pytest.approx(np.mean(np.arange(136, 200) / 100))
    lo, hi = deep["logprob_drift_ci"]
    assert lo is not None and hi is not None and lo < deep["logprob_drift"] < hi
    assert rows[("across boots", "a", "200")]["logprob_drift"] == 0.0
    frame = report_fidelity.frame_rows(found)
    assert set(frame["arm"]) == {"b"} and set(frame["probe"]) == {"fidelity"} and frame["valid"].all()


def test_three_boots_give_a_ci_over_boots_and_absolute_gates_use_it() -> None:
    records = [record(arm, rep, "prose", shift * rep) for arm, shift in (("a", 0.0), ("b", 1.0)) for rep in (1, 2, 3)]
    found = report_fidelity.blocks(records, ["a", "b"])
    section = report_fidelity.section(found, records, ["a", "b"], {}, 0)
    deep = next(r for r in section["rows"] if r["kind"] == "between arms" and r["point"] == "200")
    assert deep["ci_method"] == "boots" and deep["boots"] == 3
    frame = report_fidelity.frame_rows(found)
    per_boot = [g["logprob_drift"].astype(float).tolist() for _, g in frame[frame["point"] == "200"].groupby("boot")]
    assert deep["logprob_drift_ci"] == list(stats.mean_ci_boots(per_boot, seed=0)[1:])
    gate = parse("logprob_drift[fidelity@200]: b <= 10", arms=["a", "b"])
    (result,) = evaluate([gate], frame, ["a", "b"], seed=0)
    assert result["outcome"] == "pass" and result["ci_method"] == "boots"
    assert (result["ci_low"], result["ci_high"]) == tuple(deep["logprob_drift_ci"])
    # the boots differ 1:2:3 by design, so 3 boots' t-interval (2 df) cannot rule out a small drift…
    open_ = parse("logprob_drift[fidelity@200]: b <= 0.1", arms=["a", "b"])
    assert evaluate([open_], frame, ["a", "b"], seed=0)[0]["outcome"] == "inconclusive"
    # …nor a large one: 3.35 [-0.81, 7.51] nats
    assert deep["logprob_drift_ci"] == pytest.approx([-0.811, 7.511], abs=1e-3)
    assert (
        evaluate([parse("logprob_drift[fidelity@200]: b >= 8", arms=["a", "b"])], frame, ["a", "b"], seed=0)[0][
            "outcome"
        ]
        == "fail"
    )


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
    scored = fidelity.parse_prompt_logprobs(body_for(IDS, 0), IDS, 0)
    base, arm = (fidelity.windows(IDS, s, [200], window=64)[0][0] for s in (scored, scored))
    assert np.isnan(fidelity.compare_windows(base, arm)["kl_topk"]).all()


def test_fidelity_gates_judge_every_arm_but_the_baseline_and_refuse_ratios_to_it() -> None:
    from pytest_kvcache.probes import registry
    from pytest_kvcache.report.gates import GateError

    specs = {s.name: s for s in registry.specs()}
    records = [record(arm, 1, "prose", shift) for arm, shift in (("a", 0.0), ("b", 1.0), ("c", 0.0))]
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
    # one boot per arm: the fidelity family's band is 0 (scores were identical across boots in every committed
    # run), so the within-boot CI decides
    assert result["outcome"] == "pass" and result["evidence"]["family"] == "fidelity"


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
        ("prose", "code"),
        5,
        256,
    )
    tiny = settings(model="embedded:tiny-qwen3")
    assert (tiny.fidelity_depths, tiny.fidelity_window) == ((1000, 4000), 512)
    gpu = settings(model="org/model", fidelity_depths="1k,32k", fidelity_texts="code", fidelity_topk="0")
    assert (gpu.fidelity_depths, gpu.fidelity_texts, gpu.fidelity_top_k) == ((1000, 32000), ("code",), 0)
    with pytest.raises(SettingsError, match="fidelity texts from prose, code"):
        settings(fidelity_texts="poetry")
    with pytest.raises(SettingsError, match=">= 32"):
        settings(fidelity_window="8")


def test_an_empty_fidelity_log_adds_nothing_to_the_frame() -> None:
    assert report_fidelity.frame_rows(pd.DataFrame()).empty
    assert report_fidelity.section(pd.DataFrame(), [], ["a"], {}, 0)["rows"] == []
