"""The KV-residency knee: the sessions whose prefixes the prefix cache holds (hit rate at least half), searched
beside the SLO's knee from the same trials, read back from the records with a CI over tried levels, compared
between arms as ``kv_residency``, and what it says bound the SLO's knee."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd
import pytest

from pytest_kvcache.metrics import catalogue
from pytest_kvcache.probes import capacity, registry
from pytest_kvcache.probes.capacity import HitCounts, Search, hit_rate, holds
from pytest_kvcache.report.capacity import render as capacity_render
from pytest_kvcache.report.capacity import search as capacity_search
from pytest_kvcache.report.capacity import section as capacity_section
from pytest_kvcache.report.capacity import statistics as capacity_statistics

# ------------------------------------------------------------------------------------------ the search


def run_search(
    slo: int, resident: int | None, start: int = 1, limit: int = 64, trials: int = 2
) -> tuple[Search, list[int]]:
    """A search whose levels meet the SLO up to ``slo`` sessions and hold their KV up to ``resident`` (None: no
    hit rate)."""
    search = Search(start=start, limit=limit, trials=trials)
    tried: list[int] = []
    while (n := search.next()) is not None:
        tried.append(n)
        search.record(n, n <= slo, None if resident is None else n <= resident)
        assert len(tried) < 200
    return search, tried


def test_without_a_hit_rate_the_search_is_the_slos_alone() -> None:
    alone, tried = run_search(6, None, start=4, limit=16)
    assert tried == [4, 8, 6, 7, 6, 7, 5, 5] and alone.capacity == 6 and alone.residency is None
    assert alone.holds == {}


def test_where_the_cache_sets_the_knee_both_knees_share_their_trials() -> None:
    """KV-bound: the cache stops holding the sessions where the SLO breaks: the residency adds no trial."""
    both, tried = run_search(6, 6, start=4, limit=16)
    assert tried == run_search(6, None, start=4, limit=16)[1]
    assert (both.capacity, both.residency) == (6, 6)


def test_a_compute_bound_knee_steps_on_until_the_cache_stops_holding() -> None:
    """The SLO breaks at 10 while the cache holds 12: the search goes on past the SLO's knee (doubling, then
    bisecting, then confirming the residency knee and its neighbours), the SLO's knee unchanged."""
    search, tried = run_search(9, 12, start=5, limit=16)
    assert search.capacity == 9 and search.residency == 12 and not search.censored
    assert tried[:5] == [5, 10, 7, 8, 9]  # the SLO's search first, as alone
    assert 16 in tried and max(tried) == 16  # then up past it, never over the limit
    for knee in (9, 12):
        assert all(search.counts[n] >= 2 for n in (knee - 1, knee, knee + 1)), (knee, tried)
    assert len(tried) == 15


def test_the_issues_compute_bound_knee_far_above_the_cache() -> None:
    """The issue's shape: the hit rate collapses at 8 sessions, the SLO holds to 52 (re-prefill kept up)."""
    search, tried = run_search(52, 8, start=1, limit=256)
    assert (search.capacity, search.residency) == (52, 8)
    assert all(search.counts[n] >= 2 for n in (7, 8, 9, 51, 52, 53))
    assert tried.index(9) < tried.index(64)  # the lower level first: the cheaper trial
    bound = 2 * (2 * math.log2(256) + (1 + capacity.RECENTRES) * (3 * 2 + math.log2(256)))
    assert len(tried) <= bound


def test_the_residency_knee_at_the_limit_is_censored() -> None:
    search, tried = run_search(6, 40, start=5, limit=16)
    assert search.residency == 16 and search.kv is not None and search.kv.censored and search.capacity == 6
    assert tried.count(16) == 2 and tried.count(15) == 2


def test_a_flipping_hit_rate_cannot_make_the_search_run_away() -> None:
    search = Search(start=1, limit=64)
    seen: dict[int, int] = {}
    steps = 0
    while (n := search.next()) is not None:
        seen[n] = seen.get(n, 0) + 1
        search.record(n, n <= 5, n <= (20 if seen[n] % 2 else 14))
        steps += 1
        assert steps < 200
    assert search.capacity == 5 and search.residency is not None and search.kv is not None
    assert search.kv.recentred <= capacity.RECENTRES


