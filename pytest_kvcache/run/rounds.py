"""Adaptive rounds: whether the next round of boots runs, judged by the report's own gate evaluation on
everything measured so far (``--kv-max-replicates``, ``--kv-target-ci``); each decision is logged to
``sampling.jsonl``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from pytest_kvcache.config.plan import Boot, BootPlan
from pytest_kvcache.config.settings import Settings
from pytest_kvcache.model.evidence import Evidence, ModelSize, PlanEntry
from pytest_kvcache.model.records import Record
from pytest_kvcache.probes import registry as probe_registry
from pytest_kvcache.report.bands import platform_of, unlike_source


class Run(Protocol):
    """What the round decisions read and write of the run (``run.run.Run`` meets it): its settings, plan, records
    and evidence so far, the decisions taken, and its logs."""

    settings: Settings
    boot_plan: BootPlan
    plan: list[PlanEntry]
    records: list[Record]
    evidence: dict[str, Evidence]
    round_decisions: dict[int, str | None]
    _judging: tuple[dict[tuple[str, str, str], Any], Any] | None

    @property
    def role(self) -> str: ...

    @property
    def model_size(self) -> ModelSize: ...

    def write_meta(self, status: str) -> None: ...

    def log(self, name: str, record: Mapping[str, object]) -> None: ...


def skip_reason(run: Run, boot: Boot) -> str | None:
    """Why an adaptive round's boot does not run: every gate is decided (and, with ``--kv-target-ci``,
    every delta is narrow enough) — judged by the report's own gate evaluation on everything measured so
    far. Decided once per round, when its first boot is due; logged to ``sampling.jsonl``.
    """
    target = run.settings.target_ci_pct
    if not boot.extra or run.role == "worker":  # the controller decides for workers
        return None
    if boot.replicate not in run.round_decisions:
        if run.round_decisions.get(boot.replicate - 1):
            reason = run.round_decisions[boot.replicate - 1]
        else:
            reason = decide_round(run, boot.replicate, target)
        run.round_decisions[boot.replicate] = reason
    reason = run.round_decisions[boot.replicate]
    if reason:
        for entry in run.plan:
            if entry.get("boot") == boot.boot_id:
                entry["skipped"] = reason
        run.write_meta(status="running")
    return reason


def judging_inputs(run: Run) -> tuple[dict[tuple[str, str, str], Any], Any]:
    """The stored A/A run's noise bands and the stored run's frame, as the report judges with them
    (``--kv-noise``, ``--kv-compare``), read once."""
    if run._judging is None:
        from pytest_kvcache.report.judge import noise_bands
        from pytest_kvcache.report.load import RunFolderError, load

        options = run.settings.report_options()
        bands: dict[tuple[str, str, str], Any] = {}
        saved = None
        try:
            if options.noise is not None:
                bands = noise_bands(load(options.noise, "A/A run (--kv-noise)"))
            if options.compare is not None:
                saved = load(options.compare, "stored run (--kv-compare)").frame
        except RunFolderError:
            pass  # the report says what is wrong with it; the round decision judges without it
        run._judging = (bands, saved)
    return run._judging


def decide_round(run: Run, round_: int, target: float | None) -> str | None:
    from pytest_kvcache.report.rounds import rounds_check

    arms = [a.name for a in run.settings.arms]
    specs = probe_registry.resolve()
    blocks = {b.boot_id: b.block for b in run.boot_plan} if run.settings.lanes > 1 else None
    bands, saved = judging_inputs(run)
    done_ci, widest = rounds_check(
        run.records,
        arms,
        specs,
        target,
        run.settings.seed,
        run.settings.gates,
        blocks,
        platform=platform_of(run.evidence),
        noise=bands,
        saved=saved,
        external=run.settings.launcher == "external",
        unlike=unlike_source(platform_of(run.evidence), {"model_size": run.model_size}),
    )
    done = round_ - 1
    width = widest.get("half_width_pct") if widest else None
    if widest and widest.get("gate"):
        more = widest.get("boots_to_decide")
        likely = f"; likely decided after {more} more boot(s) per arm" if isinstance(more, int) else ""
        others = int(str(widest.get("open_gates") or 1)) - 1
        where = f"gate {widest['gate']} still undecided{f' (and {others} more)' if others else ''}{likely}"
    elif widest and isinstance(width, float):
        where = f"widest: {widest['arm']} {widest['probe']}@{widest['point']} {widest['metric']} ±{width:.2f}%"
    else:
        where = "" if done_ci else "no CI yet"
    goal = " and ".join(
        ([f"target ±{target:g}% reached"] if target is not None else [])
        + (["every gate decided"] if run.settings.gates else [])
    )
    reason = f"{goal} after {done} round(s)" + (f" ({where})" if where else "") if done_ci else None
    run.log(
        "sampling.jsonl",
        {
            "kind": "rounds",
            "round": round_,
            "rounds_done": done,
            "target_pct": target,
            "widest": widest,
            "decision": "skip" if reason else "boot",
            "reason": reason or f"round {round_} boots after {done} round(s): {where}",
        },
    )
    return reason
