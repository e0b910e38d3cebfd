"""Agentic decode-at-depth: a coding-assistant session whose context grows turn by turn.

The session reaches the depth ``--kv-agentic-depth`` asks for (default: what fits the engine's context) by
scaling the fixture's tool results, counted with the engine's own tokenizer; every turn's prompt is
counted before it is sent, and a turn that cannot fit the context is left out — with every later turn,
which only grows — and said so, never sent to fail with HTTP 400."""

from __future__ import annotations

import pytest

from pytest_kvcache.config.context import agentic_target
from pytest_kvcache.config.settings import Settings
from pytest_kvcache.plugin import Recorder
from pytest_kvcache.probes import agentic, counting, prefill
from pytest_kvcache.probes.runner import server_lost
from pytest_kvcache.run.measure import ArmClient, Server


@pytest.mark.agentic
@pytest.mark.depth
def test_agentic(
    kv_server: Server, kv_client: ArmClient, kv_record: Recorder, kv_settings: Settings, kv_agentic_session: int
) -> None:
    label = f"agentic session {kv_agentic_session} on {kv_server.name}"
    failure: str | None = None
    try:
        session = agentic.load()
    except agentic.FixtureError as exc:
        failure = str(exc)
    if failure is not None:
        pytest.fail(failure, pytrace=False)
    mode = kv_settings.agentic_mode
    max_tokens = kv_settings.agentic_max_tokens
    turns = min(len(session.turns), kv_settings.turns or len(session.turns))
    limit = counting.max_model_len(kv_server)
    count, method = counting.token_counter(kv_client, kv_server, kv_settings)
    spec = kv_settings.agentic_depth
    target = agentic_target(spec, limit, max_tokens)
    if spec == "fit" and limit is not None:
        target = limit - max_tokens
    last_tokens = None
    if target is not None and target >= 1 and method != "calibrated":  # else turn 1 is left out below
        try:
            session, last_tokens = agentic.fit(
                session,
                count,
                target,
                last_turn=turns,
                session_no=kv_agentic_session,
                seed=kv_settings.seed,
                grow=spec != "fit",
            )
        except (agentic.FitError, prefill.SizingError) as exc:
            failure = f"{label}: cannot size the session to {target:,} tokens: {exc}"
        if failure is not None:
            pytest.fail(failure, pytrace=False)
    fixture = {
        "fixture_sha256": session.sha256,
        "fixture_scale": session.scale,
        "fixture_stock_sha256": session.stock_sha256 or session.sha256,
        "fixture_depth": spec,
        "fixture_last_turn_tokens": last_tokens,
    }
    conversation = agentic.Conversation.start(session, kv_agentic_session, kv_settings.seed)
    problems = []
    for turn_no in range(1, turns + 1):
        conversation.ask(turn_no)
        payload = conversation.payload(kv_server.model, mode, max_tokens)
        prompt_tokens: int | None = None
        if method != "calibrated":
            try:
                prompt_tokens = count(payload)
            except prefill.SizingError as exc:
                problems.append(f"turn {turn_no}: cannot count its prompt: {exc}")
                break
        too_long = counting.overflow(prompt_tokens, max_tokens, kv_server) if prompt_tokens is not None else None
        if too_long:  # this turn and every later one (each only grows): not sent
            left = list(range(turn_no, turns + 1))
            for turn in left:
                kv_record.left_out(
                    probe="agentic",
                    point=f"turn{turn}",
                    reason=too_long if turn == turn_no else f"turn {turn_no} already cannot fit",
                    session=kv_agentic_session,
                    turn=turn,
                    **({"prompt_tokens": prompt_tokens} if turn == turn_no else {}),
                    **fixture,
                )
            break
        sample, engine = kv_client.measure(payload, keep_text=mode == "live", prompt_tokens=prompt_tokens)
        miss = None
        if mode == "live" and sample.ok:
            miss = conversation.answer(turn_no, sample.tool_calls, sample.text)
        else:
            conversation.answer(turn_no)
        kv_record(
            sample,
            probe="agentic",
            shape=mode,
            turn=turn_no,
            session=kv_agentic_session,
            phase="measured",
            index=turn_no - 1,
            engine=engine,
            prompt_sha256=agentic.prompt_sha256(payload),
            result_chars=len(session.turns[turn_no - 1].result),
            tool_call_miss=miss,
            counted_prompt_tokens=prompt_tokens,
            flags=prefill.prompt_count_flags(prompt_tokens, sample.prompt_tokens),
            **fixture,
        )
        if not sample.ok:
            problems.append(f"turn {turn_no} failed: {sample.error_kind}: {sample.error}")
            if server_lost(sample):
                break
    if problems:
        pytest.fail(f"{label}: " + "; ".join(problems), pytrace=False)
