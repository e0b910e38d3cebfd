"""E-Divisive means and the newest-run test on synthetic series (deterministic: fixed seeds)."""

from __future__ import annotations

import numpy as np
import pytest

from pytest_kvcache.store.changepoint import e_divisive, tail_shift


def noisy(seed: int, n: int = 30, cv: float = 0.01) -> np.ndarray:
    return 100.0 * (1.0 + cv * np.random.default_rng(seed).standard_normal(n))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_6_percent_drop_at_run_20_is_the_only_change_point(seed: int) -> None:
    values = noisy(seed)
    values[20:] *= 0.94
    (found,) = e_divisive(values)
    assert found.index == 20
    assert found.p_value < 0.005
    assert found.shift_pct == pytest.approx(-6.0, abs=1.5)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_noise_alone_has_no_change_point(seed: int) -> None:
    assert e_divisive(noisy(100 + seed)) == []


def test_two_steps_are_both_found_in_order() -> None:
    values = noisy(5, n=40)
    values[12:] *= 1.08
    values[28:] *= 0.9
    assert [c.index for c in e_divisive(values)] == [12, 28]


def test_too_short_or_non_finite_series_give_nothing() -> None:
    assert e_divisive([1.0, 2.0, 3.0, 4.0, 5.0]) == []
    assert e_divisive([1.0, float("nan")] * 6) == []


def test_the_same_history_gives_the_same_p_value() -> None:
    values = noisy(9)
    values[15:] *= 0.97
    assert e_divisive(values) == e_divisive(values)


def test_the_newest_run_outside_its_regime() -> None:
    history = list(noisy(3, n=20))
    dropped = tail_shift([*history, 94.0])
    assert dropped is not None and dropped.p_value < 0.005 and dropped.shift_pct == pytest.approx(-6.0, abs=1.5)
    usual = tail_shift([*history, float(np.mean(history))])
    assert usual is not None and usual.p_value > 0.5
    assert tail_shift([100.0, 101.0, 94.0]) is None  # 2 runs before the newest: not a regime
