"""``kvcache-report RUN_DIR``: rebuild a stored run's report and gates without booting anything.

The same pipeline and exit codes as the end of a run (``report.pipeline``): 0 ok, 1 a gate failed or the
A/B is CONFOUNDED, 3 the report could not be built, 4 bad input (a run folder, a gate). ``rerender`` is
also what ``pytest --kv-rerender=RUN_DIR`` runs.

``kvcache-report history``: the run store's trends, change points and breaks (a table, an HTML page;
``--gate`` exits 1 when the newest run starts a change point in the bad direction).
``kvcache-report store rebuild RUN_DIR…``: re-create history rows from run folders.
``kvcache-report store baselines``: list the stored baselines.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from pytest_kvcache import store
from pytest_kvcache.config import locations
from pytest_kvcache.finish import finish
from pytest_kvcache.jsonio import iter_run_folders
from pytest_kvcache.model.options import ReportOptions
from pytest_kvcache.report.judge import EXIT_INTERRUPTED, EXIT_USAGE
from pytest_kvcache.report.load import RunFolderError, read_meta
from pytest_kvcache.report.outputs.terminal import outcome_lines
from pytest_kvcache.report.pipeline import ReportInputError, produce
from pytest_kvcache.store import changepoint, history
from pytest_kvcache.store.record import row_of_folder


def rerender(run: Path, options: ReportOptions, out: Callable[[str], None] = print) -> int:
    """Rebuild a stored run's report with ``options``; print what a run's terminal summary prints; return
    the exit code. Without a noise run in ``options``, the one the run itself was judged against is used."""

    try:
        if options.noise is None:
            options = stored_noise_run(run, options)
        outcome = finish(produce(run, options), options, record=False)
    except ReportInputError as exc:
        out(f"ERROR: pytest-kvcache: {exc}")
        return EXIT_USAGE
    except KeyboardInterrupt:
        out(f"interrupted: the report of {run} may be incomplete; build it again with: kvcache-report {run}")
        return EXIT_INTERRUPTED
    for line in outcome_lines(outcome, rerender=True):
        out(line.text)
    return outcome.exit_code


def stored_noise_run(run: Path, options: ReportOptions) -> ReportOptions:
    """A re-render without ``--kv-noise`` is judged against the A/A run the run itself named, when that
    stored run is still there (``run.json``'s settings); a vanished one is a usage error."""

    try:
        meta = read_meta(run)
    except RunFolderError:
        return options  # produce() reports the folder's problem
    settings = meta.get("settings") or {}
    name, root, location = settings.get("noise"), settings.get("report_dir"), settings.get("store")
    if not name or not isinstance(root, str):
        return options
    noise = Path(root).parent / "baselines" / str(name)
    if isinstance(location, str) and location:
        try:
            with store.open_store(location) as opened:
                noise = opened.baseline(str(name)) or locations.baselines_dir_of(location) / str(name)
        except store.StoreError as exc:
            raise ReportInputError(f"{run} was judged against the A/A run {name!r} in a store: {exc}") from None
    if not (noise / "run.json").is_file():
        raise ReportInputError(f"{run} was judged against the A/A run {name!r}, which is gone ({noise})")
    return dataclasses.replace(options, noise=noise)


def _store_location(raw: str | None) -> str:
    if raw:
        return locations.normalise(raw, Path.cwd())
    env = os.environ.get("PYTEST_KVCACHE_STORE", "")
    return locations.normalise(env, Path.cwd()) if env else locations.default_location(os.environ)


def _add_store_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--store",
        default=None,
        metavar="PATH|URL",
        help="the run store (default: $PYTEST_KVCACHE_STORE, else $XDG_DATA_HOME/pytest-kvcache)",
    )


