"""The terminal summary: lines drawn from the report (and its outcome) alone, so a re-render prints the
same thing and everything shown here is in ``report.md``/``report.json`` too."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pandas as pd

from pytest_kvcache.config.constants import BOOT_INVARIANT_PROBES
from pytest_kvcache.engines.kinds.base import find_kind
from pytest_kvcache.metrics import catalogue
from pytest_kvcache.model.evidence import Evidence, GpuCard, kv_capacity_tokens, resolved_cache_dtype
from pytest_kvcache.model.report import Report
from pytest_kvcache.report import cost, energy, greedy, kv_plan, left_out, retrieval_render
from pytest_kvcache.report.capacity import render as capacity_render
from pytest_kvcache.report.outputs.formats import Line, Tone, fmt, fmt_delta, probe_specs, title
from pytest_kvcache.report.outputs.md_probes import (
    ab_tables,
    agentic_table,
    agreement_table,
    fidelity_table,
    growth_lines,
)
from pytest_kvcache.report.outputs.md_setup import block_table, order_lines
from pytest_kvcache.report.outputs.md_verdict import gate_evidence, sampling_lines, self_check_line
from pytest_kvcache.report.part import ordered

if TYPE_CHECKING:
    from pytest_kvcache.report.pipeline import Outcome


def evidence_lines(boot_id: str, evidence: Evidence) -> list[str]:
    """A compact, human reading of one boot's evidence."""
    if evidence.get("status") == "failed":
        error = evidence.get("error") or ""
        return [f"{boot_id}: FAILED — {error.splitlines()[0] if error else '?'}"]
    cache = evidence.get("cache_config") or {}
    log = evidence.get("log") or {}
    ready = evidence.get("ready_s")
    declared = evidence.get("declared_kv_cache_dtype") or "auto"
    version = evidence.get("engine_version") or log.get("engine_version") or "?"
    engine = find_kind(evidence.get("engine_kind"))
    if engine is not None and engine.short_title is not None:  # a kind that states no vLLM cache config
        kind = engine.short_title
        parts = [
            f"declared {declared} → cache_dtype={resolved_cache_dtype(evidence)}",
            f"kv_cache_size_tokens={kv_capacity_tokens(evidence)}",
            *([f"kv_cache={log['kv_cache_mib']:g} MiB"] if log.get("kv_cache_mib") is not None else []),
            *([f"flash_attn={log['flash_attn']}"] if log.get("flash_attn") else []),
            f"{kind} {version}",
            f"max_model_len={evidence.get('max_model_len')}",
        ]
    else:
        parts = [
            f"declared {declared} → cache_dtype={resolved_cache_dtype(evidence)}",
            f"kv_cache_size_tokens={kv_capacity_tokens(evidence)}",
            f"block_size={cache.get('block_size', '?')}",
            f"prefix_caching={cache.get('enable_prefix_caching', '?')}",
            f"vLLM {version}",
            f"max_model_len={evidence.get('max_model_len')}",
            f"attention={log.get('attention_backend', 'not logged')}",
        ]
    if ready is not None:
        parts.append(f"ready in {ready:.1f} s")
    if log.get("compile_cache") or log.get("compile_s") is not None:
        how = {"hit": "from the compile cache", "miss": "compiled", "partial": "partly from the compile cache"}
        seconds = f" {log['compile_s']:.1f} s" if log.get("compile_s") is not None else ""
        parts.append(f"torch.compile{seconds} {how.get(str(log.get('compile_cache')), '')}".rstrip())
    lines = [f"{boot_id}: " + ", ".join(parts)]
    lines += [f"{boot_id}: warning: {warning}" for warning in evidence.get("warnings", [])]
    return lines