def test_one_trial_without_a_hit_rate_ends_the_residency_search() -> None:
    search = Search(start=4, limit=16)
    search.record(4, True, True)
    search.record(8, False, None)
    assert search.residency is None and search.holds == {}
    assert search.next() == 6  # the SLO's bisection goes on alone


def test_the_step_names_the_search_that_asked() -> None:
    search = Search(start=5, limit=16)
    for n, meets in ((5, True), (10, False), (7, True), (8, True), (9, True)):
        search.record(n, meets, True)
    assert search.next() == 9 and search.step == "confirm"  # the SLO's knee 9: confirming
    for n in (9, 10, 8):
        search.record(n, n <= 9, True)
    assert search.next() == 16 and search.step == "up"  # the cache held all: stepping up past the SLO's knee


def test_a_levels_hit_rate_pools_its_trials() -> None:
    engine = [HitCounts(90, 100, 0, 0), HitCounts(10, 100, 0, 0)]
    assert hit_rate(engine) == (0.5, "/metrics") and holds(0.5) is True and holds(0.49) is False
    usage = [HitCounts(None, None, 30, 100), HitCounts(90, 100, 10, 100)]  # one trial without counters: usage
    assert hit_rate(usage) == (0.2, "usage") and holds(None) is None
    assert hit_rate([HitCounts(None, None, 0, 0)]) == (None, None)


# ------------------------------------------------------------------------------------------ the report

Level = tuple[int, float, float]  # sessions, TTFT of every turn, hit rate of every turn


def records(
    arm: str, levels: list[Level], *, usage: bool = True, engine: bool = True, limit: int = 16, turns: int = 20
) -> list[dict[str, Any]]:
    """Measured turns of a search: a trial per (sessions, ttft, hit rate) in order, ``turns`` turns a trial of 1,000
    prompt tokens each, the hit rate in every turn's cached tokens (``usage``) and the trial's engine counters
    (``engine``)."""
    out = []
    for index, (n, ttft, rate) in enumerate(levels):
        info: dict[str, Any] = {
            "sessions": n, "slo": "ttft_p95<=100ms", "window_s": 2.0, "step": "up", "verdict": "meets",
            "max_sessions": limit,
        }  # fmt: skip
        if engine:
            info["engine"] = {"prefix_cache_queries": 1000 * turns, "prefix_cache_hits": round(1000 * turns * rate)}
        for _ in range(turns):
            sample: dict[str, Any] = {
                "ok": True, "first_token_s": ttft, "last_token_s": ttft + 0.15, "completion_tokens": 16,
                "prompt_tokens": 1000,
            }  # fmt: skip
            if usage:
                sample["cached_tokens"] = round(1000 * rate)
            out.append(
                {"arm": arm, "boot": arm, "probe": "capacity", "phase": "measured", "depth": 2000, "index": index,
                 "ok": True, "excluded_reason": None, "sample": sample, "capacity": info}
            )  # fmt: skip
    return out


def twice(levels: list[Level], again: list[Level]) -> list[Level]:
    """A search's trials, then one more at each level of ``again`` (a level absent from the search: two)."""
    tried = {n for n, _, _ in levels}
    return [*levels, *[x for x in again for _ in range(1 if x[0] in tried else 2)]]


#: KV-bound: the SLO breaks at 7 where the hit rate falls from 95% to 40%; residency 6 too
AUTO = twice(
    [(4, 0.03, 0.95), (8, 0.5, 0.3), (6, 0.04, 0.95), (7, 0.4, 0.4)],
    [(6, 0.04, 0.95), (7, 0.4, 0.4), (5, 0.03, 0.95)],
)
#: compute-bound: the SLO breaks at 10 with 95% hits; the cache holds 12, below half at 13
BIG = twice(
    [(4, 0.03, 0.95), (8, 0.03, 0.95), (6, 0.03, 0.95), (7, 0.03, 0.95), (16, 0.5, 0.2), (12, 0.5, 0.9)],
    [(9, 0.04, 0.95), (10, 0.4, 0.95), (14, 0.5, 0.3), (13, 0.5, 0.45), (11, 0.5, 0.93), (12, 0.5, 0.9)],
)


