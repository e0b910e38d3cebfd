"""A user-written probe next to the stock suite: every test that asks for ``kv_server`` runs per arm."""

from __future__ import annotations

import pytest

from pytest_kvcache.probes.short import chat_payload


@pytest.mark.short
def test_one_line_answer(kv_server, kv_client, kv_record) -> None:
    payload = chat_payload(kv_server.model, [{"role": "user", "content": "Name one prime."}], "greedy", 16)
    sample = kv_client.stream_chat(payload)
    kv_record(sample, probe="user", shape="one-line", phase="measured", index=0)
    assert sample.ok, sample.error
    assert sample.completion_tokens == 16
