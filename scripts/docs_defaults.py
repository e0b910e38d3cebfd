"""docs/configuration.md's table of the defaults that follow the model, from the declarations.

    python scripts/docs_defaults.py            # print the table
    python scripts/docs_defaults.py --write    # rewrite it in docs/configuration.md (between its markers)

tests/unit/test_docs.py fails when the committed table is not what this prints.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from pytest_kvcache.config import defaults_table

DOC = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="rewrite the table in docs/configuration.md")
    args = parser.parse_args()
    if args.write:
        DOC.write_text(defaults_table.replaced(DOC.read_text()))
        print(f"{DOC}: {len(defaults_table.rows())} options")
    else:
        print(defaults_table.markdown())


if __name__ == "__main__":
    main()
