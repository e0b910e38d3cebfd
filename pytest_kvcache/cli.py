"""``kvcache-report RUN_DIR``: rebuild a stored run's report and gates without booting anything.

The same pipeline and exit codes as the end of a run (``report.pipeline``): 0 ok, 1 a gate failed or the
A/B is CONFOUNDED, 3 the report could not be built, 4 bad input (a run folder, a gate). ``rerender`` is
also what ``pytest --kv-rerender=RUN_DIR`` runs.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from pytest_kvcache.report.options import ReportOptions


def rerender(run: Path, options: ReportOptions, out: Callable[[str], None] = print) -> int:
    """Rebuild a stored run's report with ``options``; print what a run's terminal summary prints; return
    the exit code. Without a noise run in ``options``, the one the run itself was judged against is used."""
    from pytest_kvcache.report.judge import EXIT_USAGE
    from pytest_kvcache.report.outputs.terminal import outcome_lines
    from pytest_kvcache.report.pipeline import ReportInputError, produce, stored_noise_run

    try:
        if options.noise is None:
            options = stored_noise_run(run, options)
        outcome = produce(run, options)
    except ReportInputError as exc:
        out(f"ERROR: pytest-kvcache: {exc}")
        return EXIT_USAGE
    for line in outcome_lines(outcome, rerender=True):
        out(line.text)
    return outcome.exit_code


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kvcache-report", description=__doc__)
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--fail", action="append", default=[], metavar="EXPR", help="a gate (repeatable)")
    parser.add_argument("--inconclusive", choices=("warn", "fail"), default="warn")
    parser.add_argument("--compare", type=Path, default=None, metavar="RUN_DIR", help="a stored run to compare with")
    parser.add_argument("--noise", type=Path, default=None, metavar="RUN_DIR", help="a stored A/A run (noise band)")
    parser.add_argument(
        "--allow-diff", action="append", default=[], metavar="PATH", help="an evidence path allowed to differ"
    )
    args = parser.parse_args(argv)
    options = ReportOptions(
        gates=tuple(args.fail),
        inconclusive=args.inconclusive,
        compare=args.compare,
        noise=args.noise,
        allow_diff=tuple(k.strip() for text in args.allow_diff for k in text.split(",") if k.strip()),
    )
    return rerender(args.run_dir.resolve(), options)


if __name__ == "__main__":
    sys.exit(main())
