"""Faults and bad input, the way a user gets them wrong: every case runs the real CLI as a subprocess and
checks the exit code, a one-line headline that names the file, option or arm, that no traceback is
printed, and that no engine is left running (docs/errors.md lists what each looks like)."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from pytest_kvcache.engines.base import free_port
from pytest_kvcache.run.folder import read_records
from tests.plugin.conftest import STANDIN, kill_leftovers, latest, processes_with, spawn_pytest
from tests.procs import end_process


@dataclass(frozen=True)
class Case:
    id: str
    args: tuple[str, ...]
    exit: int
    headline: str  # fnmatch pattern of one line of stdout or stderr
    setup: Callable[[Path], None] = field(default=lambda path: None)
    standin: bool = False  # append the stand-in arguments


def _stored(
    path: Path, *, run_json: str | None = None, evidence: str | None = None, torn: bool = False, metrics: object = None
) -> None:
    """A small stored run folder at ``path/stored`` (one arm, three valid records; ``metrics`` replaces theirs)."""
    run = path / "stored"
    (run / "arms" / "auto").mkdir(parents=True)
    meta = {"run_id": "r1", "settings": {"arms": [{"name": "auto"}], "seed": 0}, "plan": [{"boot": "auto"}]}
    (run / "run.json").write_text(run_json if run_json is not None else json.dumps(meta))
    record = {"arm": "auto", "boot": "auto", "probe": "short", "shape": "code", "phase": "measured", "ok": True}
    lines = [json.dumps({**record, "index": i, "metrics": metrics or {"decode_tps": 100.0 + i}}) for i in range(3)]
    (run / "requests.jsonl").write_text("\n".join(lines) + ("\n" + lines[0][:25] if torn else "") + "\n")
    (run / "arms" / "auto" / "evidence.json").write_text(evidence if evidence is not None else '{"status": "stopped"}')


def _baseline(name: str, **kwargs: object) -> Callable[[Path], None]:
    def make(path: Path) -> None:
        _stored(path, **kwargs)  # type: ignore[arg-type]
        target = path / ".kvcache" / "baselines" / name
        target.parent.mkdir(parents=True)
        shutil.move(path / "stored", target)

    return make


def _legacy_run_json(name: str, text: str) -> Callable[[Path], None]:
    """An old ``.kvcache/baselines/NAME`` holding only a ``run.json`` of ``text``."""

    def make(path: Path) -> None:
        folder = path / ".kvcache" / "baselines" / name
        folder.mkdir(parents=True)
        (folder / "run.json").write_text(text)

    return make


def _legacy_file(name: str) -> Callable[[Path], None]:
    """An old ``.kvcache/baselines/NAME`` that is a file."""

    def make(path: Path) -> None:
        (path / ".kvcache" / "baselines").mkdir(parents=True)
        (path / ".kvcache" / "baselines" / name).write_text("not a run\n")

    return make


def _run_json(**changes: object) -> str:
    """The stored run's ``run.json`` with ``changes`` to its keys (``settings`` and ``plan`` among them)."""
    meta = {"run_id": "r1", "settings": {"arms": [{"name": "auto"}], "seed": 0}, "plan": [{"boot": "auto"}]}
    return json.dumps({**meta, **changes})


def _store_db(kind: str, baseline: str | None = None, rerender: bool = False) -> Callable[[Path], None]:
    """A run store at ``store/`` whose ``store.sqlite`` is ``garbage`` (not a database at all) or ``torn`` (a
    real one, its first page kept and every page after it overwritten: the header and schema still read), with
    the stored run ``baseline`` beside it (``store/baselines/NAME``, where a name is looked up first); and a run
    folder ``stored`` to re-render, with ``rerender``."""

    def make(path: Path) -> None:
        from pytest_kvcache.store.sqlite import SqliteStore
        from tests.unit.test_store import row

        folder = path / "store"
        if kind == "garbage":
            folder.mkdir()
            (folder / "store.sqlite").write_bytes(b"not a database\n" * 300)
        else:
            with SqliteStore(folder) as opened:
                for i in range(40):
                    opened.add_run(row(i, 100.0))
            db = folder / "store.sqlite"
            data = db.read_bytes()
            assert len(data) > 3 * 4096
            db.write_bytes(data[:4096] + b"\xa5" * (len(data) - 4096))
        if baseline is not None:
            _stored(path)
            (folder / "baselines").mkdir(exist_ok=True)
            shutil.move(path / "stored", folder / "baselines" / baseline)
        if rerender:
            _stored(path)

    return make


def _file(name: str) -> Callable[[Path], None]:
    return lambda path: (path / name).write_text("not a folder\n")


def _pyproject(text: str) -> Callable[[Path], None]:
    return lambda path: (path / "pyproject.toml").write_text(text)


def _model_folder(files: dict[str, str], name: str = "m") -> Callable[[Path], None]:
    """A model (or tokenizer) folder ``name`` holding ``files`` (name → text)."""

    def make(path: Path) -> None:
        (path / name).mkdir()
        for file, text in files.items():
            (path / name / file).write_text(text)

    return make


MISSING = "vllm_is_not_installed_here"

