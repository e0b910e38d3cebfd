"""Read a run folder once, validated, into a :class:`RunData`: the only place the report reads files.

Every problem names the file and what is wrong with it (``RunFolderError``); the plugin and
``kvcache-report`` turn that into a one-line usage error (exit 4). A torn last line of a JSONL file (the
run was killed mid-write) is skipped and counted, and the report says so in its notes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from pytest_kvcache.model.evidence import Evidence, ProbeSpecData, RunMeta, SettingsData
from pytest_kvcache.model.records import AgreementRecord, FidelityRecord, Record, RetrievalRecord, SamplingRecord
from pytest_kvcache.model.shape import mismatch
from pytest_kvcache.probes import registry
from pytest_kvcache.probes.registry import ProbeSpec
from pytest_kvcache.report.energy import Energy, with_energy
from pytest_kvcache.report.fidelity import blocks, frame_rows
from pytest_kvcache.report.frame import frame
from pytest_kvcache.report.retrieval import frame_rows as retrieval_rows

if TYPE_CHECKING:
    import pandas as pd

    from pytest_kvcache.report.energy import Energy


class RunFolderError(ValueError):
    """A run folder that cannot be read as one: the message names the file and the problem."""


@dataclass(frozen=True)
class RunData:
    """Everything a report is built from, read once from one run folder."""

    path: Path
    meta: RunMeta
    records: list[Record]
    evidence: dict[str, Evidence] = field(default_factory=dict)
    agreement: list[AgreementRecord] = field(default_factory=list)
    sampling: list[SamplingRecord] = field(default_factory=list)
    fidelity: list[FidelityRecord] = field(default_factory=list)
    retrieval: list[RetrievalRecord] = field(default_factory=list)
    torn_lines: int = 0
    problems: tuple[str, ...] = ()

    @property
    def settings(self) -> dict[str, Any]:
        return dict(self.meta.get("settings") or {})

    @property
    def arms(self) -> list[str]:
        declared = self.settings.get("arms") or []
        names = [str(a["name"]) for a in declared if isinstance(a, dict) and a.get("name")]
        return names or list(dict.fromkeys(str(r.get("arm")) for r in self.records))

    @property
    def seed(self) -> int:
        return int(self.settings.get("seed") or 0)

    @cached_property
    def specs(self) -> dict[str, ProbeSpec]:
        return registry.resolve(cast(list[ProbeSpecData], self.meta.get("probes") or []))

    @cached_property
    def fidelity_blocks(self) -> pd.DataFrame:
        """Every fidelity comparison per block of positions (``report.fidelity.blocks``), built once."""
        return blocks(self.fidelity, self.arms)

    @cached_property
    def frame(self) -> pd.DataFrame:
        """The measured requests as one frame (``report.frame.frame``), built once for build and judge; the
        fidelity probe's blocks (each arm against the baseline) are rows of it too, so gates read them."""
        import pandas as pd

        found = with_energy(frame(self.records, self.specs), self.energy)
        extra = frame_rows(self.fidelity_blocks)
        if self.retrieval:
            needles = retrieval_rows(self.retrieval)
            extra = needles if extra.empty else pd.concat([extra, needles], ignore_index=True)
        data = found if extra.empty else extra if found.empty else pd.concat([found, extra], ignore_index=True)
        if "boot" in data:
            # The unit CIs resample: a boot; against external endpoints one server per arm, however many
            # "boots" (repeats) were planned.
            data["unit"] = data["arm"] if self.settings.get("launcher") == "external" else data["boot"]
            # The block each boot ran in (pytest-xdist: comparisons pair by block), else one for all.
            blocks = self.blocks
            data["block"] = [blocks.get(str(b), 0) for b in data["boot"]]
        return data

    @cached_property
    def energy(self) -> Energy:
        """The run's energy traces (``energy.jsonl``, and ``gpu.jsonl`` for cards without the counter) and
        each boot's cards, read once (``report.energy``)."""
        lines = lane_jsonl(self.path, "energy.jsonl")
        return Energy.build(lines, lambda: lane_jsonl(self.path, "gpu.jsonl"), self.evidence)

    @cached_property
    def blocks(self) -> dict[str, int]:
        """Each planned boot's block in a pytest-xdist run (one boot of every arm on one lane); 0 otherwise."""
        return {str(p.get("boot")): int(p.get("block") or 0) for p in self.meta.get("plan") or []}


