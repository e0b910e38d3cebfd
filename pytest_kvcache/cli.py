"""``kvcache-report RUN_DIR``: rebuild a stored run's report and gates without booting anything."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from pytest_kvcache.analysis import IncompleteRun
from pytest_kvcache.finish import finish, summary_lines
from pytest_kvcache.gates import GateError
from pytest_kvcache.records import read_json


def rerender(
    run: Path,
    gate_texts: Sequence[str] = (),
    *,
    inconclusive: str = "warn",
    compare: Path | None = None,
    allow_diff: Sequence[str] = (),
    out: Callable[[str], None] = print,
) -> int:
    """Exit code: 0 ok, 1 a gate failed or the A/B is confounded, 4 bad input (incomplete folder, gate)."""
    try:
        noise = noise_run_of(run)
        done = finish(
            run.resolve(),
            gate_texts,
            inconclusive=inconclusive,
            saved_run=compare,
            noise_run=noise,
            allow_diff=allow_diff,
        )
    except (IncompleteRun, GateError) as exc:
        out(f"ERROR: pytest-kvcache: {exc}")
        return 4
    out(f"report of {run}: " + ", ".join(p.name for p in done.written))
    for line in done.messages + summary_lines(done):
        out(line)
    return 1 if done.failed_gates or done.confounded else 0


def noise_run_of(run: Path) -> Path | None:
    """The stored A/A run a run was judged against (``--kv-noise``), if it is still there."""
    path = run / "run.json"
    if not path.is_file():
        return None
    settings = read_json(path).get("settings") or {}
    if not settings.get("noise") or not settings.get("report_dir"):
        return None
    noise: Path = Path(settings["report_dir"]).parent / "baselines" / str(settings["noise"])
    if not (noise / "run.json").is_file():
        raise IncompleteRun(f"{run} was judged against the A/A run {settings['noise']!r}, which is gone ({noise})")
    return noise


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kvcache-report", description=__doc__)
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--fail", action="append", default=[], metavar="EXPR", help="a gate (repeatable)")
    parser.add_argument("--inconclusive", choices=("warn", "fail"), default="warn")
    parser.add_argument("--compare", type=Path, default=None, metavar="RUN_DIR", help="a stored run to compare with")
    parser.add_argument(
        "--allow-diff", action="append", default=[], metavar="PATH", help="an evidence path allowed to differ"
    )
    args = parser.parse_args(argv)
    return rerender(
        args.run_dir, args.fail, inconclusive=args.inconclusive, compare=args.compare, allow_diff=args.allow_diff
    )


if __name__ == "__main__":
    sys.exit(main())