CASES = [
    Case(  # the budget rule reads the served model (the trained default, in float32), not the tiny model
        "budget-rule-reads-the-trained-default",
        ("--kv-model=embedded", "--kv-arms=auto", "--kv-cache-bytes=300MiB"),
        4,
        "ERROR: pytest-kvcache: arm auto: a KV budget of 300 MiB holds 6,826 tokens at 46,080 bytes a token (auto KV"
        " on float32 weights; SmolLM2-135M-Instruct: 30 layers × 3 KV heads × 64), fewer than max_model_len 8,192:"
        " give at least 365.6 MiB*",
    ),
    Case(
        "rerender-corrupt-run-json",
        ("--kv-rerender=stored",),
        4,
        "ERROR: pytest-kvcache: */stored/run.json: not valid JSON (the run's settings and plan)*",
        lambda p: _stored(p, run_json="{not json"),
    ),
    Case(
        "rerender-corrupt-evidence",
        ("--kv-rerender=stored",),
        4,
        "ERROR: pytest-kvcache: */stored/arms/auto/evidence.json: not valid JSON (boot auto's evidence)*",
        lambda p: _stored(p, evidence="{"),
    ),
    Case(
        "rerender-record-with-metrics-not-an-object",
        ("--kv-rerender=stored",),
        4,
        "ERROR: pytest-kvcache: */stored/requests.jsonl: record 1: 'metrics' must be an object",
        lambda p: _stored(p, metrics=[1]),
    ),
    Case(
        "rerender-names-a-file",
        ("--kv-rerender=notes.txt",),
        4,
        "ERROR: pytest-kvcache: */notes.txt: is a file, not a run folder",
        _file("notes.txt"),
    ),
    Case(
        "rerender-torn-record-is-counted",
        ("--kv-rerender=stored",),
        0,
        "note: 1 line(s) of requests.jsonl could not be read (torn by a killed run) and were skipped",
        lambda p: _stored(p, torn=True),
    ),
    Case(  # a re-render says what opening the store did, as a run does in its header
        "rerender-imports-an-old-baseline-and-says-so",
        ("--kv-rerender=stored", "--kv-compare=main", "--kv-store=store"),
        0,
        "kvcache: imported baseline 'main' from */.kvcache/baselines/main into the store */store",
        lambda p: [_baseline("main")(p), _stored(p)][-1],
    ),
    Case(
        "noise-baseline-corrupt",
        ("--kv-arms=auto,float16", "--kv-noise=aa"),
        4,
        "ERROR: pytest-kvcache: --kv-noise: */baselines/aa/run.json: not valid JSON*",
        _baseline("aa", run_json="[1,"),
    ),
    Case(
        "noise-legacy-baseline-with-only-a-corrupt-run-json",
        ("--kv-arms=auto,float16", "--kv-noise=aa"),
        4,
        "ERROR: pytest-kvcache: --kv-noise: */.kvcache/baselines/aa/run.json: not valid JSON "
        "(the run's settings and plan): Expecting property name enclosed in double quotes at line 1",
        _legacy_run_json("aa", "{not json"),
    ),
    Case(
        "noise-legacy-baseline-is-a-file",
        ("--kv-arms=auto,float16", "--kv-noise=aa"),
        4,
        "ERROR: pytest-kvcache: --kv-noise: */.kvcache/baselines/aa: is a file, not a stored run (--kv-noise)",
        _legacy_file("aa"),
    ),
    Case(
        "noise-baseline-nowhere-names-both-places",
        ("--kv-arms=auto,float16", "--kv-noise=aa"),
        4,
        "ERROR: pytest-kvcache: --kv-noise: no stored run 'aa' in */pytest-kvcache/baselines or */.kvcache/baselines*",
    ),
    Case(
        "compare-baseline-corrupt-evidence",
        ("--kv-arms=auto,float16", "--kv-compare=old"),
        4,
        "ERROR: pytest-kvcache: --kv-compare: */baselines/old/arms/auto/evidence.json: not valid JSON*",
        _baseline("old", evidence="nope"),
    ),
    Case(  # a run folder of another version, or edited by hand: each field the loader reads has its type
        "rerender-settings-not-an-object",
        ("--kv-rerender=stored",),
        4,
        "ERROR: pytest-kvcache: */stored/run.json: 'settings' must be an object, got a number",
        lambda p: _stored(p, run_json=_run_json(settings=3)),
    ),
    Case(
        "rerender-arms-not-objects",
        ("--kv-rerender=stored",),
        4,
        "ERROR: pytest-kvcache: */stored/run.json: 'settings.arms[[]0]' must be an object, got a string",
        lambda p: _stored(p, run_json=_run_json(settings={"arms": ["auto"], "seed": 0})),
    ),
    Case(
        "rerender-plan-an-object",
        ("--kv-rerender=stored",),
        4,
        "ERROR: pytest-kvcache: */stored/run.json: 'plan' must be a list, got an object",
        lambda p: _stored(p, run_json=_run_json(plan={"boot": "auto"})),
    ),
    Case(
        "rerender-evidence-log-a-list",
        ("--kv-rerender=stored",),
        4,
        "ERROR: pytest-kvcache: */stored/arms/auto/evidence.json: 'log' must be an object, got a list",
        lambda p: _stored(p, evidence='{"status": "stopped", "log": [1]}'),
    ),
    Case(
        "rerender-record-metric-a-string",
        ("--kv-rerender=stored",),
        4,
        "ERROR: pytest-kvcache: */stored/requests.jsonl: record 1: 'metrics.decode_tps' must be a number or null, "
        "got a string",
        lambda p: _stored(p, metrics={"decode_tps": "fast"}),
    ),
    Case(
        "compare-baseline-seed-a-string",
        ("--kv-arms=auto", "--kv-compare=old"),
        4,
        "ERROR: pytest-kvcache: --kv-compare: */baselines/old/run.json: 'settings.seed' must be an integer, "
        "got a string",
        _baseline("old", run_json=_run_json(settings={"arms": [{"name": "auto"}], "seed": "0"})),
        standin=True,  # unchecked, the run would go on: on the stand-in, not a real engine
    ),
    Case(
        "report-dir-is-a-file",
        ("--kv-arms=auto", "--kv-report-dir=out"),
        4,
        "ERROR: pytest-kvcache: --kv-report-dir: */out is a file, not a folder",
        _file("out"),
    ),
    Case(
        "report-dir-under-a-file",
        ("--kv-arms=auto", "--kv-report-dir=out/runs"),
        4,
        "ERROR: pytest-kvcache: --kv-report-dir: */out/runs is under */out, which is a file",
        _file("out"),
    ),
    Case(
        "report-dir-unwritable",  # os.access says yes to root: only creating it tells
        ("--kv-arms=auto", "--kv-report-dir=/sys/x/runs"),
        4,
        "ERROR: pytest-kvcache: --kv-report-dir: cannot create /sys/x/runs: *",
    ),
    Case(
        "save-into-an-unwritable-store",
        ("--kv-arms=auto", "--kv-store=/sys/x/store", "--kv-save=base"),
        4,
        "ERROR: pytest-kvcache: --kv-save: the run store: cannot create /sys/x/store/baselines: *",
    ),
    Case(  # once, the run completed and then failed with exit 3 blaming the report
        "save-into-a-store-whose-database-is-garbage",
        ("--kv-arms=auto", "--kv-store=store", "--kv-save=base"),
        4,
        "ERROR: pytest-kvcache: --kv-save: the run store: */store/store.sqlite: not a readable run store database "
        "(file is not a database); move it aside*",
        _store_db("garbage"),
        standin=True,
    ),
    Case(
        "save-into-a-torn-store",
        ("--kv-arms=auto", "--kv-store=store", "--kv-save=base"),
        4,
        "ERROR: pytest-kvcache: --kv-save: the run store: */store/store.sqlite: not a readable run store database "
        "(database disk image is malformed)*",
        _store_db("torn"),
        standin=True,
    ),
    Case(
        "rerender-saved-into-a-torn-store",
        ("--kv-rerender=stored", "--kv-store=store", "--kv-save=base"),
        4,
        "ERROR: pytest-kvcache: --kv-save: the run store: */store/store.sqlite: not a readable run store database*",
        _store_db("torn", rerender=True),
    ),
    Case(
        "compare-from-a-torn-store",
        ("--kv-arms=auto", "--kv-store=store", "--kv-compare=old"),
        4,
        "ERROR: pytest-kvcache: --kv-compare: the run store: */store/store.sqlite: not a readable run store "
        "database (database disk image is malformed)*",
        _store_db("torn", baseline="old"),
        standin=True,
    ),
    Case(
        "noise-from-a-garbage-store",
        ("--kv-arms=auto,float16", "--kv-store=store", "--kv-noise=aa"),
        4,
        "ERROR: pytest-kvcache: --kv-noise: the run store: */store/store.sqlite: not a readable run store database*",
        _store_db("garbage", baseline="aa"),
        standin=True,
    ),
    Case(
        "model-is-a-file",
        ("--kv-arms=auto", "--kv-model=./weights.bin"),
        4,
        "ERROR: pytest-kvcache: --kv-model: './weights.bin' is a file; give the model's folder*",
        _file("weights.bin"),
    ),
    Case(
        "two-endpoints-for-one-arm",
        (
            "--kv-arms=auto",
            "--kv-launcher=external",
            "--kv-endpoint=auto=http://127.0.0.1:1",
            "--kv-endpoint=auto=http://127.0.0.1:2",
        ),
        4,
        "ERROR: pytest-kvcache: --kv-endpoint: arm 'auto' is given two endpoints (http://127.0.0.1:1 and *:2)*",
    ),
    Case(
        "unterminated-quote-in-a-named-arm",
        ("--kv-arms=bad",),
        4,
        "ERROR: pytest-kvcache: [[]tool.pytest_kvcache.arms.bad]: args: cannot split*",
        _pyproject('[tool.pytest_kvcache.arms.bad]\nkv_cache_dtype = "auto"\nargs = "--max-num-seqs \'4"\n'),
    ),
    Case(
        "gate-on-an-unknown-probe",
        ("--kv-arms=auto", "--kv-fail=decode_tps[nope]: >= 1"),
        4,
        "ERROR: pytest-kvcache: --kv-fail: gate * unknown probe 'nope'; "
        "known: short, prefill, agentic, concurrency, fidelity, capacity, retrieval",
        standin=True,
    ),
    Case(
        "engine-module-missing",
        (
            "--kv-arms=auto",
            f"--kv-engine-cmd={sys.executable} -m vllm_is_not_installed_here.entrypoints.openai.api_server",
        ),
        1,
        "*auto: engine exited with code 1 during startup after * s (*): "
        "ModuleNotFoundError: No module named 'vllm_is_not_installed_here'",
        standin=True,
    ),
    Case(
        "explicit-depth-beyond-the-engines-context",
        ("--kv-arms=auto", "--kv-depths=9k", "-m", "prefill"),
        1,
        "*auto: --kv-depths: 9k + 16 output tokens cannot fit the context of 8,192 tokens (max_model_len of "
        "auto's engine); give depths up to 8,176",
        standin=True,
    ),
    Case(
        "every-probe-skipped-says-why",
        ("--kv-arms=auto", "--kv-engine=openai", "-m", "fidelity"),
        0,
        "note: 4 probe test(s) skipped: test_fidelity[[]auto-prose]: fidelity prose on auto: a generic "
        "OpenAI-compatible server gives no prompt logprobs over token ids*",
        standin=True,
    ),
    # issue 45, round 3: every depth option beyond a known context is a usage error (was: "1 skipped", exit 0)
    Case(
        "capacity-depth-beyond-the-trained-defaults-context",
        ("--kv-arms=auto", "--kv-model=embedded", "--kv-capacity-depths=16k"),
        4,
        "ERROR: pytest-kvcache: --kv-capacity-depths: 16k + 16 output tokens (--kv-capacity-max-tokens) cannot fit "
        "the context of 8,192 tokens (the embedded smollm2-135m's context); give depths up to 8,176",
    ),
    Case(
        "capacity-depth-beyond-max-model-len-in-the-engine-args",
        (
            "--kv-arms=auto",
            "--kv-model=embedded:tiny-qwen3",
            "--kv-engine-args=--max-model-len 2048",
            "--kv-capacity-depths=1k,4k",
        ),
        4,
        "ERROR: pytest-kvcache: --kv-capacity-depths: 4k + 16 output tokens (--kv-capacity-max-tokens) cannot fit "
        "the context of 2,048 tokens (--max-model-len 2048); give depths up to 2,032",
    ),
    Case(
        "capacity-max-tokens-beyond-the-context",
        ("--kv-arms=auto", "--kv-model=embedded", "--kv-capacity-max-tokens=9000"),
        4,
        "ERROR: pytest-kvcache: --kv-capacity-max-tokens=9000 cannot fit the context of 8,192 tokens*",
    ),
    # every count option has an upper bound, checked when it is read
    Case(
        "capacity-max-sessions-beyond-its-bound",
        ("--kv-arms=auto", "--kv-capacity-start=100000", "--kv-capacity-max-sessions=200000"),
        4,
        "ERROR: pytest-kvcache: --kv-capacity-max-sessions: expected a whole number from 1 to 4,096, got '200000'",
    ),
    Case(
        "capacity-start-alone-beyond-its-bound",
        ("--kv-arms=auto", "--kv-capacity-start=100000"),
        4,
        "ERROR: pytest-kvcache: --kv-capacity-start: expected a whole number from 1 to 4,096, got '100000'",
    ),
    Case(
        "max-replicates-beyond-its-bound",
        ("--kv-arms=auto", "--kv-max-replicates=1000000", "--kv-fail=ttft_s[short]: <= 5"),
        4,
        "ERROR: pytest-kvcache: --kv-max-replicates: expected a whole number from 1 to 40, got '1000000'",
    ),
    Case(
        "runs-beyond-its-bound",
        ("--kv-arms=auto", "--kv-runs=100000"),
        4,
        "ERROR: pytest-kvcache: --kv-runs: expected a whole number from 1 to 1,000, got '100000'",
    ),
    # a gate is never silently dropped: a usage error before any boot where the run's shape is known then …
    Case(
        "baseline-gate-with-one-arm",
        ("--kv-arms=auto", "--kv-fail=ttft_s[short]: <= +10%"),
        4,
        "ERROR: pytest-kvcache: --kv-fail: gate 'ttft_s[[]short]: <= +10%' cannot be evaluated: it compares every "
        "other arm with the baseline arm 'auto', and the run has no second arm; give one (--kv-arms=auto,OTHER)*",
    ),
    Case(
        "gate-on-a-depth-not-in-the-run",
        ("--kv-arms=auto,float16", "--kv-fail=ttft_s[prefill@32k]: <= +10%"),
        4,
        "ERROR: pytest-kvcache: --kv-fail: gate 'ttft_s[[]prefill@32k]: <= +10%' cannot be evaluated: prefill has "
        "no point 32k in this run (its points: 4k, 16k)",
    ),
    Case(
        "gate-on-a-probe-not-selected",
        ("--kv-arms=auto,float16", "--kv-fail=ttft_s[prefill]: <= +10%", "-m", "short"),
        4,
        "ERROR: pytest-kvcache: --kv-fail: gate 'ttft_s[[]prefill]: <= +10%' cannot be evaluated: no prefill test "
        "is selected (-m, -k)",
        standin=True,
    ),
    # … else an error among the gates, which fails the run (exit 1)
    Case(
        "rerender-gate-on-a-metric-never-measured",
        ("--kv-rerender=stored", "--kv-fail=ttft_s[short]: <= 5"),
        1,
        "gate ERROR: ttft_s[[]short]: <= 5 — value –, needs <= 5 — cannot be evaluated: no short sample of this run "
        "has ttft_s (never measured)",
        lambda p: _stored(p),
    ),
    Case(
        "rerender-gate-on-a-probe-that-never-ran",
        ("--kv-rerender=stored", "--kv-fail=decode_tps[prefill]: >= 1"),
        1,
        "gate ERROR: decode_tps[[]prefill]: >= 1 — * cannot be evaluated: no prefill test ran in this run*",
        lambda p: _stored(p),
    ),
    Case(
        "rerender-gate-on-a-point-not-in-the-run",
        ("--kv-rerender=stored", "--kv-fail=decode_tps[short@narrative]: >= 1"),
        1,
        "gate ERROR: * cannot be evaluated: short has no point narrative in this run (its points: code)",
        lambda p: _stored(p),
    ),
    # model metadata of the wrong shape: a usage error naming the file, never an INTERNALERROR
    Case(
        "model-config-is-a-list",
        ("--kv-arms=auto", "--kv-model=./m"),
        4,
        "ERROR: pytest-kvcache: --kv-model: */m/config.json: expected a JSON object, got a list",
        _model_folder({"config.json": "[1, 2]"}),
    ),
    Case(
        "model-config-layers-a-string",
        ("--kv-arms=auto", "--kv-model=./m"),
        4,
        "ERROR: pytest-kvcache: --kv-model: */m/config.json: num_hidden_layers must be a positive whole number, "
        'got "30"',
        _model_folder({"config.json": '{"num_hidden_layers": "30", "max_position_embeddings": 8192}'}),
    ),
    Case(
        "model-generation-config-temperature-a-string",
        ("--kv-arms=auto", "--kv-model=./m"),
        4,
        'ERROR: pytest-kvcache: --kv-model: */m/generation_config.json: temperature must be a number, got "hot"',
        _model_folder({"config.json": "{}", "generation_config.json": '{"temperature": "hot"}'}),
    ),
    Case(
        "tokenizer-config-is-a-list",
        ("--kv-arms=auto", "--kv-engine=openai", "--kv-engine-cmd=true", "--kv-tokenizer=./t"),
        4,
        "ERROR: pytest-kvcache: --kv-tokenizer: */t/tokenizer_config.json: expected a JSON object, got a list",
        _model_folder({"tokenizer_config.json": "[]"}, "t"),
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_gets_a_headline_and_the_right_exit(
    pytester: pytest.Pytester, standin_args: list[str], tag: str, case: Case
) -> None:
    case.setup(pytester.path)
    args = list(case.args)
    if case.standin:
        base = [a for a in standin_args if a not in ("-m", "short")]
        if "-m" not in args:
            base += ["-m", "short or prefill"]
        if any(a.startswith("--kv-engine-cmd") for a in args):
            base = [a for a in base if not a.startswith("--kv-engine-cmd")]
        args = [*base, *args]
    result = pytester.runpytest_subprocess(*args)
    output = result.stdout.lines + result.stderr.lines
    assert result.ret == case.exit, "\n".join(output)
    from _pytest.pytester import LineMatcher

    LineMatcher(output).fnmatch_lines([case.headline])
    assert "Traceback" not in "\n".join(output)
    assert not processes_with(tag)


def test_kvcache_report_on_a_corrupt_folder_is_a_usage_error(tmp_path: Path) -> None:
    _stored(tmp_path, run_json="{")
    done = subprocess.run(
        [sys.executable, "-m", "pytest_kvcache.cli", str(tmp_path / "stored")], capture_output=True, text=True
    )
    assert done.returncode == 4
    assert done.stdout.startswith(f"ERROR: pytest-kvcache: {tmp_path / 'stored' / 'run.json'}: not valid JSON")
    assert "Traceback" not in done.stdout + done.stderr


def _edited_history_row(path: Path) -> None:
    """A sound store whose history row of run003 was edited by hand: its ``points`` a number."""
    import sqlite3

    from pytest_kvcache.store.sqlite import SqliteStore
    from tests.unit.test_store import row

    with SqliteStore(path / "store") as opened:
        for i in range(5):
            opened.add_run(row(i, 100.0))
    with sqlite3.connect(path / "store" / "store.sqlite") as db:
        db.execute("UPDATE runs SET row_json = ? WHERE run_id = 'run003'", (json.dumps({**row(3, 1.0), "points": 7}),))
    db.close()


def _judged_against_a_noise_run_in(store_db: Callable[[Path], None]) -> Callable[[Path], None]:
    """A stored run that was judged against the A/A run ``aa`` of the run store ``store/``, made by ``store_db``."""

    def make(path: Path) -> None:
        settings = {"arms": [{"name": "auto"}], "seed": 0, "noise": "aa", "store": str(path / "store")}
        _stored(path, run_json=_run_json(settings={**settings, "report_dir": str(path / ".kvcache" / "runs")}))
        store_db(path)

    return make


def _with_report_json(text: str) -> Callable[[Path], None]:
    """A stored run whose ``report.json`` is ``text``."""

    def make(path: Path) -> None:
        _stored(path)
        (path / "stored" / "report.json").write_text(text)

    return make


TORN = "database disk image is malformed"
GARBAGE = "file is not a database"

#: ``kvcache-report`` run as a user runs it; ``{tmp}`` in an argument is the test's folder
CLI_CASES = [
    Case(  # once, an AttributeError traceback
        "report-settings-a-number",
        ("{tmp}/stored",),
        4,
        "ERROR: pytest-kvcache: */stored/run.json: 'settings' must be an object, got a number",
        lambda p: _stored(p, run_json=_run_json(settings=3)),
    ),
    Case(
        "report-arms-a-string",
        ("{tmp}/stored",),
        4,
        "ERROR: pytest-kvcache: */stored/run.json: 'settings.arms' must be a list, got a string",
        lambda p: _stored(p, run_json=_run_json(settings={"arms": "auto", "seed": 0})),
    ),
    Case(
        "report-probes-not-objects",
        ("{tmp}/stored",),
        4,
        "ERROR: pytest-kvcache: */stored/run.json: 'probes[[]0]' must be an object, got a number",
        lambda p: _stored(p, run_json=_run_json(probes=[1])),
    ),
    Case(
        "report-evidence-cache-config-a-string",
        ("{tmp}/stored",),
        4,
        "ERROR: pytest-kvcache: */stored/arms/auto/evidence.json: 'cache_config' must be an object or null, got a "
        "string",
        lambda p: _stored(p, evidence='{"status": "stopped", "cache_config": "fp8"}'),
    ),
    Case(
        "report-judged-against-a-noise-run-in-a-torn-store",
        ("{tmp}/stored",),
        4,
        "ERROR: pytest-kvcache: */stored was judged against the A/A run 'aa' in a store: */store/store.sqlite: not a "
        f"readable run store database ({TORN})*",
        _judged_against_a_noise_run_in(_store_db("torn")),
    ),
    Case(  # once, a sqlite3.DatabaseError traceback
        "history-torn-store",
        ("history", "--store={tmp}/store"),
        4,
        f"ERROR: pytest-kvcache: --store: */store/store.sqlite: not a readable run store database ({TORN}); "
        "move it aside*",
        _store_db("torn"),
    ),
    Case(
        "history-garbage-store",
        ("history", "--store={tmp}/store"),
        4,
        f"ERROR: pytest-kvcache: --store: */store/store.sqlite: not a readable run store database ({GARBAGE})*",
        _store_db("garbage"),
    ),
    Case(
        "history-row-edited-by-hand",
        ("history", "--store={tmp}/store"),
        4,
        "ERROR: pytest-kvcache: --store: */store/store.sqlite: the history row of run run003: 'points' must be a "
        "list, got a number",
        _edited_history_row,
    ),
    Case(
        "store-baselines-torn-store",
        ("store", "baselines", "--store={tmp}/store"),
        4,
        f"ERROR: pytest-kvcache: --store: */store/store.sqlite: not a readable run store database ({TORN})*",
        _store_db("torn", baseline="main"),
    ),
    Case(
        "store-baselines-garbage-store",
        ("store", "baselines", "--store={tmp}/store"),
        4,
        f"ERROR: pytest-kvcache: --store: */store/store.sqlite: not a readable run store database ({GARBAGE})*",
        _store_db("garbage"),
    ),
    Case(
        "store-rebuild-into-a-torn-store",
        ("store", "rebuild", "--store={tmp}/store", "{tmp}/stored"),
        4,
        f"ERROR: pytest-kvcache: --store: */store/store.sqlite: not a readable run store database ({TORN})*",
        _store_db("torn", rerender=True),
    ),
    Case(  # a rebuild skips a folder it cannot read, as it skips one without a report.json, and goes on
        "store-rebuild-report-json-arms-an-object",
        ("store", "rebuild", "--store={tmp}/store", "{tmp}/stored"),
        0,
        "skipped: */stored/report.json: 'arms' must be a list, got an object",
        _with_report_json('{"arms": {"name": "auto"}, "summary": []}'),
    ),
    Case(
        "store-rebuild-report-json-summary-row-without-its-metric",
        ("store", "rebuild", "--store={tmp}/store", "{tmp}/stored"),
        0,
        "skipped: */stored/report.json: 'summary[[]0].metric' is missing",
        _with_report_json('{"summary": [{"probe": "short", "point": "code", "arm": "auto", "mean": 1.0}]}'),
    ),
]


@pytest.mark.parametrize("case", CLI_CASES, ids=[c.id for c in CLI_CASES])
def test_kvcache_report_on_bad_input_gets_a_headline_and_the_right_exit(tmp_path: Path, case: Case) -> None:
    case.setup(tmp_path)
    args = [a.replace("{tmp}", str(tmp_path)) for a in case.args]
    done = subprocess.run(
        [sys.executable, "-m", "pytest_kvcache.cli", *args], capture_output=True, text=True, cwd=tmp_path, timeout=120
    )
    output = (done.stdout + done.stderr).splitlines()
    assert done.returncode == case.exit, "\n".join(output)
    from _pytest.pytester import LineMatcher

    LineMatcher(output).fnmatch_lines([case.headline])
    assert "Traceback" not in done.stdout + done.stderr


# ------------------------------------------------------------------------------------ external endpoints


@pytest.fixture
def external(tag: str) -> Iterator[str]:
    """A stand-in started by hand, as a user starts a server for ``--kv-launcher=external``."""
    port = free_port()
    cmd = [*STANDIN.split(), "--model", "served-model", "--port", str(port), tag]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:  # urllib, not httpx: pytester's sys.modules restore can split httpx from httpcore's exceptions
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=1) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}"
    finally:
        end_process(proc)


