"""The byte-identical guard of a refactor: every committed run folder under docs/results/, re-rendered by the
code of this checkout into a temporary copy, and the sha256 of each report output it writes.

    python scripts/rerender_manifest.py            # print the manifest as JSON
    python scripts/rerender_manifest.py --write    # store it as tests/data/rerender/manifest.json

tests/unit/test_rerender_bytes.py re-renders the same folders and compares: a change that should not alter
any report (moving code, splitting modules) must leave every hash as the stored manifest has it. Re-rendering
is deterministic: the bootstrap is seeded by each run's --kv-seed, the plots carry no date.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"
MANIFEST = ROOT / "tests" / "data" / "rerender" / "manifest.json"
#: the files a re-render writes (what the manifest hashes); plots by pattern
OUTPUTS = ("report.json", "report.md", "report.html", "summary.csv")


def run_folders() -> list[Path]:
    """Every committed run folder (one with a report.json), in a stable order."""
    return sorted(p.parent for p in RESULTS.glob("**/report.json"))


def render(folder: Path) -> dict[str, str]:
    """sha256 of each output of ``folder`` re-rendered in a temporary copy."""
    sys.path.insert(0, str(ROOT))
    from pytest_kvcache.model.options import ReportOptions
    from pytest_kvcache.report.pipeline import produce

    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / folder.name
        shutil.copytree(folder, copy)
        for name in (*OUTPUTS, *(p.name for p in copy.glob("*.png"))):
            (copy / name).unlink(missing_ok=True)
        outcome = produce(copy, ReportOptions())
        if outcome.error is not None:
            raise SystemExit(f"{folder}: {outcome.error}")
        written = [copy / n for n in OUTPUTS if (copy / n).is_file()] + sorted(copy.glob("*.png"))
        return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in written}


def manifest() -> dict[str, dict[str, str]]:
    return {str(folder.relative_to(ROOT)): render(folder) for folder in run_folders()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help=f"store it as {MANIFEST.relative_to(ROOT)}")
    args = parser.parse_args()
    found = manifest()
    text = json.dumps(found, indent=1, sort_keys=True) + "\n"
    if args.write:
        MANIFEST.parent.mkdir(parents=True, exist_ok=True)
        MANIFEST.write_text(text)
        print(f"{MANIFEST.relative_to(ROOT)}: {len(found)} run folders")
    else:
        print(text, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
