"""The refactor's guard (issue 35): every committed run folder under docs/results/ re-renders to the very bytes
that the commit before the refactor wrote — report.json, report.md, report.html, summary.csv and each plot.

``tests/data/rerender/manifest.json`` holds their sha256, written by ``python scripts/rerender_manifest.py
--write`` at that commit. A change meant to alter a report (a new section, a new rule) rewrites the manifest in
the same commit, and says so in its message; a change meant to move code must leave it as it is."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("rerender_manifest", ROOT / "scripts" / "rerender_manifest.py")
assert _spec is not None and _spec.loader is not None
rerender = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(rerender)

STORED: dict[str, dict[str, str]] = json.loads(rerender.MANIFEST.read_text())


def test_the_manifest_covers_every_committed_run_folder() -> None:
    assert sorted(STORED) == [str(p.relative_to(ROOT)) for p in rerender.run_folders()]


@pytest.mark.parametrize("folder", sorted(STORED))
def test_a_committed_run_rerenders_byte_for_byte(folder: str) -> None:
    assert rerender.render(ROOT / folder) == STORED[folder]


@pytest.mark.parametrize("folder", sorted(STORED))
def test_the_committed_report_md_is_what_the_code_renders(folder: str) -> None:
    """The committed report.md of each run folder is the re-rendered one (with the manifest test above: what this
    checkout's code writes): a change to the report rules re-renders and commits the docs' reports with it."""
    import hashlib

    committed = ROOT / folder / "report.md"
    assert hashlib.sha256(committed.read_bytes()).hexdigest() == STORED[folder]["report.md"], (
        f"{folder}/report.md is stale: kvcache-report {folder}"
    )