def _external_args(standin_args: list[str]) -> list[str]:
    return [a for a in standin_args if not a.startswith(("--kv-engine-cmd", "--kv-engine-args"))]


def test_an_openai_base_url_with_v1_is_accepted(
    pytester: pytest.Pytester, standin_args: list[str], external: str
) -> None:
    result = pytester.runpytest_subprocess(
        *_external_args(standin_args), "--kv-arms=auto", "--kv-launcher=external", f"--kv-endpoint=auto={external}/v1"
    )
    assert result.ret == 0, result.stdout.str()
    result.stdout.fnmatch_lines(["kvcache boot plan — launcher external, model as served by each --kv-endpoint:"])
    run = json.loads((latest(pytester) / "run.json").read_text())
    assert run["model"] == "served-model"
    report = json.loads((latest(pytester) / "report.json").read_text())
    assert report["model"] == "served-model"


def test_a_model_the_server_does_not_serve_is_refused(
    pytester: pytest.Pytester, standin_args: list[str], external: str
) -> None:
    result = pytester.runpytest_subprocess(
        *_external_args(standin_args),
        "--kv-arms=auto",
        "--kv-launcher=external",
        f"--kv-endpoint=auto={external}",
        "--kv-model=org/other-model",
    )
    assert result.ret == 1
    result.stdout.fnmatch_lines(
        [
            "*auto: --kv-model=org/other-model but the server at * serves served-model; "
            "pass --kv-model=served-model or leave --kv-model out to use it*"
        ]
    )
    assert not read_records(latest(pytester) / "requests.jsonl")


