"""The report in parts (issues 35 and 43): ``build()`` and every output walk the report parts in their own order,
each part declared by its feature's module (its ``section(run, ctx) -> keys`` and its renderers); a new feature is
one module, or one ``part.register`` call, and no output keeps a list."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pytest_kvcache.report import part
from pytest_kvcache.report.build import build
from pytest_kvcache.report.load import RunData
from pytest_kvcache.report.outputs import htmlpage, markdown, terminal
from pytest_kvcache.report.part import ReportPart
from pytest_kvcache.report.sections.context import BuildContext


def two_arm_run() -> RunData:
    rng = np.random.default_rng(1)
    records: list[dict[str, Any]] = []
    for arm, centre in (("a", 100.0), ("b", 104.0)):
        for i, value in enumerate(rng.normal(centre, 6.0, 8)):
            records.append(
                {
                    "arm": arm,
                    "boot": arm,
                    "replicate": 1,
                    "probe": "short",
                    "shape": "code",
                    "phase": "measured",
                    "index": i,
                    "ok": True,
                    "excluded_reason": None,
                    "metrics": {"decode_tps": float(value)},
                    "sample": {},
                }
            )
    meta = {"settings": {"arms": [{"name": "a"}, {"name": "b"}], "seed": 3}, "plan": []}
    return RunData(path=Path("/nonexistent"), meta=meta, records=records)  # type: ignore[arg-type]


def toy(run: RunData, ctx: BuildContext) -> dict[str, Any]:
    """A newcomer's section: it reads the run and a fact the build shares (the judged deltas)."""
    return {"toy": {"records": len(run.records), "deltas": len(ctx.deltas)}}


@pytest.fixture
def registered() -> Any:
    yield part.register
    part.unregister("toy")


def test_a_new_part_is_one_declaration(registered: Any) -> None:
    registered(ReportPart("toy", json=(1000, toy)))
    report = build(two_arm_run())
    assert report["toy"] == {"records": 16, "deltas": 1}  # type: ignore[typeddict-item]
    assert list(report)[-1] == "toy"  # keys follow the parts' places


def test_a_part_stands_where_its_number_puts_it(registered: Any) -> None:
    notes = next(p for p in part.parts() if p.name == "notes")
    place = notes.json[0] if notes.json else 0
    registered(ReportPart("toy", json=(place - 5, toy)))
    registered(ReportPart("toy", json=(place - 5, toy)))  # once only: the later replaces it
    keys = list(build(two_arm_run()))
    assert keys.count("toy") == 1 and keys.index("toy") == keys.index("notes") - 1


def test_a_stock_part_alone_is_named_after_its_module_and_a_registered_one_names_itself() -> None:
    from pytest_kvcache.report.sections import agentic

    assert agentic.PART.name == "" and "agentic" in [p.name for p in part.parts()]
    with pytest.raises(ValueError, match=r"a registered report part needs a name"):
        part.register(ReportPart(json=(5, toy)))


def test_every_stock_part_is_its_features_module() -> None:
    names = [p.name for p in part.parts()]
    assert len(names) == len(set(names))
    # every output's stock renderers are parts' (none is listed anywhere else), each at a place of its own
    for output in part.OUTPUTS:
        places = [at[0] for p in part.parts() if (at := p.at(output)) is not None]
        assert len(places) == len(set(places)), output
    assert not hasattr(markdown, "SECTIONS") and not hasattr(terminal, "SECTIONS")
    assert not hasattr(htmlpage, "TABLES") and not hasattr(htmlpage, "FOLDED")


def test_a_section_that_adds_nothing_leaves_no_key(registered: Any) -> None:
    registered(ReportPart("toy", json=(1000, lambda run, ctx: {})))
    report = build(two_arm_run())
    assert "capacity" not in report and "blocks" not in report  # neither probe nor lanes: both leave themselves out
    assert list(report)[:5] == ["report_version", "run_id", "status", "model", "versions"]


def test_a_section_reads_another_once() -> None:
    calls: list[int] = []

    def counted(run: RunData, ctx: BuildContext) -> dict[str, Any]:
        calls.append(1)
        return {"counted": True}

    ctx = BuildContext(two_arm_run())
    assert ctx.of(counted) is ctx.of(counted) and calls == [1]


def test_report_md_walks_its_renderers_in_order(registered: Any) -> None:
    report = build(two_arm_run())
    before = markdown.markdown(report)
    registered(ReportPart("toy", markdown=(1000, lambda r: ["", "## Toy", "", f"- {r['run_id']}"])))
    after = markdown.markdown(report)
    assert after == before + "\n## Toy\n\n- None\n"
