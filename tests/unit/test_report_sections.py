"""The report in sections (issue 35): ``build()`` walks one ordered list of sections, each a module with
``section(run, ctx) -> keys``; a new section is one module and one line in the list (or one ``register``
call), and report.md walks its renderers the same way."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pytest_kvcache.report import sections
from pytest_kvcache.report.build import build
from pytest_kvcache.report.load import RunData
from pytest_kvcache.report.outputs import markdown
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


def test_a_new_section_is_one_line_in_the_list(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sections, "SECTIONS", [*sections.SECTIONS, toy])
    report = build(two_arm_run())
    assert report["toy"] == {"records": 16, "deltas": 1}  # type: ignore[typeddict-item]
    assert list(report)[-1] == "toy"  # keys follow the list's order


def test_register_places_a_section_before_another(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sections, "SECTIONS", list(sections.SECTIONS))
    assert sections.register(toy, before=sections.notes.section) is toy
    sections.register(toy)  # once only
    keys = list(build(two_arm_run()))
    assert keys.count("toy") == 1 and keys.index("toy") == keys.index("notes") - 1


def test_a_section_that_adds_nothing_leaves_no_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sections, "SECTIONS", [*sections.SECTIONS, lambda run, ctx: {}])
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


def test_report_md_walks_its_renderers_in_order(monkeypatch: pytest.MonkeyPatch) -> None:
    report = build(two_arm_run())
    before = markdown.markdown(report)
    monkeypatch.setattr(markdown, "SECTIONS", [*markdown.SECTIONS, lambda r: ["", "## Toy", "", f"- {r['run_id']}"]])
    after = markdown.markdown(report)
    assert after == before + "\n## Toy\n\n- None\n"