def test_a_depth_beyond_the_engine_args_context_is_a_usage_error_before_any_boot(
    pytester: pytest.Pytester, standin_args: list[str], tag: str
) -> None:
    """``--max-model-len 2000`` in the engine arguments is the context known before any boot: an explicit
    3k depth cannot fit it, and nothing boots (once, a calibration request then got HTTP 400)."""
    engine = [a for a in standin_args if not a.startswith("--kv-engine-args")]
    engine.append(f"--kv-engine-args={tag} --standin-no-tokenize --standin-short-context --max-model-len 2000")
    engine = [a for a in engine if a not in ("-m", "short")]
    result = pytester.runpytest_subprocess(*engine, "--kv-arms=auto", "--kv-depths=3k", "-m", "prefill")
    assert result.ret == 4, result.stdout.str()
    result.stderr.fnmatch_lines(
        [
            "ERROR: pytest-kvcache: --kv-depths: 3k + 16 output tokens cannot fit the context of 2,000 tokens "
            "(--max-model-len 2000)*"
        ]
    )
    assert "Traceback" not in result.stdout.str() + result.stderr.str()
    assert not (pytester.path / ".kvcache").exists() and not processes_with(tag)


@pytest.fixture
def external_2048(tag: str) -> Iterator[str]:
    """A stand-in started by hand whose max_model_len is 2048 (advertised in /v1/models, as vLLM does)."""
    port = free_port()
    cmd = [*STANDIN.split(), "--model", "served-model", "--port", str(port), "--max-model-len", "2048", tag]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert _wait_for(lambda: _answers(f"http://127.0.0.1:{port}/v1/models"), 20), "the stand-in never answered"
        yield f"http://127.0.0.1:{port}"
    finally:
        end_process(proc)


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as answer:
            return bool(answer.status == 200)
    except OSError:
        return False


