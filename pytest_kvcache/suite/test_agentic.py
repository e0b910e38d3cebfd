"""Agentic decode-at-depth: a coding-assistant session whose context grows turn by turn."""

from __future__ import annotations

import pytest

from pytest_kvcache.config.settings import Settings
from pytest_kvcache.plugin import Recorder
from pytest_kvcache.probes import agentic
from pytest_kvcache.probes.runner import server_lost
from pytest_kvcache.run.measure import ArmClient, Server


@pytest.mark.agentic
@pytest.mark.depth
def test_agentic(
    kv_server: Server, kv_client: ArmClient, kv_record: Recorder, kv_settings: Settings, kv_agentic_session: int
) -> None:
    try:
        session = agentic.load()
    except agentic.FixtureError as exc:
        message = str(exc)
        pytest.fail(message, pytrace=False)
    mode = kv_settings.agentic_mode
    conversation = agentic.Conversation.start(session, kv_agentic_session, kv_settings.seed)
    turns = min(len(session.turns), kv_settings.turns or len(session.turns))
    problems = []
    for turn_no in range(1, turns + 1):
        conversation.ask(turn_no)
        payload = conversation.payload(kv_server.model, mode, kv_settings.agentic_max_tokens)
        sample, engine = kv_client.measure(payload, keep_text=mode == "live")
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
            fixture_sha256=session.sha256,
        )
        if not sample.ok:
            problems.append(f"turn {turn_no} failed: {sample.error_kind}: {sample.error}")
            if server_lost(sample):
                break
    if problems:
        pytest.fail(f"agentic session {kv_agentic_session} on {kv_server.name}: " + "; ".join(problems), pytrace=False)
