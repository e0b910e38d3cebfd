"""The typed run model keeps step with the things it types."""

from __future__ import annotations

import dataclasses
import typing

from pytest_kvcache import model
from pytest_kvcache.model import base
from pytest_kvcache.model.records import SampleData
from pytest_kvcache.sample import Sample


def test_sample_data_keys_are_sample_fields() -> None:
    """SampleData types ``Sample.to_dict()``: the same keys, so neither can gain one the other lacks."""
    assert set(SampleData.__annotations__) == {f.name for f in dataclasses.fields(Sample)}
    assert set(Sample(text="x", tool_calls=[{"name": "f"}]).to_dict()) == set(SampleData.__annotations__)


def test_verdict_is_declared_once() -> None:
    assert base.Verdict is model.Verdict
    assert typing.get_args(model.Verdict) == ("better", "worse", "inconclusive")