def frame_of(recs: list[dict[str, Any]]) -> pd.DataFrame:
    return pd.DataFrame(capacity_search.frame_rows(recs))  # type: ignore[arg-type]


def test_the_residency_knee_and_its_interval_are_tried_levels() -> None:
    data = frame_of(records("auto", AUTO) + records("big", BIG))
    by = dict(zip(data["arm"], data["search"], strict=True))
    assert dict(zip(data["arm"], data["kv_residency"], strict=True)) == {"auto": 6.0, "big": 12.0}
    auto, big = by["auto"], by["big"]
    assert (auto.capacity, auto.residency, auto.residency_broken) == (6, 6, 7)
    assert (big.capacity, big.first_broken, big.residency, big.residency_broken) == (9, 10, 12, 13)
    assert big.unmeasured(capacity_search.RESIDENCY_METRIC) is None  # 11, 12 and 13 tried twice each
    value, lo, hi, method = capacity_statistics.capacity_ci(
        data[data["arm"] == "big"], 0, capacity_search.RESIDENCY_METRIC
    )
    assert (value, lo, hi, method) == (12.0, 12.0, 12.0, "within-boot")
    found = capacity_statistics.compare(data[data["arm"] == "auto"], data[data["arm"] == "big"], "kv_residency", seed=0)
    assert found["ratio"] == found["ci_low"] == found["ci_high"] == pytest.approx(2.0)
    assert found["verdict"] == "better" and not found["censored"]
    slo = capacity_statistics.compare(data[data["arm"] == "auto"], data[data["arm"] == "big"], "capacity", seed=0)
    assert slo["ratio"] == pytest.approx(9 / 6)  # the SLO's knees, unchanged by the residency's trials


def test_a_hit_rate_near_half_widens_the_residency_ci_to_a_tried_level() -> None:
    """Turns whose cached tokens straddle half: resampling them flips the level in some replicates, and the knee
    falls to the next level tried below — never to a level between."""
    levels = twice(
        [(4, 0.03, 0.95), (8, 0.5, 0.3), (6, 0.5, 0.51), (7, 0.5, 0.3)], [(6, 0.5, 0.51), (7, 0.5, 0.3), (5, 0.5, 0.9)]
    )
    recs = records("auto", levels)
    at_six = [r for r in recs if r["capacity"]["sessions"] == 6]
    for k, r in enumerate(at_six):  # half the turns fully cached, half not: 51% over the level
        r["sample"]["cached_tokens"] = 1000 if k % 2 else 20
    data = frame_of(recs)
    s = data["search"].iloc[0]
    assert s.residency == 6
    draws = set(s.residency_draws(0))
    assert draws == {5.0, 6.0} and draws <= set(s.counts)
    assert capacity_statistics.capacity_ci(data, 0, capacity_search.RESIDENCY_METRIC)[1:3] == (5.0, 6.0)


def test_engine_counters_alone_resample_the_levels_trials() -> None:
    data = frame_of(records("auto", AUTO, usage=False))
    s = data["search"].iloc[0]
    assert s.residency == 6 and set(s.residency_draws(0)) == {6.0}
    none = frame_of(records("auto", AUTO, usage=False, engine=False))
    assert none["kv_residency"].isna().all() and none["search"].iloc[0].residency is None
    assert capacity_statistics.capacity_ci(none, 0, capacity_search.RESIDENCY_METRIC)[0] is None


