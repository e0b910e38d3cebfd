"""Power pinning (`pytest_kvcache.gpu.power`). Limits are set here only on the fake NVML layer: these
machines have no GPU, and the GPU the project borrows must never be changed.
"""

from __future__ import annotations

import pytest

from pytest_kvcache.config.grammars import parse_power_limit
from pytest_kvcache.gpu.cards import CardRef
from pytest_kvcache.gpu.nvml import GpuError, RootRequiredError
from pytest_kvcache.gpu.power import apply_power_limits, plan_targets, restore_power_limits, verify_power_limits
from pytest_kvcache.gpu.snapshot import snapshot
from pytest_kvcache.testing.fake_nvml import FakeCard, FakeNvml
from tests.unit.gpu.helpers import UUID_A, UUID_B, UUID_C, refs, two_cards

# ----------------------------------------------------------------------------------- power pinning


@pytest.mark.parametrize(
    ("spec", "verify", "all_w", "by_index", "by_uuid"),
    [
        ("300", False, 300.0, {}, {}),
        ("  450W ", False, 450.0, {}, {}),
        ("0:300,1:250", False, None, {0: 300.0, 1: 250.0}, {}),
        ("GPU-aaaa1111:300", False, None, {}, {"GPU-aaaa1111": 300.0}),
        ("0:300, GPU-bbbb:275.5", False, None, {0: 300.0}, {"GPU-bbbb": 275.5}),
        ("verify:300", True, 300.0, {}, {}),
        ("verify:0:300,1:250", True, None, {0: 300.0, 1: 250.0}, {}),
        ("Verify:GPU-aaaa:300", True, None, {}, {"GPU-aaaa": 300.0}),
    ],
)
def test_parse_power_limit(
    spec: str, verify: bool, all_w: float | None, by_index: dict[int, float], by_uuid: dict[str, float]
) -> None:
    plan = parse_power_limit(spec)
    assert (plan.verify_only, plan.all_w, dict(plan.by_index), dict(plan.by_uuid_prefix)) == (
        verify,
        all_w,
        by_index,
        by_uuid,
    )


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("", "nothing after the option"),
        ("verify:", "nothing after verify:"),
        ("abc", "'abc' is not a positive number of watts"),
        ("0", "'0' is not a positive number of watts"),
        ("-5", "'-5' is not a positive number of watts"),
        ("0:300,250", "'250' needs the form INDEX:WATTS"),
        ("0:300,:250", "':250' needs the form INDEX:WATTS"),
        ("0:fast", "'0:fast': 'fast' is not a positive number of watts"),
        ("gpu0:300", "'gpu0' in 'gpu0:300' is neither a GPU index nor a GPU-… UUID"),
        ("0:300,0:250", "GPU index 0 is given twice"),
        ("GPU-ab:300,gpu-AB:250", "gpu-AB is given twice"),
    ],
)
def test_parse_power_limit_errors(spec: str, message: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_power_limit(spec)
    assert message in str(info.value)


def test_plan_targets_name_only_visible_cards() -> None:
    cards = [CardRef(0, UUID_A), CardRef(1, UUID_B), CardRef(2, UUID_C)]
    assert plan_targets(parse_power_limit("0:300,GPU-bbbb3:250"), cards) == {UUID_A: 300.0, UUID_C: 250.0}
    with pytest.raises(GpuError, match="GPU index 5 is not a visible card"):
        plan_targets(parse_power_limit("5:300"), cards)
    with pytest.raises(GpuError, match="GPU-bbbb matches 2 cards"):
        plan_targets(parse_power_limit("GPU-bbbb:300"), cards)
    with pytest.raises(GpuError, match="GPU-ffff matches no visible card"):
        plan_targets(parse_power_limit("GPU-ffff:300"), cards)
    with pytest.raises(GpuError, match="named twice"):
        plan_targets(parse_power_limit("0:300,GPU-aaaa:250"), cards)


def test_apply_verify_restore_on_the_fake() -> None:
    nvml = two_cards()
    cards = refs(nvml)
    plan = parse_power_limit("0:300,1:250")
    assert verify_power_limits(snapshot(nvml, cards), plan) == [
        "GPU 0 (GPU-aaaa1111): power limit is 700 W, wanted 300 W",
        "GPU 1 (GPU-bbbb2222): power limit is 700 W, wanted 250 W",
    ]
    originals = apply_power_limits(nvml, cards, plan)
    assert originals == {UUID_A: 700.0, UUID_B: 700.0}
    assert nvml.calls == [("set_power_limit_mw", 0, 300_000), ("set_power_limit_mw", 1, 250_000)]
    assert verify_power_limits(snapshot(nvml, cards), plan) == []
    assert verify_power_limits(snapshot(nvml, cards), parse_power_limit("verify:0:300")) == []
    restore_power_limits(nvml, originals)
    assert [c.power_limit_mw for c in nvml.cards] == [700_000, 700_000]
    assert nvml.calls[-2:] == [("set_power_limit_mw", 0, 700_000), ("set_power_limit_mw", 1, 700_000)]


def test_verify_only_plan_never_sets() -> None:
    nvml = two_cards()
    assert apply_power_limits(nvml, refs(nvml), parse_power_limit("verify:300")) == {}
    assert nvml.calls == []


def test_verify_reports_enforced_and_unreadable_limits() -> None:
    nvml = two_cards()
    nvml.cards[0].power_limit_mw = 300_000
    nvml.cards[0].power_limit_enforced_mw = 280_000
    nvml.cards[1].power_limit_mw = None
    problems = verify_power_limits(snapshot(nvml, refs(nvml)), parse_power_limit("verify:300"))
    assert problems == [
        "GPU 0 (GPU-aaaa1111): enforced power limit is 280 W, below the wanted 300 W",
        "GPU 1 (GPU-bbbb2222): power limit unreadable, wanted 300 W",
    ]
    assert verify_power_limits(snapshot(nvml, refs(nvml)), parse_power_limit("9:300")) == [
        "--kv-gpu-power-limit '9:300': GPU index 9 is not a visible card (visible: 0, 1)"
    ]


def test_apply_out_of_range_sets_nothing() -> None:
    nvml = two_cards()
    with pytest.raises(GpuError) as info:
        apply_power_limits(nvml, refs(nvml), parse_power_limit("0:300,1:150"))
    assert str(info.value) == (
        "--kv-gpu-power-limit '0:300,1:150': 150 W is outside GPU 1 (GPU-bbbb2222)'s range 200–700 W"
    )
    assert nvml.calls == []


def test_apply_without_root_raises_root_required() -> None:
    nvml = two_cards(allow_set=False)
    with pytest.raises(RootRequiredError) as info:
        apply_power_limits(nvml, refs(nvml), parse_power_limit("300"))
    assert isinstance(info.value, PermissionError) and isinstance(info.value, GpuError)
    message = str(info.value)
    assert "needs root" in message and "--kv-gpu-power-limit=verify:300" in message
    assert "nvidia-smi -i 0 -pl 300" in message
    assert [c.power_limit_mw for c in nvml.cards] == [700_000, 700_000]


class PartlyRootNvml(FakeNvml):
    """Card 0 may be changed, card 1 refuses: the changed card must be put back."""

    def set_power_limit_mw(self, index: int, limit_mw: int) -> None:
        if index == 1:
            self.calls.append(("set_power_limit_mw", index, limit_mw))
            raise PermissionError("Insufficient Permissions")
        super().set_power_limit_mw(index, limit_mw)


def test_apply_failing_midway_restores_what_it_changed() -> None:
    nvml = PartlyRootNvml([FakeCard(uuid=UUID_A), FakeCard(uuid=UUID_B)])
    with pytest.raises(RootRequiredError):
        apply_power_limits(nvml, refs(nvml), parse_power_limit("300"))
    assert nvml.calls == [
        ("set_power_limit_mw", 0, 300_000),
        ("set_power_limit_mw", 1, 300_000),
        ("set_power_limit_mw", 0, 700_000),
    ]
    assert nvml.cards[0].power_limit_mw == 700_000


def test_restore_tries_every_card_and_reports_failures() -> None:
    nvml = PartlyRootNvml([FakeCard(uuid=UUID_A), FakeCard(uuid=UUID_B)])
    nvml.cards[0].power_limit_mw = 300_000
    with pytest.raises(GpuError) as info:
        restore_power_limits(nvml, {UUID_A: 700.0, UUID_B: 700.0, "GPU-ffff": 700.0})
    assert str(info.value) == (
        "could not restore GPU power limits: GPU 1 (GPU-bbbb2222): Insufficient Permissions; GPU-ffff: card not found"
    )
    assert nvml.cards[0].power_limit_mw == 700_000