def json_file(path: Path, what: str) -> Any:
    """The JSON of one file of a run folder (``what``: what it holds, for messages); RunFolderError when it
    is missing, cannot be read or is not JSON."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise RunFolderError(f"{path}: missing ({what})") from None
    except IsADirectoryError:
        raise RunFolderError(f"{path}: is a folder, expected a JSON file ({what})") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise RunFolderError(f"{path}: cannot be read ({what}): {exc}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise RunFolderError(f"{path}: not valid JSON ({what}): {exc.msg} at line {exc.lineno}") from None


def check_shape(file: Path, value: Any, typed: Any, where: str = "", what: str = "") -> None:
    """Raise :class:`RunFolderError` naming ``file`` and the field where ``value`` (read from it) is not a
    ``typed`` (a model type: ``model.shape.mismatch``); ``what`` goes before the field (``record 3: ``)."""
    problem = mismatch(value, typed, where)
    if problem is not None:
        raise RunFolderError(f"{file}: {what}{problem}")


def _run_json(path: Path) -> RunMeta:
    """``run.json`` of the run folder ``path``, read and checked: the type of every field a reader reads (of
    another version, or edited by hand, it is a :class:`RunFolderError` naming the field)."""
    file = path / "run.json"
    meta = json_file(file, "the run's settings and plan")
    check_shape(file, meta, RunMeta)
    check_shape(file, meta.get("settings") or {}, SettingsData, "settings")
    if not all(p.get("boot") for p in meta.get("plan") or []):
        raise RunFolderError(f"{file}: 'plan' must be a list of boots, each with a 'boot' name")
    return cast(RunMeta, meta)


def jsonl(path: Path) -> tuple[list[dict[str, Any]], int]:
    """The objects of a JSONL file and how many lines could not be read (a torn last line, or junk)."""
    rows: list[dict[str, Any]] = []
    bad = 0
    if not path.exists():
        return rows, bad
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise RunFolderError(f"{path}: cannot be read: {exc}") from None
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError:
            bad += 1
            continue
        if isinstance(value, dict):
            rows.append(value)
        else:
            bad += 1
    return rows, bad


def lane_jsonl(path: Path, name: str) -> list[dict[str, Any]]:
    """A run-level JSONL file of the run folder and of each pytest-xdist lane (``lanes/<N>/``), joined: the GPU
    traces (``gpu.jsonl``, ``energy.jsonl``), whose lines name their card."""
    rows, _ = jsonl(path / name)
    lanes = path / "lanes"
    if lanes.is_dir():
        for lane in sorted(lanes.iterdir()):
            rows += jsonl(lane / name)[0]
    return rows


def read_meta(path: Path) -> RunMeta:
    """Only ``run.json`` of a run folder (validated), for callers that need its settings and not the rest."""
    check_folder(path)
    return _run_json(path)


def check_folder(path: Path, what: str = "run folder") -> None:
    """Raise :class:`RunFolderError` unless ``path`` looks like a run folder (used before a run starts)."""
    if path.is_file():
        raise RunFolderError(f"{path}: is a file, not a {what}")
    if not path.is_dir():
        raise RunFolderError(f"{path}: not a {what} (it does not exist)")
    if (path / "run.json").exists():  # a corrupt run.json is named before what else is missing
        _run_json(path)
    missing = [name for name in ("run.json", "requests.jsonl") if not (path / name).exists()]
    if missing:
        raise RunFolderError(f"{path}: incomplete {what} — missing {', '.join(missing)}")


def load(path: Path, what: str = "run folder") -> RunData:
    """Read and validate one run folder: ``run.json``, ``requests.jsonl``, each planned boot's
    ``evidence.json``, ``agreement.jsonl``, ``sampling.jsonl``, ``fidelity.jsonl`` and ``retrieval.jsonl``."""
    check_folder(path, what)
    meta = _run_json(path)
    plan = meta.get("plan") or []
    records, torn = jsonl(path / "requests.jsonl")
    for i, r in enumerate(records, 1):
        if not r.get("arm") or "phase" not in r:
            raise RunFolderError(f"{path / 'requests.jsonl'}: record {i} has no 'arm' or 'phase'")
        for key in ("metrics", "sample"):
            if not isinstance(r.get(key) or {}, dict):
                raise RunFolderError(f"{path / 'requests.jsonl'}: record {i}: {key!r} must be an object")
        check_shape(path / "requests.jsonl", r, Record, what=f"record {i}: ")
    boots = [str(p["boot"]) for p in plan]
    arms_dir = path / "arms"
    if arms_dir.is_dir():
        boots += [d.name for d in sorted(arms_dir.iterdir()) if d.is_dir() and d.name not in boots]
    evidence: dict[str, Evidence] = {}
    for boot in boots:
        file = arms_dir / boot / "evidence.json"
        if file.exists():
            value = json_file(file, f"boot {boot}'s evidence")
            check_shape(file, value, Evidence)
            evidence[boot] = cast(Evidence, value)
    agreement, bad_agreement = jsonl(path / "agreement.jsonl")
    sampling, _ = jsonl(path / "sampling.jsonl")
    fidelity, bad_fidelity = jsonl(path / "fidelity.jsonl")
    retrieval, bad_retrieval = jsonl(path / "retrieval.jsonl")
    for name, rows, typed in (
        ("agreement.jsonl", agreement, AgreementRecord),
        ("sampling.jsonl", sampling, SamplingRecord),
        ("fidelity.jsonl", fidelity, FidelityRecord),
        ("retrieval.jsonl", retrieval, RetrievalRecord),
    ):
        for i, row in enumerate(rows, 1):
            check_shape(path / name, row, typed, what=f"record {i}: ")
    problems = []
    if bad_agreement:
        problems.append(f"{bad_agreement} line(s) of agreement.jsonl could not be read and were skipped")
    if bad_fidelity:
        problems.append(f"{bad_fidelity} line(s) of fidelity.jsonl could not be read and were skipped")
    if bad_retrieval:
        problems.append(f"{bad_retrieval} line(s) of retrieval.jsonl could not be read and were skipped")
    problems += [str(p) for p in meta.get("problems") or []]
    skipped = [str(s) for s in meta.get("skipped") or []]
    if skipped:
        problems.append(f"{len(skipped)} probe test(s) skipped: " + "; ".join(skipped))
    return RunData(
        path=path,
        meta=meta,
        records=cast(list[Record], records),
        evidence=evidence,
        agreement=cast(list[AgreementRecord], agreement),
        sampling=cast(list[SamplingRecord], sampling),
        fidelity=cast(list[FidelityRecord], fidelity),
        retrieval=cast(list[RetrievalRecord], retrieval),
        torn_lines=torn,
        problems=tuple(problems),
    )