def gpu_lines(boot_id: str, evidence: Evidence) -> list[str]:
    """Per-card power caps before/after, VRAM when ready, and what changed — or "no GPU"."""
    before, after = evidence.get("gpu_before") or {}, evidence.get("gpu_after") or {}
    if not before:
        return []
    if not before.get("gpu"):
        return [f"{boot_id}: GPU: none recorded ({before.get('reason', 'no GPU')})"]
    lines = []
    after_cards = {c.get("uuid"): c for c in after.get("cards") or []}
    vram = evidence.get("vram_ready_mib") or {}
    for card in before.get("cards") or []:
        uuid = card.get("uuid")
        post: GpuCard = after_cards.get(uuid) or {}
        lines.append(
            f"{boot_id}: GPU {card.get('index')} {card.get('name')} ({str(uuid)[:12]}): power cap "
            f"{card.get('power_limit_w')} W before / {post.get('power_limit_w', '?')} W after, "
            f"VRAM {vram.get(str(uuid), '?')} MiB when ready, {card.get('temp_c')}→{post.get('temp_c', '?')} °C"
        )
    lines += [f"{boot_id}: GPU change: {change}" for change in evidence.get("gpu_changes") or []]
    return lines


def boot_lines(report: Report) -> list[Line]:
    """Every boot's evidence and GPU state, in run order."""
    out: list[Line] = []
    for arm in report["arms"]:
        for boot_id, evidence in arm["evidence"].items():
            tone: Tone = "red" if evidence.get("status") == "failed" else "plain"
            out += [Line(text, tone) for text in evidence_lines(boot_id, evidence)]
            out += [Line(text) for text in gpu_lines(boot_id, evidence)]
    return out


def kv_plan_terminal(report: Report) -> list[Line]:
    """Each arm's KV tokens planned and reported; a difference over 2% flagged."""
    return [
        Line(("warning: " if flagged else "") + text, "yellow" if flagged else "plain")
        for text, flagged in kv_plan.terminal(report)
    ]


def summary_lines(report: Report) -> list[str]:
    """Per probe: n, mean, median, std, CV, min, max and excluded per point × metric × arm."""
    rows = report.get("summary") or []
    lines: list[str] = []
    specs = probe_specs(report)
    for probe in dict.fromkeys(r["probe"] for r in rows):
        if (spec := specs.get(probe)) is not None and spec.own_section:
            continue  # its own lines below (the fidelity table)
        mine = [r for r in rows if r["probe"] == probe]
        table = pd.DataFrame(
            [
                {
                    "point": r["point"],
                    "metric": r["metric"],
                    "arm": r["arm"],
                    "n": r.get("n", 0),
                    "mean": fmt(r.get("mean"), r["metric"]),
                    "median": fmt(r.get("median"), r["metric"]),
                    "std": fmt(r.get("std"), r["metric"]),
                    "min": fmt(r.get("min"), r["metric"]),
                    "max": fmt(r.get("max"), r["metric"]),
                    "cv": f"{cv:.1f}%" if (cv := r.get("cv_pct")) is not None else "-",
                    "excluded": r.get("excluded", 0),
                }
                for r in mine
            ]
        )
        lines += ["", f"{title(report, probe)} (measured samples; excluded = failed or excluded):"]
        lines += ["  " + line for line in table.to_string(index=False).splitlines()]
    return lines


