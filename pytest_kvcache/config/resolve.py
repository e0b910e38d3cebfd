"""Resolution: raw values (CLI > environment > ini > default) into one frozen :class:`Settings`.

Every option declared with a parser on a ``Settings`` field resolves the same way, from its declaration
(:func:`_declared`); the few whose value depends on others (arms, engine, launcher, model, the boot budget
and order, the self-check) are resolved by hand below. Resolution reads configuration only — the folders
it names are checked, but the run store is opened and stored runs are loaded after it, by
:func:`pytest_kvcache.stored.open_stored`. It ends with the context known before any boot
(:func:`config.context.fit_context`) and the KV budgets checked, and returns a Settings nothing modifies.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

from pytest_kvcache.config import embedded as embedded_models
from pytest_kvcache.config import locations, model_files
from pytest_kvcache.config import values as v
from pytest_kvcache.config.arms import Arm, looks_like_path
from pytest_kvcache.config.budget import Need, model_shape, need, refusal
from pytest_kvcache.config.constants import BOOT_INVARIANT_PROBES, SettingsError
from pytest_kvcache.config.context import fit_context, planned_points
from pytest_kvcache.config.kinds import engine_kind, resolve_arms
from pytest_kvcache.config.kv_layout import KvLayout, KvPlan
from pytest_kvcache.config.locations import store_location
from pytest_kvcache.config.options import options_of, parse_as, pick
from pytest_kvcache.config.plan import boot_budget
from pytest_kvcache.config.settings import OPTION_BY_NAME, Settings
from pytest_kvcache.datafiles import embedded_model_path
from pytest_kvcache.model.evidence import KvPlanData, ModelSize


def served_shape(settings: Settings) -> tuple[KvLayout | None, str]:
    """The KV layout of the model the arms will serve, and its name: an embedded model's declared or packaged
    config, else ``--kv-model``'s folder (None: no folder here to read, e.g. a hub id or an external server's
    model)."""
    if settings.embedded:
        spec = settings.embedded_spec
        name = spec.title.split(" (")[0]
        return (KvLayout.from_config(spec.kv_config) if spec.kv_config else model_shape(embedded_model_path())), name
    folder = Path(str(settings.model))
    return (model_shape(folder) if folder.is_dir() else None), folder.name


def served_config(settings: Settings) -> Mapping[str, Any] | None:
    """The ``config.json`` contents of the model the arms serve, as :func:`served_shape` reads them: an embedded
    model's declared or packaged config, else ``--kv-model``'s folder's (None: no folder here to read)."""
    if settings.embedded:
        spec = settings.embedded_spec
        data: Any = spec.kv_config or model_files.read(embedded_model_path())
    else:
        folder = Path(str(settings.model)) if settings.model else None
        data = model_files.read(folder) if folder is not None and folder.is_dir() else None
    return data if isinstance(data, Mapping) else None


def served_parameters(settings: Settings) -> ModelSize:
    """``run.json``'s ``model_size``: the estimated parameter count of the model the arms serve
    (``model_files.parameters``), or null with the reason it is not known here — the report places the run in a
    size class with it, and judges a one-boot comparison with the default band only when that class is one the
    band was measured on (``report.spread``)."""
    data = served_config(settings)
    if data is None:
        return {"parameters": None, "source": "no config.json here (a hub id or an external server's model)"}
    found = model_files.parameters(data)
    source = "the embedded model's config" if settings.embedded else f"{settings.model}/config.json"
    if found is None:
        return {"parameters": None, "source": f"{source} lacks a figure the estimate needs"}
    return {"parameters": found, "source": f"estimated from {source}"}


def served_vocab(settings: Settings) -> int | None:
    """The vocabulary size of the model the arms serve, from the same config as :func:`served_shape` (None: not
    known here; an engine may report it itself, as llama-server's ``/v1/models`` does)."""
    data = served_config(settings)
    if data is None:
        return None
    inner = data.get("text_config")
    vocab = (inner if isinstance(inner, Mapping) else data).get("vocab_size")
    return vocab if isinstance(vocab, int) and not isinstance(vocab, bool) and vocab > 1 else None