def test_what_bound_the_knee() -> None:
    searches = {s.arm: s for s in frame_of(records("auto", AUTO) + records("big", BIG))["search"]}
    cause, words = capacity_section.knee_bound(searches["auto"])  # the SLO broke where the cache stopped holding them
    assert cause == "kv" and words == "KV (the cache holds 6 sessions)"
    cause, words = capacity_section.knee_bound(searches["big"])  # the cache held 10 sessions, where the SLO broke
    assert cause == "compute" and words.startswith("compute (the cache held them, 95% hits at 10; re-prefill")
    # the issue's: the hit rate collapsed at 8, the SLO held to 52: re-prefill kept up past the cache
    far = [(4, 0.03, 0.95), (8, 0.03, 0.95), (16, 0.03, 0.3), (32, 0.03, 0.2), (64, 0.5, 0.1), (48, 0.03, 0.15)]
    far += [(56, 0.5, 0.1), (52, 0.03, 0.1), (54, 0.5, 0.1), (53, 0.5, 0.1), (12, 0.03, 0.3), (10, 0.03, 0.4)]
    far += [(9, 0.03, 0.4)]
    s = frame_of(records("fp8", far, limit=256))["search"].iloc[0]
    assert (s.capacity, s.residency) == (52, 8)
    cause, words = capacity_section.knee_bound(s)
    assert cause == "compute" and words == (
        "compute (the cache holds 8 sessions; past them re-prefill kept the SLO up to 52 sessions)"
    )
    # the cache held the breaking level, but its hit rate fell by more than 5 points: the evicted part broke it
    soft = twice([(4, 0.03, 0.95), (8, 0.5, 0.3), (6, 0.04, 0.95), (7, 0.4, 0.7)], [(6, 0.04, 0.95), (7, 0.4, 0.7)])
    s = frame_of(records("auto", soft))["search"].iloc[0]
    assert (s.capacity, s.residency) == (6, 7)
    cause, words = capacity_section.knee_bound(s)
    assert cause == "kv" and "the cache holds 7 sessions, but the hit rate went from 95% at 6 to 70% at 7" in words


def test_the_section_states_the_residency_knee_beside_the_slos() -> None:
    data = frame_of(records("auto", AUTO) + records("big", BIG))
    deltas = []
    for metric in ("capacity", "kv_residency"):
        found = capacity_statistics.compare(data[data["arm"] == "auto"], data[data["arm"] == "big"], metric, seed=0)
        deltas.append({"probe": "capacity", "arm": "big", "point": "2k", "metric": metric, **found})
    settings = {"slo": "ttft_p95<=100ms", "capacity_trials": 2}
    section = capacity_section.section(data, ["auto", "big"], deltas, {}, settings, seed=0)  # type: ignore[arg-type]
    rows = {r["arm"]: r for r in section["rows"]}
    big = rows["big"]
    assert big["residency"] == 12.0 and big["residency_ci"] == [12.0, 12.0] and not big["residency_censored"]
    assert big["residency_bracket"] == "held at 12, hit rate below half at 13; 2 trials each"
    assert big["residency_ratio"] == pytest.approx(2.0) and big["knee_cause"] == "compute"
    assert rows["auto"]["knee_bound"] == "KV (the cache holds 6 sessions)"
    header, table = capacity_render.table(section)
    cells = dict(zip(header, table[1], strict=True))
    assert cells["KV-resident sessions [95% CI] (held – fell below half)"].startswith("12 [12, 12] (held at 12")
    assert cells["vs baseline: residency ratio [95% CI]"] == "2.00× [2.00, 2.00]"
    (sentence,) = capacity_section.sentences(section, ["auto", "big"], deltas)  # type: ignore[arg-type]
    assert "; its cache holds 12 [12, 12] sessions (held at 12, hit rate below half at 13; 2 trials each)" in sentence
    assert " vs auto's 6 [6, 6] (held at 6, hit rate below half at 7; 2 trials each): 2.00× [2.00, 2.00]" in sentence
    assert "; knee bound by compute (the cache held them, 95% hits at 10;" in sentence
    assert any(n.startswith("auto at 2k: the knee is bound by KV (the cache holds 6") for n in section["notes"])


def test_the_residency_knee_is_a_capacity_metric() -> None:
    assert (spec := registry.get("capacity")) is not None and spec.metrics == ("capacity", "kv_residency")
    assert catalogue.family("kv_residency") == "capacity" and catalogue.direction("kv_residency") == "higher"


def test_a_residency_knee_at_the_limit_reads_at_least() -> None:
    levels = [(4, 0.03, 0.95), (8, 0.5, 0.9), (16, 0.5, 0.6), (16, 0.5, 0.62), (15, 0.5, 0.7), (15, 0.5, 0.7)]
    data = frame_of(records("big", levels))
    s = data["search"].iloc[0]
    assert s.residency == 16 and s.residency_censored and s.residency_broken is None
    brackets = [s.bracket(capacity_search.RESIDENCY_METRIC)]
    said = capacity_section.bracket_text(brackets, held="held", fell="hit rate below half", none_fell="none below half")
    assert said == "held at 16, none below half; 2 trials"
