"""The docs keep up with the code: every option is in docs/configuration.md, every doc link resolves."""

from __future__ import annotations

import re
from pathlib import Path

from pytest_kvcache.config.settings import OPTIONS

ROOT = Path(__file__).resolve().parents[2]


def test_every_option_is_documented() -> None:
    text = (ROOT / "docs" / "configuration.md").read_text()
    assert [o.cli for o in OPTIONS if f"`{o.cli}" not in text and f", `{o.cli}" not in text] == []


def test_relative_links_in_the_docs_resolve() -> None:
    broken = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        if "results" in page.parts:
            continue
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if "://" in target or target.startswith("mailto:"):
                continue
            if not (page.parent / target).exists():
                broken.append(f"{page.relative_to(ROOT)} → {target}")
    assert broken == []