def arm_need(settings: Settings, arm: Arm) -> Need | None:
    """What one request of ``arm``'s ``max_model_len`` takes in KV, for the model it serves in the weights dtype it
    is served in (the embedded trained model's from :attr:`Settings.embedded_dtype`); None: not computed here."""
    shape, name = served_shape(settings)
    served = settings.embedded_dtype if settings.embedded else None
    return need(shape, arm.kv_cache_dtype, settings.engine_args, arm.args, served_dtype=served, model=name)


def arm_plan(settings: Settings, arm: Arm, found: Need | None = None) -> KvPlan | None:
    """What ``arm``'s engine will make of its KV budget, by the engine kind's own arithmetic (``Kind.kv_plan``:
    vLLM's groups, blocks and windows): the KV tokens and the concurrency it will report, and the bytes one
    request of ``max_model_len`` takes. None: no budget known before the boot, or the kind computes none; a
    plan without figures says what is not modelled."""
    found = found if found is not None else arm_need(settings, arm)
    if found is None:
        return None
    return engine_kind(settings.engine).kv_plan(settings, arm, found, settings.kv_budget(arm))


def kv_plan_data(settings: Settings, arm: Arm) -> KvPlanData | None:
    """``run.json``'s ``plan[].kv_plan``: :func:`arm_plan` as data (None: nothing planned for this arm)."""
    plan = arm_plan(settings, arm)
    return cast(KvPlanData, dataclasses.asdict(plan)) if plan is not None else None


def check_budgets(settings: Settings) -> None:
    """Every arm's KV budget holds one request of its ``max_model_len`` — by the engine's own arithmetic where its
    kind has one (``arm_plan``), else at its bytes per token for a model of full attention throughout; a layout the
    arithmetic does not model is left to the engine. A budget only where the plugin can apply one (vLLM it
    boots)."""
    budgets = {a.name: settings.kv_budget(a) for a in settings.arms}
    if settings.cache_bytes is not None and engine_kind(settings.engine).budget_flag is None:
        raise SettingsError(
            f"--kv-cache-bytes sets vLLM's --kv-cache-memory-bytes; a {settings.engine} server sizes its KV cache "
            "itself (llama.cpp: --ctx-size tokens, in each arm's args)"
        )
    if settings.cache_bytes is not None and settings.launcher == "external":
        raise SettingsError("--kv-cache-bytes cannot size the KV cache of a server you started (external launcher)")
    for arm in settings.arms:
        budget = budgets[arm.name]
        if budget is None:
            continue
        found = arm_need(settings, arm)
        if found is None:
            continue
        plan = arm_plan(settings, arm, found)
        if why := refusal(arm.name, budget, found, arm.kv_cache_dtype, plan):
            raise SettingsError(why)


def report_dir_of(
    cli: Mapping[str, Any], env: Mapping[str, str], ini: Mapping[str, Any], rootdir: Path, *, writable: bool = False
) -> Path:
    """``--kv-report-dir`` as a path; with ``writable`` (a run: it writes there) one it cannot write is refused."""
    raw, origin = pick(OPTION_BY_NAME["report_dir"], cli, env, ini)
    path = Path(str(raw) if raw is not None else ".kvcache/runs").expanduser()
    path = path if path.is_absolute() else rootdir / path
    problem = v.not_a_folder(path) or (v.unwritable_folder(path) if writable else None)
    if problem is not None:
        raise SettingsError(f"{origin if raw is not None else '--kv-report-dir'}: {problem}")
    return path