def ab_lines(report: Report) -> list[str]:
    """The compact A/B table, crossovers, verdicts, boots, agreement, sampling and self-check."""
    arms = [a["name"] for a in report["arms"]]
    lines = []
    for probe, table in ab_tables(report).items():
        frame = pd.DataFrame(table, columns=["metric", *arms, *[f"{a} delta" for a in arms[1:]]])
        lines.append(f"{title(report, probe)}:")
        lines += ["  " + line for line in frame.to_string(index=False).splitlines()]
    for c in report.get("crossovers") or []:
        lines.append(
            f"crossover {c.get('arm')}/{c.get('baseline')} {c.get('probe')} {c.get('metric')}: {c.get('statement')}"
        )
    lines += [f"verdict: {v}" for v in report.get("verdicts") or []]
    ci = report.get("ci")
    if ci and ci.get("lane_order"):
        lines += [line[0].lower() + line[1:] for line in order_lines(report)]
        lines += [
            f"block {row[0]} on lane {row[1]} ({row[2]}, GPUs {row[4]}): {row[9]}" for row in block_table(report)[1]
        ]
    elif ci and ci["order"] and len(ci["order"]) > len(arms):
        lines.append("boot order: " + " → ".join(ci["order"]))
    if ci and ci["text"] and (ab_tables(report) or report.get("verdicts")):  # what the A/B's CIs cover
        lines.append(ci["text"])
    for row in agreement_table(report):
        lines.append(f"agreement {row[0]} {row[1]} {row[2]}: identical {row[3]}, first divergence {row[4]}")
    lines += greedy.lines(report.get("greedy") or [])
    for row in fidelity_table(report)[1]:
        lines.append(
            f"fidelity {row[0]} {row[1]} vs {row[2]} @ {row[3]}: |Δ logprob| {row[6]}, Δ NLL {row[7]}, KL ≥ {row[8]}"
        )
    section = report.get("energy")
    rows = energy.table(section)[1]
    if section and rows and section.get("line"):
        lines.append(str(section["line"]))
    for r in section["rows"] if section else []:
        if r["joules_per_token"] is None:
            continue
        unit = energy.per_what(r["metric"])
        lines.append(
            f"energy {r['arm']} {r['probe']}@{r['point']} {r['window']}: "
            f"{catalogue.joules_text(r['joules_per_token'])}/{unit} ({catalogue.joules_text(r['joules'])} over "
            f"{r['windows']} windows, {r['window_s'] or 0:.2f} s, "
            f"{r['mean_power_w'] or 0:.0f} W)"
        )
    lines += [f"energy: {line}" for line in section["not_reported"]] if section else []
    lines += left_out.lines(report.get("left_out"))
    lines += [f"sampling: {line}" for line in sampling_lines(report)]
    check = self_check_line(report)
    if check:
        lines.append(check)
    found = report.get("confounds") or {}
    if found.get("status") == "clean":
        lines.append(f"confounds: none ({found.get('compared', 0)} evidence paths compared)")
    return lines


def summary_terminal(report: Report) -> list[Line]:
    return [Line(text) for text in summary_lines(report)]


def agentic_terminal(report: Report) -> list[Line]:
    agentic = report.get("agentic")
    if not agentic or not agentic["turns"]:
        return []
    header, rows = agentic_table(report)
    out = [Line(""), Line("agentic decode-at-depth (per-turn means across sessions):")]
    table = pd.DataFrame(rows, columns=header).to_string(index=False).splitlines()
    return out + [Line("  " + line) for line in table + growth_lines(report)]


def capacity_terminal(report: Report) -> list[Line]:
    sessions = report.get("capacity")
    if not sessions or not sessions["rows"]:
        return []
    header, rows = capacity_render.table(sessions)
    out = [Line(""), Line(f"capacity under the SLO: {capacity_render.setup_line(sessions)}")]
    out += [Line("  " + line) for line in pd.DataFrame(rows, columns=header).to_string(index=False).splitlines()]
    return out + [Line(f"  {note}") for note in sessions["notes"]]


def spec_decode_terminal(report: Report) -> list[Line]:
    """Acceptance, or why there is none; nothing where no timed request ran (retrieval or fidelity alone)."""
    spec = report.get("spec_decode")
    timed = any(row.get("probe") not in BOOT_INVARIANT_PROBES for row in report.get("summary") or [])
    return [Line(""), Line(f"speculative decoding: {spec['line']}")] if spec and (timed or spec["rows"]) else []


def flags_terminal(report: Report) -> list[Line]:
    flags = report.get("flags")
    if not flags or not flags["samples"]:
        return []
    return [Line(f"warning: {flags['samples']} measured sample(s) flagged: {', '.join(flags['kinds'])}", "yellow")]


def notes_terminal(report: Report) -> list[Line]:
    return [Line(f"note: {n}", "yellow") for n in report.get("notes") or []]


