"""An option is one declaration: a field declared with ``option(…)`` is a flag, an ini key and an environment
variable, parses from each, gets its default (its own on the embedded CPU default), lands in the Settings
and in ``to_dict`` — and the docs test asks for its docs line. Nothing else is written for it."""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import cast

import pytest

from pytest_kvcache.config import values as v
from pytest_kvcache.config.constants import SettingsError
from pytest_kvcache.config.options import OPTION, option, options_of
from pytest_kvcache.config.resolve import resolve
from pytest_kvcache.config.settings import OPTIONS, Settings
from tests.unit.test_docs import ROOT


@dataclass(frozen=True)
class ToySettings(Settings):
    # The whole cost of a new option (plus its docs line): this declaration.
    toy_level: int = option(
        help="how many toys per probe (default 3; 1 on the embedded CPU default).",
        metavar="N",
        parse=v.count(0, 100),
        default=3,
        cpu_default=lambda model: 1,
    )


def toy(tmp_path: Path, cli: dict[str, object] | None = None, **sources: dict[str, str]) -> ToySettings:
    given = {"arms": "auto", **(cli or {})}
    env, ini = sources.get("env", {}), sources.get("ini", {})
    return cast(ToySettings, resolve(given, env, ini, {}, tmp_path, settings_class=ToySettings))


def test_a_declared_option_is_a_flag_an_ini_key_and_an_env_variable() -> None:
    (spec,) = [o for o in options_of(ToySettings) if o.field == "toy_level"]
    assert (spec.name, spec.cli, spec.ini, spec.env, spec.metavar) == (
        "toy_level",
        "--kv-toy-level",
        "kv_toy_level",
        "PYTEST_KVCACHE_TOY_LEVEL",
        "N",
    )


def test_a_declared_option_resolves_from_every_source_by_precedence(tmp_path: Path) -> None:
    assert toy(tmp_path).toy_level == 1  # the embedded CPU default's own default
    assert toy(tmp_path, {"model": "org/model"}).toy_level == 3  # the default elsewhere
    assert toy(tmp_path, ini={"toy_level": "5"}).toy_level == 5
    assert toy(tmp_path, env={"PYTEST_KVCACHE_TOY_LEVEL": "6"}, ini={"toy_level": "5"}).toy_level == 6
    assert toy(tmp_path, {"toy_level": "7"}, env={"PYTEST_KVCACHE_TOY_LEVEL": "6"}).toy_level == 7
    assert "toy_level" in toy(tmp_path, {"toy_level": "7"}).explicit
    with pytest.raises(SettingsError, match=r"^PYTEST_KVCACHE_TOY_LEVEL: expected a whole number, got 'many'"):
        toy(tmp_path, env={"PYTEST_KVCACHE_TOY_LEVEL": "many"})


def test_a_declared_option_is_serialised_and_asked_for_in_the_docs(tmp_path: Path) -> None:
    assert toy(tmp_path, {"toy_level": "7"}).to_dict()["toy_level"] == 7
    assert ToySettings(arms=()).toy_level == 3
    docs = (ROOT / "docs" / "configuration.md").read_text()
    missing = [o.cli for o in options_of(ToySettings) if f"`{o.cli}" not in docs and f", `{o.cli}" not in docs]
    assert missing == ["--kv-toy-level"]  # what tests/unit/test_docs.py would ask for, were it in Settings


def test_every_settings_option_is_declared_on_its_field() -> None:
    """The option table is the fields' declarations (and the two options that set no field of their own)."""
    declared = {f.name for f in fields(Settings) if OPTION in f.metadata}
    assert {o.field for o in OPTIONS if o.field is not None} == declared
    assert sorted(o.name for o in OPTIONS if o.field is None) == ["no_self_check", "rerender"]
    assert OPTIONS[0].name == "arms"
    # the names that differ from their field are said once, in the declaration
    renamed = {o.name: o.field for o in OPTIONS if o.field is not None and o.field != o.name}
    assert renamed == {
        "endpoint": "endpoints",
        "startup_timeout": "startup_timeout_s",
        "request_timeout": "request_timeout_s",
        "stall_timeout": "stall_timeout_s",
        "first_token_floor": "first_token_floor_s",
        "no_suite": "suite",
        "no_agreement": "agreement",
        "fail": "gates",
        "target_ci": "target_ci_pct",
        "client_max_cpu": "client_max_cpu_pct",
        "fidelity_topk": "fidelity_top_k",
        "capacity_think": "capacity_think_s",
        "capacity_window": "capacity_window_s",
        "host_cpu_max": "host_cpu_max_pct",
        "host_cpu": "host_cpu_action",
    }


def test_settings_are_frozen_and_the_plan_is_built_from_them(tmp_path: Path) -> None:
    from dataclasses import FrozenInstanceError

    from pytest_kvcache.config.plan import BootPlan

    s = resolve({"arms": "auto,float16", "replicates": "2"}, {}, {}, {}, tmp_path, lanes=2)
    with pytest.raises(FrozenInstanceError):
        s.lanes = 1  # type: ignore[misc]
    plan = BootPlan.of(s)
    assert [b.boot_id for b in plan] == [b.boot_id for b in BootPlan.of(s).boots]
    assert plan.lanes_used == {0, 1} and len(plan) == 4