def resolve(
    cli: Mapping[str, Any],
    env: Mapping[str, str],
    ini: Mapping[str, Any],
    named_arms: Mapping[str, Mapping[str, Any]],
    rootdir: Path,
    fp8_kv_unsupported: str | None = None,
    *,
    lanes: int = 1,
    settings_class: type[Settings] = Settings,
) -> Settings:
    """Resolve all raw values into one frozen Settings, or raise SettingsError naming the bad input.

    ``lanes``: the parallel lanes (pytest-xdist workers) the boots are placed on. ``settings_class``: a
    subclass of Settings that declares more options (its fields' ``option(…)``), resolved the same way."""
    specs = {spec.name: spec for spec in options_of(settings_class)}
    explicit: set[str] = set()

    def raw_of(name: str) -> tuple[Any, str]:
        return pick(specs.get(name) or OPTION_BY_NAME[name], cli, env, ini)

    def get(name: str, parse: Any, default: Any) -> Any:
        raw, origin = raw_of(name)
        if raw is None:
            return default
        explicit.add(name)
        return parse_as(raw, origin, parse)

    names = get("arms", lambda raw: v.names(v.joined(raw)), ())
    if not names:
        return settings_class(arms=())
    engine = get("engine", specs["engine"].parse, "vllm")
    arms = resolve_arms(names, named_arms, engine)

    launcher = get("launcher", specs["launcher"].parse, "process")
    kind = engine_kind(engine)
    kind.check(launcher=launcher, engine_cmd=raw_of("engine_cmd")[0])
    model, embedded_name = _model(get("model", v.stripped, None) or None, engine, rootdir)

    # An embedded model on the CPU: the seed's 90K depths, 15-turn sessions and 1000-token decodes take many
    # minutes an arm there (the trained model prefills 40-190 tok/s and decodes ~20-140), so its probes get
    # the sizes config/embedded.py gives it (each option's ``cpu_default``; the boot plan says so).
    cpu_default = model is None and launcher != "external"
    on_cpu = embedded_models.EMBEDDED[embedded_name] if cpu_default else None

    # Every option resolved from its declaration alone.
    by_hand = {"arms", "engine", "launcher", "model", "fail", "order", "max_replicates", "self_check", "store"}
    values: dict[str, Any] = {}
    for spec in specs.values():
        if spec.field is None or spec.name in by_hand:
            continue
        if spec.name == "tokenizer":
            values[spec.field] = get(spec.name, v.tokenizer_dir(rootdir), None)
        elif spec.name == "report_dir":
            values[spec.field] = report_dir_of(cli, env, ini, rootdir, writable=True)
        elif spec.parse is not None:
            values[spec.field] = get(spec.name, spec.parse, spec.default_for(on_cpu))
        else:  # a declaration without a parser must be resolved by hand here, never silently defaulted
            raise TypeError(f"option {spec.name!r} declares no parser and is not resolved by hand")
    _check_endpoints(values["endpoints"], launcher, [a.name for a in arms])
    if launcher == "docker":
        without = [a.name for a in arms if not (a.image or values["image"])]
        if without:
            raise SettingsError(
                f"--kv-launcher=docker needs an image: give --kv-image or an 'image' in the arm's table "
                f"(missing for: {', '.join(without)})"
            )
    if model is None and launcher != "external" and kind.cpu_build:
        _check_cpu_arms(arms, kind.cpu_dtypes, fp8_kv_unsupported)

    location, _ = store_location(cli, env, ini, rootdir)  # checked (a URL: connected to) by open_stored
    gates = get("fail", lambda raw: v.gates(raw, [a.name for a in arms]), ())
    replicates, runs, target_ci, max_runs = (values[k] for k in ("replicates", "runs", "target_ci_pct", "max_runs"))
    if target_ci is None and max_runs is not None:
        raise SettingsError("--kv-max-runs only applies with --kv-target-ci")
    if max_runs is not None and max_runs < runs:
        raise SettingsError(f"--kv-max-runs ({max_runs}) must be at least --kv-runs ({runs})")
    max_replicates = boot_budget(
        get("max_replicates", v.count(1, v.MAX_BOOT_BUDGET), None),
        replicates,
        # a gate on a probe measured the same on every boot never asks for another
        gates=any(v.gate_probe(g) not in BOOT_INVARIANT_PROBES for g in gates),
        target_ci=target_ci,
        launcher=launcher,
    )
    rounds = max(replicates, max_replicates or 0)
    order, order_seed = get("order", v.order, ("abba" if rounds >= 2 else "sequential", None))
    start, max_sessions = values["capacity_start"], values["capacity_max_sessions"]
    if start > max_sessions:
        raise SettingsError(f"--kv-capacity-start ({start}) is above --kv-capacity-max-sessions ({max_sessions})")
    full_check = get("self_check", v.flag, False)
    no_check = get("no_self_check", v.flag, False)
    if full_check and no_check:
        raise SettingsError("--kv-self-check and --kv-no-self-check contradict each other")

    settings = settings_class(
        **values,
        arms=arms,
        launcher=launcher,
        engine=engine,
        model=model,
        embedded_model=embedded_name,
        gates=gates,
        order=order,
        order_seed=values["seed"] if order_seed is None else order_seed,
        max_replicates=max_replicates,
        store=location,
        store_baselines=locations.baselines_dir_of(location, env),
        self_check="off" if no_check else "full" if full_check else "quick",
        lanes=lanes,
        explicit=frozenset(explicit),
    )

    settings = fit_context(settings)
    if gates:  # a gate on a point the run will not have (a depth not in --kv-depths …): before any boot
        parse_as(gates, raw_of("fail")[1], lambda raw: v.gates(raw, [a.name for a in arms], planned_points(settings)))
    check_budgets(settings)
    return settings