@pytest.mark.parametrize(
    ("option", "headline"),
    [
        (
            "--kv-capacity-depths=4k",
            "*auto: --kv-capacity-depths: 4k + 64 output tokens (--kv-capacity-max-tokens) cannot fit the context of "
            "2,048 tokens (max_model_len of auto's engine); give depths up to 1,984",
        ),
        (
            "--kv-fidelity-depths=1k,3k",
            "*auto: --kv-fidelity-depths: 3k + 1 output token cannot fit the context of 2,048 tokens (max_model_len "
            "of auto's engine); give depths up to 2,047",
        ),
    ],
)
def test_an_explicit_depth_beyond_an_external_servers_context_fails_before_any_request(
    pytester: pytest.Pytester, standin_args: list[str], external_2048: str, option: str, headline: str
) -> None:
    """An external server's context is known only once it is asked (its max_model_len, at the first boot): an
    explicit depth of any probe beyond it fails that boot before any request, as --kv-depths does (was: the
    capacity test skipped, "1 skipped", exit 0)."""
    args = [a for a in _external_args(standin_args) if a not in ("-m", "short")]
    result = pytester.runpytest_subprocess(
        *args, "--kv-arms=auto", "--kv-launcher=external", f"--kv-endpoint=auto={external_2048}", option, "-m", "short"
    )
    output = result.stdout.lines + result.stderr.lines
    assert result.ret == 1, "\n".join(output)
    from _pytest.pytester import LineMatcher

    LineMatcher(output).fnmatch_lines([headline])
    assert not read_records(latest(pytester) / "requests.jsonl")


