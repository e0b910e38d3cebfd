"""Shared helpers of the GPU unit tests: card UUIDs, a two-card fake NVML, a fake clock."""

from __future__ import annotations

from typing import Any

from pytest_kvcache.gpu.cards import CardRef, visible_cards
from pytest_kvcache.testing.fake_nvml import FakeCard, FakeNvml

UUID_A = "GPU-aaaa1111-0000-0000-0000-000000000000"
UUID_B = "GPU-bbbb2222-0000-0000-0000-000000000000"
UUID_C = "GPU-bbbb3333-0000-0000-0000-000000000000"


def two_cards(**kw: Any) -> FakeNvml:
    return FakeNvml([FakeCard(uuid=UUID_A), FakeCard(uuid=UUID_B)], **kw)


def refs(nvml: FakeNvml) -> list[CardRef]:
    return visible_cards(nvml, {})


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
