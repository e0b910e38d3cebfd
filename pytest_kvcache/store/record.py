"""One run's row of the store's history, built from its run folder: ``report.json`` (summary, deltas,
arms and their resolved evidence), the requests (each point's CI of the mean) and ``vcs.json`` (the commit
and branch the run measured, written at the end of the run).

The *comparability* of a row is a hash of what must match for two runs to sit on one line of a trend:
the model, the engine version(s), the GPU model(s) and the arm definitions (dtype, args, env, image).
The parts are kept beside the hash, so a break in a trend can say what changed.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

from pytest_kvcache import stats
from pytest_kvcache.jsonio import read_json, write_json
from pytest_kvcache.model.report import PointOfArm, Report
from pytest_kvcache.report.frame import by_boot, values
from pytest_kvcache.report.load import RunFolderError, check_shape, json_file, load

if TYPE_CHECKING:
    from pytest_kvcache.model.report import PointOfArm, Report
    from pytest_kvcache.report.load import RunData

#: the keys of a report's summary and delta row that name its point (a history row indexes them)
POINT_KEYS = ("probe", "point", "metric", "arm")

#: The store's row format; bumped when a field changes meaning.
ROW_VERSION = 1
VCS_FILE = "vcs.json"


class Vcs(TypedDict):
    commit: str | None
    branch: str | None
    source: str  # "git" | "env" | "none"


class Comparability(TypedDict):
    model: str | None
    engine_args: list[str]  # --kv-engine-args, shared by every arm
    engine_versions: list[str]
    gpus: list[str]
    arms: list[dict[str, Any]]


class PointRow(PointOfArm):
    """One probe × point × metric × arm of one run."""

    ci_low: float | None
    ci_high: float | None
    ci_method: str  # "boots" (3+ boots: over boots) | "within-boot"
    boots: int
    #: This arm against the run's baseline arm (None for the baseline arm itself).
    ratio: float | None
    ratio_ci_low: float | None
    ratio_ci_high: float | None
    verdict: str | None


class RunRow(TypedDict):
    row_version: int
    run_id: str
    started_unix_s: float | None
    recorded_unix_s: float
    commit: str | None
    branch: str | None
    status: str | None
    arms: list[str]
    baseline_arm: str | None
    comparability: str
    comparable_on: Comparability
    points: list[PointRow]


def indexed_columns(row: RunRow) -> tuple[str, float | None, float, str | None, str | None, str]:
    """The columns both stores index a row by (run_id, started, recorded, commit, branch, comparability);
    the whole row goes beside them as JSON."""
    return (
        row["run_id"],
        row["started_unix_s"],
        row["recorded_unix_s"],
        row["commit"],
        row["branch"],
        row["comparability"],
    )


def _git(cwd: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    out = done.stdout.strip()
    return out if done.returncode == 0 and out else None


def vcs_of(cwd: Path | None, env: Mapping[str, str]) -> Vcs:
    """The commit and branch the run measured: ``git`` in the run's working directory, else the CI's
    ``GITHUB_SHA``/``GITHUB_REF_NAME``; None where neither says."""
    commit = branch = None
    source = "none"
    if cwd is not None and cwd.is_dir():
        commit = _git(cwd, "rev-parse", "HEAD")
        if commit:
            source = "git"
            name = _git(cwd, "rev-parse", "--abbrev-ref", "HEAD")
            branch = name if name and name != "HEAD" else None
    if commit is None and env.get("GITHUB_SHA"):
        commit, source = env["GITHUB_SHA"], "env"
    if branch is None and env.get("GITHUB_REF_NAME"):
        branch = env["GITHUB_REF_NAME"]
    return {"commit": commit, "branch": branch, "source": source}


def stamp_vcs(run: Path, cwd: Path | None, env: Mapping[str, str] = os.environ) -> Vcs:
    """``vcs.json`` of the run folder: written once, at the end of the run (a later re-render or rebuild
    reads it, so the row keeps the commit the run measured, not the one checked out later)."""
    path = run / VCS_FILE
    if path.is_file():
        return read_vcs(run)
    vcs = vcs_of(cwd, env)
    write_json(path, vcs)
    return vcs


def read_vcs(run: Path) -> Vcs:
    """``vcs.json``; one that cannot be read, or is not an object of strings, says nothing."""
    try:
        data = read_json(run / VCS_FILE)
    except (OSError, ValueError):
        data = None
    if not isinstance(data, dict):
        return {"commit": None, "branch": None, "source": "none"}
    commit, branch = data.get("commit"), data.get("branch")
    return {
        "commit": commit if isinstance(commit, str) else None,
        "branch": branch if isinstance(branch, str) else None,
        "source": str(data.get("source") or "none"),
    }


def comparability(report: Report, engine_args: list[str] | None = None) -> tuple[str, Comparability]:
    """(hash, parts): what must match for two runs' numbers to be on one line (``engine_args``: the run's
    ``--kv-engine-args``, which every arm shares)."""
    arms = report.get("arms") or []
    versions = sorted({str(v) for a in arms if (v := (a.get("resolved") or {}).get("engine_version"))})
    gpus = sorted({str(c.get("name")) for a in arms for c in (a.get("gpu") or {}).get("cards") or [] if c.get("name")})
    declared = [
        {
            "name": a["name"],
            "kv_cache_dtype": d.get("kv_cache_dtype"),
            "args": list(d.get("args") or []),
            "env": dict(d.get("env") or {}),
            "image": d.get("image"),
        }
        for a in arms
        for d in [a.get("declared") or {}]  # an old report.json may lack it
    ]
    parts: Comparability = {
        "model": report.get("model"),
        "engine_args": list(engine_args or []),
        "engine_versions": versions,
        "gpus": gpus,
        "arms": declared,
    }
    digest = hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]
    return digest, parts


def run_row(data: RunData, report: Report, vcs: Vcs, *, recorded_unix_s: float | None = None) -> RunRow:
    """The history row of one run: every summary point with its CI of the mean and boot count, and each
    arm's ratio to the baseline arm with its CI."""
    frame = data.frame
    deltas = {(d["probe"], d["point"], d["metric"], d["arm"]): d for d in report.get("deltas") or []}
    ci = report.get("ci")
    boots_per_arm: dict[str, int] = dict(ci["boots_per_arm"]) if ci else {}
    points: list[PointRow] = []
    for row in report.get("summary") or []:
        probe, point, metric, arm = row["probe"], row["point"], row["metric"], row["arm"]
        group = (
            frame[(frame["probe"] == probe) & (frame["point"] == point) & (frame["arm"] == arm)]
            if not frame.empty
            else frame
        )
        boots = int(boots_per_arm.get(arm, 1))
        per_boot = by_boot(group, metric) if not group.empty else []
        if len([b for b in per_boot if b]) >= 3:
            mean, lo, hi = stats.mean_ci_boots(per_boot)
            method = "boots"
        else:
            mean, lo, hi = stats.mean_ci(values(group, metric) if not group.empty else [], seed=data.seed)
            method = "within-boot"
        delta = deltas.get((probe, point, metric, arm)) or {}
        points.append(
            {
                "probe": probe,
                "point": point,
                "metric": metric,
                "arm": arm,
                "n": int(row.get("n") or 0),
                "mean": row.get("mean") if row.get("mean") is not None else mean,
                "ci_low": lo,
                "ci_high": hi,
                "ci_method": method,
                "boots": boots,
                "ratio": delta.get("ratio"),
                "ratio_ci_low": delta.get("ci_low"),
                "ratio_ci_high": delta.get("ci_high"),
                "verdict": delta.get("verdict"),
            }
        )
    digest, parts = comparability(report, [str(a) for a in data.settings.get("engine_args") or []])
    arms = [a["name"] for a in report.get("arms") or []]
    baseline = next((a["name"] for a in report.get("arms") or [] if a.get("baseline")), None)
    return {
        "row_version": ROW_VERSION,
        "run_id": str(report.get("run_id") or data.meta.get("run_id") or data.path.name),
        "started_unix_s": data.meta.get("started_unix_s"),
        "recorded_unix_s": recorded_unix_s if recorded_unix_s is not None else time.time(),
        "commit": vcs["commit"],
        "branch": vcs["branch"],
        "status": report.get("status"),
        "arms": arms,
        "baseline_arm": baseline,
        "comparability": digest,
        "comparable_on": parts,
        "points": points,
    }


def row_of_folder(run: Path) -> RunRow:
    """Rebuild a run's row from its folder (``report.json`` must be there: the report was built). A
    ``report.json`` that is not JSON, or has a field of another type than the row reads (another version, a
    hand edit), is a ``RunFolderError`` naming the file and the field."""
    data = load(run)
    report_path = run / "report.json"
    if not report_path.is_file():
        raise FileNotFoundError(f"{run}: no report.json (build it with: kvcache-report {run})")
    report = json_file(report_path, "the run's report")
    check_shape(report_path, report, Report)
    for key, needs in (("summary", POINT_KEYS), ("deltas", POINT_KEYS), ("arms", ("name",))):
        for i, entry in enumerate(report.get(key) or []):
            if missing := [k for k in needs if k not in entry]:
                raise RunFolderError(f"{report_path}: '{key}[{i}].{missing[0]}' is missing")
    return run_row(data, report, read_vcs(run))
