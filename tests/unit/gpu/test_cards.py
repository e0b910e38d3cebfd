"""Which cards a run uses (`pytest_kvcache.gpu.cards`): ``CUDA_VISIBLE_DEVICES`` as CUDA reads it."""

from __future__ import annotations

import pytest

from pytest_kvcache.gpu.cards import CardRef, visible_cards
from pytest_kvcache.testing.fake_nvml import FakeCard, FakeNvml
from tests.unit.gpu.helpers import UUID_A, UUID_B, UUID_C

# ------------------------------------------------------------------------------------ which cards


def three_cards() -> FakeNvml:
    return FakeNvml([FakeCard(uuid=UUID_A), FakeCard(uuid=UUID_B), FakeCard(uuid=UUID_C)])


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, [0, 1, 2]),
        ("", []),
        ("2,0", [2, 0]),
        (" 1 ", [1]),
        ("GPU-aaaa", [0]),
        ("gpu-BBBB3333", [2]),
        ("GPU-bbbb3333-0000-0000-0000-000000000000,0", [2, 0]),
        ("0,7,1", [0]),  # CUDA stops at the first entry naming no card
        ("1,GPU-bbbb,0", [1]),  # ambiguous prefix: stop
        ("0,0,1", [0]),  # a card named twice: stop
        ("MIG-abc,0", []),
        ("GPU-", []),
    ],
)
def test_visible_cards_follow_cuda_visible_devices(value: str | None, expected: list[int]) -> None:
    nvml = three_cards()
    env = {} if value is None else {"CUDA_VISIBLE_DEVICES": value}
    assert [c.index for c in visible_cards(nvml, env)] == expected


def test_visible_cards_carry_uuids() -> None:
    nvml = three_cards()
    cards = visible_cards(nvml, {"CUDA_VISIBLE_DEVICES": "GPU-bbbb2"})
    assert cards == [CardRef(1, UUID_B)] and cards[0].label == "GPU 1 (GPU-bbbb2222)"
    assert visible_cards(None, {}) == []
