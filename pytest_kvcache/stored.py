"""Stored runs: the run store (``--kv-store``) checked (a URL: connected to), and the baselines that
``--kv-compare`` and ``--kv-noise`` name found, imported from an old workspace folder and loaded.

This is the step after resolution that needs them (:func:`open_stored`): resolution reads configuration only.
The plugin runs it at configure, before anything boots, so a missing or broken baseline is a usage error
(exit 4) there. ``--kv-rerender`` and ``kvcache-report`` build their judging options with
:func:`report_options`, which runs the same checks.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_kvcache.config import locations
from pytest_kvcache.config import values as v
from pytest_kvcache.config.constants import SettingsError
from pytest_kvcache.config.locations import store_location
from pytest_kvcache.config.options import parse_as, pick
from pytest_kvcache.config.resolve import report_dir_of
from pytest_kvcache.config.settings import OPTION_BY_NAME
from pytest_kvcache.jsonio import read_json
from pytest_kvcache.model.options import ReportOptions

if TYPE_CHECKING:
    from pytest_kvcache.config.settings import Settings


@dataclass(frozen=True)
class _StoreRef:
    """The run store a name resolves in, and the old per-workspace baselines folder imported from."""

    location: str
    baselines: Path
    legacy: Path
    notes: list[str] = field(default_factory=list)


def check_store(location: str, origin: str = "--kv-store") -> None:
    """The store at ``location`` can be used: a folder that is not a file; a URL reached now, before any boot."""
    from pytest_kvcache import store

    try:
        store.check(location)
        if locations.is_url(location):
            store.open_store(location).close()
    except store.StoreError as exc:
        raise SettingsError(f"{origin}: {exc}") from None


def check_save_store(location: str, baselines: Path) -> None:
    """The store ``--kv-save`` saves into can take the run — found now, not when the run is over (exit 3): its
    baselines folder can be written in, and its database opened and read (a garbage or torn one fails its
    check). A URL was connected to by :func:`check_store`."""
    from pytest_kvcache import store

    if locations.is_url(location):
        return
    problem = v.unwritable_folder(baselines)
    if problem is None:
        try:
            store.open_store(location).close()
        except store.StoreError as exc:
            problem = str(exc)
    if problem is not None:
        raise SettingsError(f"--kv-save: the run store: {problem}")


def store_of(cli: Mapping[str, Any], env: Mapping[str, str], ini: Mapping[str, Any], rootdir: Path) -> str:
    """``--kv-store`` (a folder, relative to the rootdir, or a postgresql:// URL, connected to now);
    default ``$XDG_DATA_HOME/pytest-kvcache``."""
    location, origin = store_location(cli, env, ini, rootdir)
    check_store(location, origin)
    return location


def _from_store(option: str, name: str, ref: _StoreRef) -> Path | None:
    """Baseline ``name`` in the store; an old ``<report_dir>/../baselines/NAME`` the store lacks is
    validated and imported (said once); None when neither has it."""
    from pytest_kvcache import store
    from pytest_kvcache.report.load import RunFolderError, load

    where = locations.redact(ref.location)
    try:
        with store.open_store(ref.location) as opened:
            found = opened.baseline(name)
            legacy = ref.legacy / name
            if found is not None or not legacy.exists():
                return found
            try:
                load(legacy, f"stored run ({option})")
            except RunFolderError as exc:
                raise SettingsError(f"{option}: {exc}") from None
            try:
                imported = opened.save_baseline(name, legacy)
            except (OSError, store.StoreError) as exc:
                ref.notes.append(f"could not import baseline {name!r} into the store {where} ({exc}); using {legacy}")
                return legacy
    except store.StoreError as exc:
        raise SettingsError(f"{option}: the run store: {exc}") from None
    ref.notes.append(f"imported baseline {name!r} from {legacy} into the store {where}")
    return imported


def _stored_run(
    option: str, name: str, baselines: Path, hint: str, noun: str = "stored run", ref: _StoreRef | None = None
) -> Path:
    """A stored run folder named by ``--kv-compare``/``--kv-noise``, checked now, before anything boots."""
    from pytest_kvcache.report.load import RunFolderError, load

    path = baselines / name
    if ref is not None:
        path = _from_store(option, name, ref) or path
    if not path.exists():
        also = f" or {ref.legacy}" if ref is not None and ref.legacy != baselines else ""
        raise SettingsError(f"{option}: no {noun} {name!r} in {baselines}{also} ({hint})")
    try:
        load(path, f"stored run ({option})")  # every file it holds, read and validated now
    except RunFolderError as exc:
        raise SettingsError(f"{option}: {exc}") from None
    return path


def _noise_run(name: str, baselines: Path, ref: _StoreRef | None = None) -> Path:
    """A stored A/A run: its arms are one arm typed twice or more (``fp8,fp8``)."""
    hint = f"store an A/A run with --kv-arms=X,X --kv-save={name}"
    path = _stored_run("--kv-noise", name, baselines, hint, ref=ref)
    arms = (read_json(path / "run.json").get("settings") or {}).get("arms") or []
    typed = {a.get("typed_as") or a.get("name") for a in arms}
    if len(arms) < 2 or len(typed) != 1:
        names = ", ".join(str(a.get("name")) for a in arms)
        raise SettingsError(
            f"--kv-noise: stored run {name!r} is not an A/A run (its arms: {names}); save one made with --kv-arms=X,X"
        )
    return path


@dataclass(frozen=True)
class Stored:
    """What opening the run store for a run found: its baselines folder here, the stored runs
    ``--kv-compare`` and ``--kv-noise`` name (checked and loaded), and what it did (an import), in words."""

    location: str
    baselines: Path
    compare: Path | None = None
    noise: Path | None = None
    notes: tuple[str, ...] = ()


def open_stored(settings: Settings, env: Mapping[str, str], origin: str = "--kv-store") -> Stored:
    """Check the run's store and load the stored runs it names, before anything boots (SettingsError: a
    usage error). ``origin``: the name ``--kv-store`` was given by, for its errors."""

    location = settings.store
    if location is None:
        raise SettingsError("--kv-store: no run store resolved (inactive settings)")
    check_store(location, origin)
    baselines = locations.baselines_dir_of(location, env)
    ref = _StoreRef(location=location, baselines=baselines, legacy=settings.report_dir.parent / "baselines")
    if settings.save:
        check_save_store(location, baselines)
    hint = "store one with --kv-save=NAME"
    compare = settings.compare
    return Stored(
        location=location,
        baselines=baselines,
        compare=_stored_run("--kv-compare", compare, baselines, hint, "stored baseline", ref) if compare else None,
        noise=_noise_run(settings.noise, baselines, ref) if settings.noise else None,
        notes=tuple(ref.notes),
    )


def report_options(
    cli: Mapping[str, Any],
    env: Mapping[str, str],
    ini: Mapping[str, Any],
    rootdir: Path,
) -> tuple[ReportOptions, tuple[str, ...]]:
    """``--kv-fail``, ``--kv-inconclusive``, ``--kv-compare``, ``--kv-noise``, ``--kv-allow-diff`` and
    ``--kv-save`` by the same precedence as every option (CLI > env > ini), for a report rebuilt from a
    stored run (``--kv-rerender``); stored runs are checked now. Names resolve in the run store
    (``--kv-store``). With the options, what opening the store did (an old baseline imported), in words."""

    def get(name: str, parse: Callable[[Any], Any], default: Any) -> Any:
        raw, origin = pick(OPTION_BY_NAME[name], cli, env, ini)
        return default if raw is None else parse_as(raw, origin, parse)

    location = store_of(cli, env, ini, rootdir)
    baselines = locations.baselines_dir_of(location, env)
    legacy = report_dir_of(cli, env, ini, rootdir).parent / "baselines"
    ref = _StoreRef(location=location, baselines=baselines, legacy=legacy)
    compare = get("compare", v.baseline_name, None)
    noise = get("noise", v.baseline_name, None)
    save = get("save", v.baseline_name, None)
    if save:
        check_save_store(location, baselines)
    hint = "store one with --kv-save=NAME"
    options = ReportOptions(
        gates=get("fail", lambda raw: v.gates(raw, None), ()),
        inconclusive=get("inconclusive", v.choice("fail", "warn"), "warn"),
        compare=_stored_run("--kv-compare", compare, baselines, hint, "stored baseline", ref) if compare else None,
        noise=_noise_run(noise, baselines, ref) if noise else None,
        allow_diff=get("allow_diff", v.dotted, ()),
        save_as=baselines / save if save else None,
    )
    return options, tuple(ref.notes)