def test_an_unwritable_job_summary_is_a_warning_not_an_internal_error(
    pytester: pytest.Pytester, standin_args: list[str], tag: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", "/sys/x/summary.md")
    result = pytester.runpytest_subprocess(*standin_args, "--kv-arms=auto")
    output = result.stdout.lines + result.stderr.lines
    assert result.ret == 0, "\n".join(output)
    result.stdout.fnmatch_lines(["warning: GITHUB_STEP_SUMMARY: cannot append to /sys/x/summary.md: *"])
    assert "Traceback" not in "\n".join(output) and "INTERNALERROR" not in "\n".join(output)
    assert not processes_with(tag)


# ------------------------------------------------------------------------------------ signals and timeouts


def _wait_for(predicate: Callable[[], bool], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def _interrupt(
    pytester: pytest.Pytester, args: list[str], tag: str, ready: Callable[[], bool], sigints: int
) -> tuple[int, str, float]:
    """Start pytest, wait until ``ready()``, send ``sigints`` Ctrl-Cs half a second apart; return its exit
    code, output and how long it took to end after the last one. Nothing is left behind either way."""
    proc = spawn_pytest(pytester, *args, new_session=True)
    try:
        assert _wait_for(ready, 60), "the run never got to the point to interrupt"
        for _ in range(sigints):
            time.sleep(0.5)  # the first one: mid-boot or mid-run; the next: during the engine's SIGTERM grace
            proc.send_signal(signal.SIGINT)
        started = time.monotonic()
        out, _ = proc.communicate(timeout=30)
        took = time.monotonic() - started
    finally:
        kill_leftovers(proc, tag)
    return proc.returncode, out.decode(), took


def test_a_second_ctrl_c_leaves_nothing_running(pytester: pytest.Pytester, standin_args: list[str], tag: str) -> None:
    """The stand-in ignores SIGTERM and has a child that ignores it too: only SIGKILL of the group ends them."""
    slow = [a for a in standin_args if not a.startswith(("--kv-engine-args", "--kv-runs"))]
    args = [
        *slow,
        "--kv-arms=auto",
        "--kv-runs=500",
        f"--kv-engine-args={tag} --standin-ignore-sigterm --standin-spawn-child",
    ]
    requests = pytester.path / ".kvcache" / "runs" / "latest" / "requests.jsonl"  # latest() resolves too early

    def measuring() -> bool:
        return requests.exists() and len(read_records(requests)) >= 1 and len(processes_with(tag)) >= 2

    code, out, took = _interrupt(pytester, args, tag, measuring, sigints=2)
    assert code == pytest.ExitCode.INTERRUPTED, out
    assert took < 12, f"the second Ctrl-C took {took:.1f} s to end the run"
    assert _wait_for(lambda: not processes_with(tag), 5), f"left running: {processes_with(tag)}"
    assert "Traceback" not in out


def test_a_second_ctrl_c_while_the_run_winds_down_exits_2_with_the_one_line(
    pytester: pytest.Pytester, standin_args: list[str], tag: str
) -> None:
    """The first Ctrl-C comes while the run's last boot is being stopped (the engine ignores SIGTERM: a 20 s
    grace) and kills it at once; the second comes while pytest winds down (when the run's one line is printed,
    well within what would have been the grace). Exit 2 and the one line, as for a single Ctrl-C: not exit 130
    and a traceback."""
    engine = [a for a in standin_args if not a.startswith("--kv-engine-args")]
    args = [
        *engine,
        "--kv-arms=auto",
        "--kv-no-agreement",  # the engine's stop begins right after the last probe
        f"--kv-engine-args={tag} --standin-ignore-sigterm --standin-spawn-child",
    ]
    requests = pytester.path / ".kvcache" / "runs" / "latest" / "requests.jsonl"
    proc = spawn_pytest(pytester, *args, new_session=True)
    assert proc.stdout is not None
    lines: list[bytes] = []
    try:  # short: 2 shapes of 1 warmup + 2 measured requests, then the stop
        assert _wait_for(lambda: requests.exists() and len(read_records(requests)) >= 6, 60), "no 6 records"
        time.sleep(1.0)
        proc.send_signal(signal.SIGINT)
        first = time.monotonic()
        for line in proc.stdout:
            lines.append(line)
            if line.startswith(b"interrupted: "):
                proc.send_signal(signal.SIGINT)
                break
        out, _ = proc.communicate(timeout=30)
        took = time.monotonic() - first
    finally:
        kill_leftovers(proc, tag)
    text = b"".join(lines).decode() + out.decode()
    assert proc.returncode == pytest.ExitCode.INTERRUPTED, text
    from _pytest.pytester import LineMatcher

    LineMatcher(text.splitlines()).fnmatch_lines(
        ["interrupted: 6 record(s) kept; build the report with: kvcache-report *"]
    )
    assert "Traceback" not in text
    assert took < 15, f"Ctrl-C took {took:.1f} s to end the run (the engine's grace is 20 s)"
    assert _wait_for(lambda: not processes_with(tag), 5), f"left running: {processes_with(tag)}"


def test_ctrl_c_during_a_boot_returns_within_5_s(pytester: pytest.Pytester, standin_args: list[str], tag: str) -> None:
    slow = [a for a in standin_args if not a.startswith("--kv-engine-args")]
    args = [*slow, "--kv-arms=auto", f"--kv-engine-args={tag} --standin-startup-delay=60 --standin-ignore-sigterm"]
    code, out, took = _interrupt(pytester, args, tag, lambda: bool(processes_with(tag)), sigints=1)
    assert code == pytest.ExitCode.INTERRUPTED, out
    assert took < 5, f"Ctrl-C during the boot took {took:.1f} s"
    assert not processes_with(tag)


def test_a_server_that_never_answers_fails_after_the_stall_timeout(
    pytester: pytest.Pytester, standin_args: list[str], tag: str
) -> None:
    """A server that takes every request and sends nothing, not even headers: vLLM answers with headers at once,
    so each probe's first request fails as no_response after the stall timeout (2 s) — not after the first-token
    limit (120 s by default) — is recorded, and the probe sends it nothing more; the run ends."""
    engine = [a for a in standin_args if not a.startswith("--kv-engine-args")]
    args = [*engine, "--kv-arms=auto", "--kv-stall-timeout=2", f"--kv-engine-args={tag} --standin-hang"]
    started = time.monotonic()
    result = pytester.runpytest_subprocess(*args, timeout=120)
    took = time.monotonic() - started
    output = result.stdout.lines + result.stderr.lines
    assert result.ret == pytest.ExitCode.TESTS_FAILED, "\n".join(output)
    from _pytest.pytester import LineMatcher

    LineMatcher(output).fnmatch_lines(
        [
            "*short code on auto: warmup request 0 failed: no_response: no response headers within 2 s "
            "(--kv-stall-timeout): the server took the request and sent nothing; 0 of 2 measured samples are valid"
        ]
    )
    assert "Traceback" not in "\n".join(output)
    records = read_records(latest(pytester) / "requests.jsonl")
    assert [(r["shape"], r["phase"], r["error_kind"]) for r in records] == [
        ("narrative", "warmup", "no_response"),
        ("code", "warmup", "no_response"),
    ]
    assert took < 60, f"the run took {took:.0f} s"
    assert not processes_with(tag)


def test_agreement_requests_are_bounded_by_the_stall_timeout(
    pytester: pytest.Pytester, standin_args: list[str], tag: str
) -> None:
    """A server that never answers a non-streamed request: the agreement request gives up after the stall
    timeout (3 s), not the request timeout (600 s), and the run still passes (agreement is evidence)."""
    engine = [a for a in standin_args if not a.startswith(("--kv-engine-args", "--kv-runs", "--kv-warmups"))]
    args = [
        *engine,
        "--kv-arms=auto",
        "--kv-runs=1",
        "--kv-warmups=0",
        "--kv-stall-timeout=3",
        f"--kv-engine-args={tag} --standin-unstreamed-delay=120",
    ]
    started = time.monotonic()
    result = pytester.runpytest_subprocess(*args, timeout=90)
    took = time.monotonic() - started
    assert result.ret == 0, result.stdout.str()
    rows = read_records(latest(pytester) / "agreement.jsonl")
    assert rows and all(not r["ok"] and "ReadTimeout" in str(r.get("error")) for r in rows)
    assert took < 60, f"the run took {took:.0f} s"
