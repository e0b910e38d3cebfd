"""``kvcache-report RUN_DIR``: rebuild a stored run's report and gates without booting anything."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from pytest_kvcache.analysis import IncompleteRun
from pytest_kvcache.finish import finish, summary_lines
from pytest_kvcache.gates import GateError


def rerender(
    run: Path,
    gate_texts: Sequence[str] = (),
    *,
    inconclusive: str = "warn",
    compare: Path | None = None,
    out: Callable[[str], None] = print,
) -> int:
    """Exit code: 0 ok, 1 a gate failed, 4 bad input (incomplete folder, malformed gate)."""
    try:
        done = finish(run.resolve(), gate_texts, inconclusive=inconclusive, saved_run=compare)
    except (IncompleteRun, GateError) as exc:
        out(f"ERROR: pytest-kvcache: {exc}")
        return 4
    out(f"report of {run}: " + ", ".join(p.name for p in done.written))
    for line in done.messages + summary_lines(done):
        out(line)
    return 1 if done.failed_gates else 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kvcache-report", description=__doc__)
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--fail", action="append", default=[], metavar="EXPR", help="a gate (repeatable)")
    parser.add_argument("--inconclusive", choices=("warn", "fail"), default="warn")
    parser.add_argument("--compare", type=Path, default=None, metavar="RUN_DIR", help="a stored run to compare with")
    args = parser.parse_args(argv)
    return rerender(args.run_dir, args.fail, inconclusive=args.inconclusive, compare=args.compare)


if __name__ == "__main__":
    sys.exit(main())