def history_main(argv: Sequence[str], out: Callable[[str], None] = print) -> int:
    """``kvcache-report history``: print the trend table, change points and breaks; write the HTML page."""
    parser = argparse.ArgumentParser(prog="kvcache-report history", description=history_main.__doc__)
    _add_store_option(parser)
    parser.add_argument("--metric", action="append", default=[], metavar="METRIC", help="only this metric")
    parser.add_argument("--probe", action="append", default=[], metavar="PROBE[@POINT]", help="only this probe")
    parser.add_argument("--arm", action="append", default=[], metavar="ARM", help="only this arm")
    parser.add_argument("--branch", default=None, help="only runs of this branch")
    parser.add_argument("--html", type=Path, default=Path("kvcache-history.html"), help="the page to write")
    parser.add_argument("--alpha", type=float, default=changepoint.ALPHA, help="significance level (default 0.005)")
    parser.add_argument(
        "--gate", action="store_true", help="exit 1 when the newest run starts a change point in the bad direction"
    )
    parser.add_argument("--min-shift", type=float, default=0.0, metavar="PCT", help="the gate ignores smaller shifts")
    args = parser.parse_args(list(argv))
    if not 0 < args.alpha < 1:
        out(f"ERROR: pytest-kvcache: --alpha must be between 0 and 1, got {args.alpha}")
        return EXIT_USAGE
    location = _store_location(args.store)
    try:
        store.check(location)
        with store.open_store(location) as opened:
            rows = opened.runs()
    except store.StoreError as exc:
        out(f"ERROR: pytest-kvcache: --store: {exc}")
        return EXIT_USAGE
    series = history.trends(
        rows, metrics=args.metric, probes=args.probe, arms=args.arm, branch=args.branch, alpha=args.alpha
    )
    if not series:
        out(f"history: no runs match in the store {locations.redact(location)} ({len(rows)} run(s) in it)")
        return 1 if args.gate else 0
    with __import__("pandas").option_context("display.width", 200, "display.max_columns", 12):
        out(history.table(series).to_string())
    for line in history.change_lines(series):
        out(line)
    results = history.gate(series, alpha=args.alpha, min_shift_pct=args.min_shift) if args.gate else []
    try:
        args.html.write_text(
            history.html_page(
                series, store=locations.redact(location), runs=len(rows), alpha=args.alpha, gates=results
            ),
            encoding="utf-8",
        )
    except OSError as exc:
        out(f"ERROR: pytest-kvcache: --html: cannot write {args.html}: {exc}")
        return EXIT_USAGE
    out(f"history page: {args.html.resolve()}")
    failed = [r for r in results if r.outcome == "fail"]
    for r in results:
        if r.outcome != "pass":
            out(f"history gate {r.outcome.upper()}: {r.series.label} — {r.reason}")
    if args.gate:
        out(
            f"history gate: {len(failed)} series regressed at the newest run: exit code 1"
            if failed
            else f"history gate: no regression at the newest run ({len(results)} series)"
        )
    return 1 if failed else 0


def store_main(argv: Sequence[str], out: Callable[[str], None] = print) -> int:
    """``kvcache-report store rebuild RUN_DIR…`` / ``kvcache-report store baselines``."""

    parser = argparse.ArgumentParser(prog="kvcache-report store", description=store_main.__doc__)
    sub = parser.add_subparsers(dest="action", required=True)
    rebuild = sub.add_parser("rebuild", help="re-create history rows from run folders (each, or each inside)")
    _add_store_option(rebuild)
    rebuild.add_argument("runs", nargs="+", type=Path, metavar="RUN_DIR")
    listing = sub.add_parser("baselines", help="list the stored baselines")
    _add_store_option(listing)
    args = parser.parse_args(list(argv))
    location = _store_location(args.store)
    try:
        store.check(location)
        opened = store.open_store(location)
    except store.StoreError as exc:
        out(f"ERROR: pytest-kvcache: --store: {exc}")
        return EXIT_USAGE
    with opened:
        if args.action == "baselines":
            try:
                entries = opened.baselines()
            except store.StoreError as exc:
                out(f"ERROR: pytest-kvcache: --store: {exc}")
                return EXIT_USAGE
            for entry in entries:
                out(f"{entry['name']}: run {entry['run_id']}")
            return 0

        folders: list[Path] = []
        for given in args.runs:
            if (given / "run.json").is_file():
                folders.append(given)
            elif given.is_dir() and any(iter_run_folders(given)):
                folders += list(iter_run_folders(given))
            else:
                out(f"ERROR: pytest-kvcache: {given} is neither a run folder nor a folder of run folders")
                return EXIT_USAGE
        added = 0
        for folder in folders:
            try:
                opened.add_run(row_of_folder(folder))
            except (RunFolderError, FileNotFoundError) as exc:
                out(f"skipped: {exc}")
                continue
            except store.StoreError as exc:
                out(f"ERROR: pytest-kvcache: {exc}")
                return EXIT_USAGE
            added += 1
        out(f"store: {added} run(s) recorded in {locations.redact(location)} ({len(folders) - added} skipped)")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    given = list(sys.argv[1:] if argv is None else argv)
    if given and given[0] in ("history", "store") and not (Path(given[0]) / "run.json").is_file():
        try:
            return history_main(given[1:]) if given[0] == "history" else store_main(given[1:])
        except KeyboardInterrupt:
            print(f"interrupted: kvcache-report {given[0]} stopped", file=sys.stderr)
            return 2
    parser = argparse.ArgumentParser(prog="kvcache-report", description=__doc__)
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--fail", action="append", default=[], metavar="EXPR", help="a gate (repeatable)")
    parser.add_argument("--inconclusive", choices=("warn", "fail"), default="warn")
    parser.add_argument("--compare", type=Path, default=None, metavar="RUN_DIR", help="a stored run to compare with")
    parser.add_argument("--noise", type=Path, default=None, metavar="RUN_DIR", help="a stored A/A run (noise band)")
    parser.add_argument(
        "--allow-diff", action="append", default=[], metavar="PATH", help="an evidence path allowed to differ"
    )
    args = parser.parse_args(given)
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
