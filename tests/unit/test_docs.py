"""The docs keep up with the code: every option is in docs/configuration.md, every doc link resolves."""

from __future__ import annotations

import re
from pathlib import Path

from pytest_kvcache.config import defaults_table
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


def test_the_defaults_by_model_table_is_generated_from_the_declarations() -> None:
    """docs/configuration.md's defaults that follow the model are the ones a run resolves (issue 43: the table once
    gave the tiny model's capacity depths and SLO as the trained default's)."""
    text = (ROOT / "docs" / "configuration.md").read_text()
    assert defaults_table.replaced(text) == text, "stale: python scripts/docs_defaults.py --write"
    rows = {row[0]: row[1:] for row in defaults_table.rows()}
    assert rows["`--kv-capacity-depths`"] == ["16k,32k", "1k,2k", "2k,4k"]
    assert rows["`--kv-slo`"][1] == "ttft_p95<=1.5s,itl_p95<=150ms"
    # no row of the options table states a CPU default of its own beside the generated one
    for option in OPTIONS:
        if option.cpu_default is None:
            continue
        row = next(line for line in text.splitlines() if line.startswith("| `" + option.cli))
        assert "on the embedded CPU default" not in row, option.cli