def ab_terminal(report: Report) -> list[Line]:
    """The A/B block; its head only where there is an A/B table (a run of retrieval or fidelity alone has none)."""
    head = "A/B (ratio of means − 1, [the 95% interval its verdict was judged on]):"
    lines = [Line(text) for text in ab_lines(report)]
    return [Line(""), Line(head), *lines] if ab_tables(report) else [Line(""), *lines] if lines else []


def compare_terminal(report: Report) -> list[Line]:
    compare = report.get("compare")
    if not compare:
        return []
    out = [Line(f"against stored run {compare['baseline_run']}:")]
    for row in compare["rows"]:
        out.append(Line(f"  {row['arm']} {row['probe']}@{row['point']} {row['metric']}: {fmt_delta(row)}"))
    return out


def failures_terminal(report: Report) -> list[Line]:
    found = report.get("failures")
    if not found:
        return []
    tone: Tone = "red" if found["failed"] else "yellow" if found["excluded"] else "plain"
    out = [Line("failures and exclusions: " + found["lines"][0], tone)]
    return out + [Line(f"  {line}", tone) for line in found["lines"][1:]]


def gates_terminal(report: Report) -> list[Line]:
    out: list[Line] = []
    for g in report.get("gates") or []:
        ci = f" deciding CI {g['ci_text']}" if g["ci_low"] is not None else ""
        why = f" — {gate_evidence(g)}" if gate_evidence(g) else ""
        tone: Tone = (
            "red" if g["outcome"] in ("fail", "error") else "yellow" if g["outcome"] == "inconclusive" else "plain"
        )
        text = (
            f"gate {g['outcome'].upper()}: {g['name']} — value {g['value_text']}{ci}, needs {g['threshold_text']}{why}"
        )
        out.append(Line(text, tone))
    return out


def retrieval_terminal(report: Report) -> list[Line]:
    return [Line(text) for text in retrieval_render.terminal_lines(report)]


def cost_terminal(report: Report) -> list[Line]:
    return [Line(text) for text in cost.first_screen(report)]


def report_lines(report: Report) -> list[Line]:
    """The whole report, as the terminal shows it at the end of a run."""
    return [line for render in ordered("terminal") for line in render(report)]


def _failed_words(failed: Sequence[Mapping[str, Any]]) -> str:
    """What made the gates fail the run, by outcome: "1 gate(s) failed, 1 could not be evaluated"."""
    count = Counter(str(g.get("outcome")) for g in failed)
    parts = [f"{count['fail']} gate(s) failed"] if count["fail"] else []
    if count["error"]:
        parts.append(f"{count['error']} {'gate(s) ' if not parts else ''}could not be evaluated")
    if count["inconclusive"]:
        parts.append(f"{count['inconclusive']} {'gate(s) ' if not parts else ''}undecided (--kv-inconclusive=fail)")
    return ", ".join(parts) or f"{len(failed)} gate(s) failed"


def outcome_lines(outcome: Outcome, *, rerender: bool = False) -> list[Line]:
    """What the end of a run (or a re-render) prints: the report, the judgement and the exit code's reason."""
    out: list[Line] = []
    if rerender and outcome.written:
        out.append(Line(f"report of {outcome.run}: " + ", ".join(p.name for p in outcome.written)))
    out += [Line(m, "yellow") for m in outcome.messages]
    if outcome.report is not None:
        out += report_lines(outcome.report)
    if outcome.failed_gates and outcome.judgement is not None:
        out.append(Line(f"{_failed_words(outcome.judgement.failed_gates)}: exit code 1", "red"))
    if outcome.confounded:
        out.append(Line("the A/B is CONFOUNDED (see above): exit code 1", "red"))
    if outcome.error is not None:
        out.append(Line(f"ERROR: pytest-kvcache: the report could not be built: {outcome.error}: exit code 3", "red"))
    elif not rerender:
        out.append(Line(f"report: {outcome.run / 'report.md'} (also report.json, report.html, summary.csv)"))
    return out