def _model(model: str | None, engine: str, rootdir: Path) -> tuple[str | None, str]:
    """``--kv-model``: (a hub id or an absolute local path, or None: embedded; the embedded model's name)."""
    embedded_name = embedded_models.DEFAULT
    if model is not None:
        try:
            named = embedded_models.parse(model)
        except ValueError as exc:
            raise SettingsError(f"--kv-model: {exc}") from None
        if named is not None:
            embedded_name, model = named, None
    if model is not None and looks_like_path(model):
        path = Path(model).expanduser()
        if not path.is_absolute():
            path = (rootdir / path) if not path.exists() else path.resolve()
        if engine_kind(engine).model_is_file:
            if not path.is_file():
                raise SettingsError(f"--kv-model: {engine_kind(engine).model_file_what}; {model!r} is not a file")
        elif path.is_file():
            raise SettingsError(f"--kv-model: {model!r} is a file; give the model's folder (config.json and weights)")
        elif not path.is_dir():
            raise SettingsError(f"--kv-model: model folder {model!r} does not exist")
        if path.is_dir():  # its config.json, tokenizer_config.json, generation_config.json: the one checked reader
            try:
                model_files.check_folder(path.resolve())
            except SettingsError as exc:
                raise SettingsError(f"--kv-model: {exc}") from None
        model = str(path.resolve())
    return model, embedded_name


def _check_endpoints(endpoints: Mapping[str, str], launcher: str, arm_names: list[str]) -> None:
    if endpoints and launcher != "external":
        raise SettingsError("--kv-endpoint requires --kv-launcher=external")
    if launcher == "external":
        stray = sorted(set(endpoints) - set(arm_names))
        if stray:
            raise SettingsError(
                f"--kv-endpoint names arm(s) not in --kv-arms: {', '.join(stray)} (arms: {', '.join(arm_names)})"
            )
        missing = [n for n in arm_names if n not in endpoints]
        if missing:
            raise SettingsError(f"--kv-launcher=external needs --kv-endpoint ARM=URL for: {', '.join(missing)}")


def _check_cpu_arms(arms: Any, cpu_dtypes: frozenset[str], fp8_kv_unsupported: str | None) -> None:
    """The embedded CPU default serves only what vLLM's CPU attention backend serves, and fp8 only where the
    host CPU can (AVX-512 or AMX)."""
    gpu_only = [a for a in arms if a.kv_cache_dtype is not None and a.kv_cache_dtype not in cpu_dtypes]
    if gpu_only:
        listed = ", ".join(f"{a.name} ({a.kv_cache_dtype})" for a in gpu_only)
        raise SettingsError(
            f"arm(s) {listed} need a GPU: the embedded CPU default serves only "
            f"{', '.join(sorted(cpu_dtypes))}. Give --kv-model (and a GPU engine) to test them."
        )
    fp8 = [a for a in arms if (a.kv_cache_dtype or "").startswith("fp8")]
    if fp8 and fp8_kv_unsupported:
        listed = ", ".join(f"{a.name} ({a.kv_cache_dtype})" for a in fp8)
        raise SettingsError(f"arm(s) {listed} cannot run on the embedded CPU default here: {fp8_kv_unsupported}")
