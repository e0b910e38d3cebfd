"""Capacity probe: how many concurrent sessions of --kv-capacity-depths tokens each arm sustains under --kv-slo."""

from __future__ import annotations

import json
from typing import Any

import pytest

from pytest_kvcache.config.grammars import parse_slo
from pytest_kvcache.config.settings import Settings
from pytest_kvcache.fanout import FanoutError
from pytest_kvcache.fanout_plan import SessionTrial
from pytest_kvcache.plugin import Recorder
from pytest_kvcache.probes import capacity, concurrency, prefill
from pytest_kvcache.probes.concurrency import excluded_reason
from pytest_kvcache.probes.counting import token_counter
from pytest_kvcache.probes.registry import depth_label
from pytest_kvcache.probes.short import chat_payload
from pytest_kvcache.run.measure import ArmClient, Server


def _ms(value: float | None) -> str:
    return "–" if value is None else f"{value * 1000:.0f} ms"


@pytest.mark.capacity
def test_capacity(
    kv_server: Server, kv_client: ArmClient, kv_record: Recorder, kv_settings: Settings, kv_capacity_depth: int
) -> None:
    st = kv_settings
    depth = kv_capacity_depth
    point = depth_label(depth)
    label = f"capacity {point} on {kv_server.name}"
    slo = parse_slo(st.slo)
    max_len = kv_server.evidence.get("max_model_len")
    if max_len and depth + st.capacity_max_tokens > max_len:
        pytest.skip(f"depth {depth} + {st.capacity_max_tokens} output tokens exceeds {kv_server.name}'s max_model_len")
    count_body, method = token_counter(kv_client, kv_server, st)

    def count(messages: list[dict[str, Any]]) -> int:
        return count_body({"messages": messages})

    failure: str | None = None
    try:
        sized = prefill.size_prompt(depth, capacity.session_salt(st.seed, depth, -1, 0), count)
        first = prefill.messages_for(capacity.context("sizing", sized.repeats, sized.pad_words))
        grown = capacity.session_plan({}, first[0]["content"], "sizing", 3, (0.0, 0.0, 0.0))
        after_two = json.loads(grown.head + b"".join(grown.turns) + grown.tail)["messages"]
        growth = max(1, (count(after_two) - count(first)) // 2)
    except prefill.SizingError as exc:
        failure = f"{label}: cannot size a {depth}-token context ({method}): {exc}"
    if failure is not None:
        pytest.fail(failure, pytrace=False)
    turns = capacity.turns_for(st.capacity_window_s, st.capacity_think_s)
    if max_len:  # a session's context never outgrows the model: it stops sending instead
        turns = max(2, min(turns, 1 + (int(max_len) - st.capacity_max_tokens - sized.tokens) // growth))
    payload: dict[str, Any] = kv_server.profile.adapt(
        chat_payload(kv_server.model, [], "greedy", st.capacity_max_tokens)
    )
    payload.pop("messages")
    search = capacity.Search(start=st.capacity_start, limit=st.capacity_max_sessions, trials=st.capacity_trials)
    # a turn sent late only stretches its think time: judged late past a quarter of it (the loop lag and the
    # client's CPU, which distort the timings, are judged as for every trial)
    fanout = concurrency.fanout(
        kv_server, st, st.capacity_max_sessions, max_schedule_delay_s=max(0.05, 0.25 * st.capacity_think_s)
    )
    problems: list[str] = []
    retried: dict[int, int] = {}  # excluded trials in a row per level (reset by a trial judged there)
    pooled: dict[int, list[capacity.TurnTimes]] = {}  # every judged trial's measured turns per level
    cache: dict[int, list[capacity.HitCounts]] = {}  # every judged trial's prefix-cache figures per level
    stopped = ""
    trial = 0

    def run(sessions: int, window_s: float = st.capacity_window_s) -> tuple[SessionTrial, capacity.EngineWatch]:
        plans = []
        for i in range(sessions):
            salt = capacity.session_salt(st.seed, depth, trial, i)
            think = capacity.think_times(st.seed, depth, trial, i, turns, st.capacity_think_s)
            text = capacity.context(salt, sized.repeats, sized.pad_words)
            plans.append(capacity.session_plan(payload, text, salt, turns, think))
        watch = capacity.EngineWatch(kv_client.scrape, kv_client.kind.counters if kv_client.kind else {})
        try:
            found = fanout.sessions(plans, window_s=window_s, monitor=watch, warm_concurrency=capacity.WARM_CONCURRENCY)
        except FanoutError as exc:
            pytest.fail(f"{label}: the many-stream client failed: {exc}", pytrace=False)
        return found, watch

    with fanout:
        if st.warmups:  # an unmeasured trial at the first level: a fresh engine's first requests are slow
            first_level = search.next() or 1
            result, _ = run(first_level, window_s=max(1.0, st.capacity_window_s / 3))
            for turn in result.turns:
                kv_record(
                    turn.sample,
                    probe="capacity",
                    shape=point,
                    depth=depth,
                    phase="warmup",
                    index=trial,
                    session=turn.session,
                    turn=turn.turn,
                    client=result.load.to_dict(),
                    capacity={"sessions": first_level, "trial": trial, "step": "warmup", "slo": slo.text()},
                )
            trial += 1
            if not kv_server.engine.alive():
                pytest.fail(f"{label}: the engine died during the warmup trial", pytrace=False)
        while (sessions := search.next()) is not None:
            step = search.step
            result, watch = run(sessions)
            measured = [t for t in result.turns if t.turn > 0]
            times = [capacity.turn_times(t.sample.to_dict()) for t in measured]
            figures = capacity.judge(times, slo, st.capacity_window_s)
            excluded = excluded_reason(result.load)
            if result.window_unix_s is None:
                excluded = excluded or "the sessions never all finished their warmup"
            verdict = "excluded" if excluded else "meets" if figures.meets else "breaks"
            info: dict[str, Any] = {
                "sessions": sessions,
                "trial": trial,
                "step": step,
                "retry": retried.get(sessions, 0) > 0,
                "slo": slo.text(),
                "max_sessions": st.capacity_max_sessions,
                "trials_per_level": st.capacity_trials,
                "window_s": st.capacity_window_s,
                "think_s": st.capacity_think_s,
                "max_tokens": st.capacity_max_tokens,
                "context_tokens": sized.tokens,
                "window_unix_s": list(result.window_unix_s) if result.window_unix_s else None,
                **watch.info(),
                "verdict": verdict,
                "excluded_reason": excluded,
            }
            hits, queries = (
                (watch.delta or {}).get("prefix_cache_hits"),
                (watch.delta or {}).get("prefix_cache_queries"),
            )
            answered = [t.sample for t in measured if t.sample.ok]
            counts = capacity.HitCounts(
                hits=float(hits) if isinstance(hits, int | float) else None,
                queries=float(queries) if isinstance(queries, int | float) else None,
                cached=sum(int(x.cached_tokens or 0) for x in answered),
                prompt=sum(int(x.prompt_tokens or 0) for x in answered if x.cached_tokens is not None),
            )
            found_rate, source = capacity.hit_rate([counts])
            rate = "" if found_rate is None else f", hit rate {100 * found_rate:.0f}%"
            rate += " (usage)" if source == "usage" else ""
            level_rate, _ = capacity.hit_rate([*cache.get(sessions, []), counts])
            level = ""
            if not excluded and pooled.get(sessions):  # tried before: the level's verdict is over all its trials
                over = capacity.judge(pooled[sessions] + times, slo, st.capacity_window_s)
                level = f"; over its {search.counts.get(sessions, 0) + 1} trials {'meets' if over.meets else 'breaks'}"
                if level_rate is not None:
                    level += f", hit rate {100 * level_rate:.0f}%"
            summary = (
                f"{sessions} sessions ({step}): {verdict}{' — ' + '; '.join(figures.broken) if figures.broken else ''}"
                f" — {figures.turns} turns, TTFT p95 {_ms(figures.ttft_p95_s)}, ITL p95 {_ms(figures.itl_p95_s)}{rate}"
                f"{level}"
            )
            host_excluded = False
            for k, turn in enumerate(result.turns):
                sample = turn.sample
                if not sample.ok and sample.error_kind not in capacity.OVERLOAD:
                    problems.append(f"{sessions} sessions, session {turn.session} turn {turn.turn}: {sample.error}")
                last = k == len(result.turns) - 1
                rec = kv_record(
                    sample,
                    probe="capacity",
                    shape=point,
                    depth=depth,
                    phase="warmup" if turn.turn == 0 else "measured",
                    index=trial,
                    session=turn.session,
                    turn=turn.turn,
                    client=result.load.to_dict(),
                    flags=["client_saturated"] if result.load.saturated else [],
                    excluded_reason=excluded if sample.ok else None,
                    capacity={**info, **({"summary": summary} if last else {})},
                )
                host_excluded |= bool(turn.turn > 0 and sample.ok and rec.get("excluded_reason") and not excluded)
            trial += 1
            if not kv_server.engine.alive():
                pytest.fail(f"{label}: the engine died during {sessions} sessions", pytrace=False)
            if problems:
                break
            if excluded or host_excluded:  # the trial's figures are not the engine's: tried again
                retried[sessions] = retried.get(sessions, 0) + 1
                if retried[sessions] > capacity.RETRIES:
                    stopped = f"{sessions} sessions excluded {retried[sessions]} times ({excluded or 'host CPU busy'})"
                    break
                continue
            retried.pop(sessions, None)
            # the level's verdict over every trial there: its SLO terms over all their measured turns
            pooled.setdefault(sessions, []).extend(times)
            cache.setdefault(sessions, []).append(counts)
            # and whether the cache holds the level's sessions: its hit rate over all its trials (None: unknown)
            search.record(
                sessions,
                capacity.judge(pooled[sessions], slo, st.capacity_window_s).meets,
                capacity.holds(capacity.hit_rate(cache[sessions])[0]),
            )
    censored = " (no level broke the SLO: at least)" if search.censored else ""
    residency = "" if search.residency is None else f", KV residency {search.residency}"
    reason = stopped or f"capacity {search.capacity}{censored}{residency} after {trial} trial(s)"
    kv_record.sampling(
        {"reason": reason, "n": trial, "verdicts": search.verdicts, "holds": search.holds, "trials": search.counts},
        probe="capacity",
        point=point,
    )
    if problems:
        pytest.fail(f"{label}: " + "; ".join(problems[:5]), pytrace=False)
