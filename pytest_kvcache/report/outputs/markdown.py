"""``report.md``: the seed-shaped tables of a :class:`~pytest_kvcache.model.Report`, and the number
formats every other writer (terminal, HTML) shares."""

from __future__ import annotations

from collections.abc import Sequence

from pytest_kvcache.metrics import catalogue
from pytest_kvcache.model import BootEntry, DeltaRow, GateResult, Json, Report, SavedRow
from pytest_kvcache.probes.registry import ProbeSpec
from pytest_kvcache.report import capacity, cost, energy, failures, greedy, left_out
from pytest_kvcache.report.fidelity import nats


def fmt(value: float | int | None, metric: str) -> str:
    """``value`` in ``metric``'s display format (``metrics.catalogue``)."""
    return catalogue.text(value, metric)


def fmt_delta(row: DeltaRow | SavedRow) -> str:
    delta, lo, hi = row.get("delta_pct"), row.get("ci_low"), row.get("ci_high")
    if delta is None:
        return "–"
    text = f"{delta:+.1f}%"
    if lo is not None and hi is not None:
        text += f" [{(lo - 1) * 100:+.1f}, {(hi - 1) * 100:+.1f}]"
    verdict = row.get("verdict")
    if row.get("verdict_note"):
        text += f" ({row['verdict_note']})"
    elif verdict and verdict != "inconclusive":
        text += f" {verdict}" + (f" ({row['provisional']})" if row.get("provisional") else "")
    elif verdict:
        text += " (inconclusive)"
    return text


SPEC_HEADER = [
    "Arm",
    "Probe",
    "Point",
    "Requests",
    "Drafts",
    "Accepted / drafted tokens",
    "Acceptance length",
    "Mean per request [95% CI]",
    "Per position",
]
SPEC_NOTE = (
    "Acceptance length = 1 + accepted / drafts (tokens per verification step); per position i: drafts whose "
    "i-th token was accepted / drafts. Deltas of `acceptance_length` and `acceptance_rate` between arms are "
    "in the probe tables above."
)


def spec_decode_rows(report: Report) -> list[list[str]]:
    """Acceptance per arm, probe and point (``report["spec_decode"]["rows"]``)."""
    spec = report.get("spec_decode")
    rows = []
    for r in spec["rows"] if spec else []:
        ci = ""
        if r["ci_low"] is not None and r["ci_high"] is not None:
            ci = f" [{r['ci_low']:.2f}, {r['ci_high']:.2f}]"
        mean = r["acceptance_length_mean"]
        rows.append(
            [
                r["arm"],
                r["probe"],
                r["point"],
                str(r["requests"]),
                f"{r['drafts']:,}",
                f"{r['accepted']:,} / {r['drafted']:,} ({r['acceptance_pct']:.1f}%)",
                f"{r['acceptance_length']:.2f}",
                (f"{mean:.2f}{ci}" if mean is not None else "–"),
                " / ".join(f"{x:.2f}" for x in r["per_position"]) or "–",
            ]
        )
    return rows


def spec_decode_lines(report: Report) -> list[str]:
    """report.md's speculative-decoding section: the setup per arm, then acceptance per arm, probe and point."""
    spec = report.get("spec_decode")
    if not spec or not spec["rows"]:
        return []
    setup = spec.get("config") or {}
    lines = ["", "## Speculative decoding", ""]
    lines += [f"- {arm}: {value or 'not stated in the engine log'}" for arm, value in setup.items()]
    lines += ["", *_md_table(SPEC_HEADER, spec_decode_rows(report)), "", SPEC_NOTE]
    return lines


def _md_table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(cells) + " |" for cells in rows]
    return lines


def _nats(value: float | None, ci: list[float | None] | None = None, digits: int = 4, small: bool = False) -> str:
    text = nats(value, digits, small=small)
    lo, hi = (ci or [None, None])[:2]
    if value is not None and lo is not None and hi is not None:
        text += f" [{nats(lo, digits, small=small)}, {nats(hi, digits, small=small)}]"
    return text


def fidelity_table(report: Report) -> tuple[list[str], list[list[str]]]:
    """The fidelity-vs-depth rows: each arm against the baseline (and each arm across its boots)."""
    section = report.get("fidelity")
    header = [
        "Comparison",
        "Arm",
        "Against",
        "Depth",
        "Texts × boots",
        "Positions",
        "Mean abs(Δ logprob) [95% CI]",
        "Δ NLL [95% CI]",
        "KL top-k ≥ [95% CI]",
        "Baseline NLL",
    ]
    rows = []
    for r in section["rows"] if section else []:
        rows.append(
            [
                r["kind"],
                r["arm"],
                r["baseline"],
                r["point"],
                f"{r['texts']} × {r['boots']}",
                f"{r['positions']:,}",
                _nats(r.get("logprob_drift"), r.get("logprob_drift_ci")),
                _nats(r.get("nll_delta"), r.get("nll_delta_ci")),
                _nats(r.get("kl_topk"), r.get("kl_topk_ci"), small=True),
                _nats(r.get("baseline_nll"), None, 3),
            ]
        )
    return header, rows


def fidelity_lines(report: Report) -> list[str]:
    """report.md's fidelity section: the setup, the table, how to read it, what was left out."""
    section = report.get("fidelity")
    if not section or (not section["rows"] and not section["notes"]):
        return []
    cfg = section["config"]
    texts = cfg.get("texts") or {}
    listed = ""
    if isinstance(texts, dict):
        listed = ", ".join(f"{name} (sha256 {str(sha)[:12]}…)" for name, sha in texts.items())
    lines = ["", "## Fidelity at depth (teacher-forced, against the baseline arm)", ""]
    lines += [
        f"Texts: {listed or '–'}; the last {cfg.get('window')} positions before each depth scored, "
        f"top-{cfg.get('top_k')} logprobs, CIs over blocks of {cfg.get('block')} positions "
        "(over boots with 3+ boots per arm).",
        "",
    ]
    header, rows = fidelity_table(report)
    if rows:
        lines += _md_table(header, rows)
        lines += [
            "",
            "Nats per token. |Δ logprob|: of the text's actual next token; Δ NLL: the arm's negative log-likelihood "
            "minus the baseline's (> 0: the arm finds the text less likely); KL(baseline ‖ arm) over the tokens both "
            'returned plus the rest, a lower bound of the true KL. "across boots": an arm\'s later boots against its '
            "first — the measure's noise floor.",
        ]
    lines += [f"- {n}" for n in section["notes"]]
    return lines


def energy_lines(report: Report) -> list[str]:
    """report.md's energy section: how it was measured, then J per token per arm, probe, point and window."""
    section = report.get("energy")
    if section is None:
        return []
    header, rows = energy.table(section)
    line = section.get("line")
    if not rows and not line:
        return []
    lines = ["", "## Energy per token", ""]
    if line:
        lines += [str(line), ""]
    if rows:
        lines += _md_table(header, rows)
        lines += ["", ENERGY_NOTE]
    missing = section.get("not_reported") or []
    if missing:
        lines += ["", *[f"- {m}" for m in missing]]
    return lines


ENERGY_NOTE = (
    "Per token: Σ joules / Σ tokens over a boot's windows at the point, averaged over the boots reported; the "
    "deltas and their CIs are in the probe tables above (`energy_per_token`, `energy_per_prompt_token`)."
)


def probe_specs(report: Report) -> dict[str, ProbeSpec]:
    """The probe specs the report was built with (``report["probes"]``), for titles and labels."""
    return {d["name"]: ProbeSpec.from_dict(d) for d in report.get("probes") or []}


def title(report: Report, probe: str) -> str:
    spec = probe_specs(report).get(probe)
    return spec.title if spec else probe


def _label(spec: ProbeSpec | None, probe: str, point: str, metric: str) -> str:
    label = spec.label if spec else "plain"
    if label == "shape":
        return f"{point.capitalize()} {metric}"
    if label == "at":
        return f"{metric} @ {point}"
    return f"{probe} {point} {metric}"


def ab_rows(report: Report) -> list[tuple[str, list[str], list[DeltaRow | None]]]:
    """Per probe × point × metric, in summary order: (probe, [label, mean per arm…], [delta per other arm])
    — the cells of the seed's ``Metric | A | B | B delta`` tables, with the delta rows for who marks them."""
    arms = [a["name"] for a in report["arms"]]
    specs = probe_specs(report)
    means = {(s["probe"], s["point"], s["metric"], s["arm"]): s for s in report["summary"]}
    deltas = {(d["probe"], d["point"], d["metric"], d["arm"]): d for d in report["deltas"]}
    rows: list[tuple[str, list[str], list[DeltaRow | None]]] = []
    seen: set[tuple[str, str, str]] = set()
    found = report.get("failures")
    empty = {(e["probe"], e["point"], e["arm"]): e for e in (found["empty_points"] if found else [])}
    keys = [(s["probe"], s["point"], s["metric"]) for s in report["summary"]]
    # a point where every measured request failed has no summary row: it shows as failed, not as missing
    listed = {(p, q) for p, q, _ in keys}
    for probe, point, _ in empty:
        spec = specs.get(probe)
        if (probe, point) not in listed and spec is not None:
            keys.append((probe, point, spec.primary_metric))
            listed.add((probe, point))
    for key in keys:
        spec = specs.get(key[0])
        if key in seen or (spec is not None and spec.own_section):
            continue
        seen.add(key)
        probe, point, metric = key
        cells = [_label(specs.get(probe), probe, point, metric)]
        for arm in arms:
            stat = means.get((probe, point, metric, arm))
            gone = empty.get((probe, point, arm))
            if gone is not None:
                cells.append(f"FAILED ({gone['requests']} of {gone['requests']}: {', '.join(gone['kinds'])})")
                continue
            cells.append(
                fmt(stat.get("mean"), metric) + (f" (n={stat.get('n')})" if stat.get("n") != 1 else "") if stat else "–"
            )
        rows.append((probe, cells, [deltas.get((probe, point, metric, arm)) for arm in arms[1:]]))
    return rows


def failure_lines(report: Report) -> list[str]:
    """report.md's "Failures and exclusions" section (always there: none is a finding too)."""
    found = report.get("failures")
    if not found:
        return []
    lines = ["", "## Failures and exclusions", "", found["lines"][0]]
    rows = failures.table(found)
    if rows:
        lines += ["", *_md_table(failures.HEADER, rows)]
    return lines


def ab_tables(report: Report) -> dict[str, list[list[str]]]:
    """Per probe: rows ``Metric | A | B | B delta …`` (the seed's table shape), one column pair per arm."""
    tables: dict[str, list[list[str]]] = {}
    for probe, cells, deltas in ab_rows(report):
        tables.setdefault(probe, []).append([*cells, *(fmt_delta(d) if d else "–" for d in deltas)])
    return tables


def boot_table(report: Report) -> tuple[list[str], list[list[str]]]:
    """Rows = boots in run order; columns = each probe point's primary metric (mean, n)."""
    results = report.get("boot_results") or []
    columns = list(dict.fromkeys((r["probe"], r["point"], r["metric"]) for r in results))
    by = {(r["boot"], r["probe"], r["point"], r["metric"]): r for r in results}
    boots = report.get("boots") or []
    compiled = any(b.get("compile_cache") or b.get("compile_s") is not None for b in boots)
    header = ["#", "Boot", "Arm", "Status", "Ready after", *(["Compile"] if compiled else [])]
    header += [f"{p}@{q} {m}" for p, q, m in columns]
    rows = []
    for b in boots:
        status = b["status"] + (" (adaptive)" if b.get("extra") else "")
        cells = [str(b["position"]), b["boot"], str(b["arm"]), status, fmt(b.get("ready_s"), "ready_s")]
        if compiled:
            cells.append(compile_cell(b))
        for p, q, m in columns:
            r = by.get((b["boot"], p, q, m))
            cells.append(f"{fmt(r['mean'], m)} (n={r['n']})" if r else "–")
        rows.append(cells)
    return header, rows


def block_table(report: Report) -> tuple[list[str], list[list[str]]]:
    """A pytest-xdist run's blocks: where each ran (lane, workers, host, cards, their models, driver,
    engine), its boots in order and what became of it."""
    header = ["Block", "Lane", "Worker", "Host", "GPUs", "GPU model", "Driver", "Engine", "Boots", "Status"]
    rows = [
        [
            str(b["block"]),
            str(b["lane"]),
            ", ".join(b["workers"]) or "–",
            b["host"] or "–",
            b["gpus"] or "all",
            ", ".join(b["gpu_models"]) or "–",
            b["driver"] or "–",
            b["engine_version"] or "–",
            " → ".join(b["boots"]),
            b["status"],
        ]
        for b in report.get("blocks") or []
    ]
    return header, rows


def order_lines(report: Report) -> list[str]:
    """The boot order: one line, or one per lane in a pytest-xdist run."""
    ci = report.get("ci") or {}
    lanes = ci.get("lane_order")
    if lanes:
        return [f"Order on {lane}: " + " → ".join(boots) for lane, boots in lanes.items()]
    return ["Order: " + " → ".join(ci["order"])] if ci.get("order") else []


def compile_cell(boot: BootEntry) -> str:
    """``compiled 46.3 s`` / ``cache 2.1 s`` / ``–``: how this boot's engine got its torch.compile graphs."""
    kind = {"miss": "compiled", "hit": "cache", "partial": "partly cached"}.get(str(boot.get("compile_cache")), "")
    seconds = boot.get("compile_s")
    text = " ".join(p for p in (kind, f"{seconds:.1f} s" if seconds is not None else "") if p)
    return text or "–"


def confound_lines(report: Report) -> list[str]:
    found = report.get("confounds") or {}
    status = found.get("status")
    if status == "CONFOUNDED":
        lines = [
            f"**CONFOUNDED** — the boots differ in ways the arms do not declare (compared with "
            f"{found.get('reference')} and each arm's first boot; allow one with --kv-allow-diff=PATH):",
            "",
        ]
        lines += [f"- {line}" for line in found.get("lines") or []]
    elif status == "clean":
        lines = [
            f"Clean: {found.get('compared', 0)} evidence paths compared across boots; every difference is "
            "declared by the arms or allowed."
        ]
    else:
        return [f"Not checked: {found.get('reason') or 'no evidence'}."]
    declared = found.get("declared") or []
    if declared:
        lines += ["", "Declared differences (expected):"]
        seen = set()
        for d in declared:
            key = (d["path"], json_text(d["reference_value"]), json_text(d["value"]))
            if key in seen:
                continue
            seen.add(key)
            lines.append(
                f"- {d['path']}: {json_text(d['reference_value'])} ({d['reference']}) → "
                f"{json_text(d['value'])} ({d['boot']}) — {d.get('why', 'declared')}"
            )
    for a in found.get("allowed") or []:
        lines.append(
            f"- allowed by --kv-allow-diff={a['allowed_by']}: {a['path']}: {json_text(a['reference_value'])} → "
            f"{json_text(a['value'])} ({a['boot']})"
        )
    return lines


def json_text(value: Json) -> str:
    return "absent" if value is None else str(value)


def agreement_table(report: Report) -> list[list[str]]:
    rows = []
    for r in report["agreement"]["rows"] if "agreement" in report else []:
        who = f"{r['arm']} vs {r['baseline']}" if r["kind"] == "between arms" else r["arm"]
        lp = r.get("mean_abs_logprob_diff")
        rows.append(
            [
                r["kind"],
                who,
                r["shape"],
                f"{r['identical_share'] * 100:.0f}% of {r['pairs']}",
                "–" if r.get("mean_first_divergence") is None else f"{r['mean_first_divergence']:.1f} of {r['length']}",
                "–" if lp is None else f"{lp:.2e}",
            ]
        )
    return rows


def sampling_lines(report: Report) -> list[str]:
    lines = []
    for s in report.get("sampling") or []:
        if s.get("kind") == "rounds":
            lines.append(f"round {s['round']}: {s['decision']} — {s['reason']}")
        else:
            lines.append(f"{s.get('probe')}@{s.get('point')} on {s.get('boot')}: {s.get('reason')}")
    return lines


def client_load_line(report: Report) -> str | None:
    """The concurrency probe's client load in one sentence, naming the trials it was saturated in."""
    load = report.get("client_load")
    if not load:
        return None
    line = (
        f"Many-stream client over {load['trials']} measured concurrency trial(s) ({load['processes_max']} "
        f"process(es) at most): busiest process {100 * load['cpu_share_max']:.0f}% of a core, event-loop lag p99 "
        f"≤ {1e3 * load['loop_lag_p99_max_s']:.2f} ms (its timer woke ≤ {1e3 * load['timer_lag_p99_max_s']:.1f} ms "
        f"late, p99), requests sent ≤ {1e3 * load['schedule_delay_max_s']:.1f} ms after their time"
    )
    saturated = load["saturated"]
    if not saturated:
        return line + "; never saturated."
    named = "; ".join(f"{s['arm']} {s['point']} trial {s['trial']} ({', '.join(s['reasons'])})" for s in saturated[:4])
    return (
        f"{line}; saturated in {len(saturated)} trial(s), whose figures are the client's and are excluded: "
        f"{named}{' …' if len(saturated) > 4 else ''} (--kv-client-procs)."
    )


def self_check_line(report: Report) -> str | None:
    check = report.get("self_check")
    if not check:
        return None
    if check.get("error"):
        return f"Measuring-client self-check failed: {check['error']}"
    summary = check.get("summary")
    return str(summary) if summary else None


def agentic_table(report: Report) -> tuple[list[str], list[list[str]]]:
    """Rows = turns; columns = mean prompt tokens, then TTFT and decode TPS per arm."""
    turns = (report.get("agentic") or {"turns": []})["turns"]
    arms = [a["name"] for a in report["arms"] if any(t["arm"] == a["name"] for t in turns)]
    by = {(t["arm"], t["turn"]): t for t in turns}
    numbers = sorted({t["turn"] for t in turns})
    header = ["Turn", "Prompt tokens", *[f"{arm} {what}" for arm in arms for what in ("TTFT", "decode_tps")]]
    rows = []
    for turn in numbers:
        tokens = [v for arm in arms if (v := by.get((arm, turn), {}).get("prompt_tokens")) is not None]
        cells = [str(turn), fmt(sum(tokens) / len(tokens), "prompt_tokens") if tokens else "–"]
        for arm in arms:
            t = by.get((arm, turn), {})
            cells += [fmt(t.get("ttft_s"), "ttft_s"), fmt(t.get("decode_tps"), "decode_tps")]
        rows.append(cells)
    return header, rows


def growth_lines(report: Report) -> list[str]:
    """Each arm's TTFT-growth verdict and its per-turn flags (e.g. a turn whose TTFT is 2× the warm one)."""
    lines = []
    for g in (report.get("agentic") or {"growth": []})["growth"]:
        lines.append(g.get("line") or f"{g.get('arm')}: {g.get('verdict')}")
        lines += [f"{g.get('arm')}: turn {turn}: {note}" for turn, note in (g.get("flags") or {}).items()]
    return lines


def arms_table(report: Report) -> tuple[list[str], list[list[str]]]:
    """Each arm as declared and as the engine resolved it."""
    header = [
        "Arm",
        "Declared KV dtype",
        "Resolved cache_dtype",
        "Attention backend",
        "KV capacity (tokens)",
        "Engine",
        "Ready after",
    ]
    rows = []
    for a in report["arms"]:
        r = a["resolved"]
        rows.append(
            [
                a["name"] + (" (baseline)" if a["baseline"] else ""),
                str((a.get("declared") or {}).get("kv_cache_dtype") or "default"),
                str(r.get("cache_dtype") or "?"),
                str(r.get("attention_backend") or "not logged"),
                fmt(r.get("kv_cache_size_tokens"), "kv_cache_size_tokens"),
                str(r.get("engine_version") or "?"),
                fmt(r.get("ready_s"), "ready_s"),
            ]
        )
    return header, rows


def gpu_table(report: Report) -> tuple[list[str], list[list[str]]]:
    """Per arm and card: power caps before and after, VRAM when ready and after the probes."""
    header = ["Arm", "GPU", "Power cap before", "Power cap after", "VRAM when ready", "VRAM after probes"]
    rows = []
    for a in report["arms"]:
        info = a.get("gpu") or {}
        for card in info.get("cards") or []:
            rows.append(
                [
                    a["name"],
                    f"{card['index']} {card.get('name') or ''}".strip(),
                    fmt(card.get("power_limit_before_w"), "w") + " W",
                    fmt(card.get("power_limit_after_w"), "w") + " W",
                    fmt(card.get("vram_ready_mib"), "prompt_tokens") + " MiB",
                    fmt(card.get("vram_before_stop_mib"), "prompt_tokens") + " MiB",
                ]
            )
    return header, rows


def note_lines(report: Report) -> list[str]:
    """The report's notes, with the noise band, the self-check, flagged samples and speculation off."""
    noise = report.get("noise")
    check = self_check_line(report)
    notes = list(report.get("notes") or [])
    if noise:
        notes.append(
            f"verdicts and ratio gates are judged against the A/A noise band of stored run {noise['run']} "
            f"(a CI must clear 1 ± band); {noise['missing']} delta(s) had no band there"
        )
    if check:
        notes.append(check)
    notes += (report.get("self_check") or {}).get("warnings") or []
    load = client_load_line(report)
    if load:
        notes.append(load)
    flags = report.get("flags")
    if flags and flags["samples"]:
        notes.append(f"{flags['samples']} measured sample(s) flagged: {', '.join(flags['kinds'])}")
    spec = report.get("spec_decode")
    if spec and not spec["rows"]:
        notes.append(f"speculative decoding: {spec['line']}")
    return notes


#: What every delta in the report is (report.md's and report.html's last words).
DELTA_NOTE = (
    "Deltas: ratio of means arm/baseline − 1, with the 95% CI in brackets — over boots with 3+ boots per arm (a "
    "t-interval on the log of the boot means), else the within-boot bootstrap CI, paired by request or turn where "
    "the probe pairs them, whose verdict is judged on it widened by the default boot-to-boot band (or the A/A "
    "noise band); verdict direction-aware, inconclusive when that CI contains 0."
)


def gate_evidence(gate: GateResult) -> str:
    """What decided a gate, and for an open one how many more boots would likely decide it."""
    text = (gate.get("evidence") or {}).get("text") or gate.get("reason") or ""
    if gate["outcome"] == "inconclusive" and "boots_to_decide" in gate:
        more = gate.get("boots_to_decide")
        text += f"; likely decided by {more} more boot(s) per arm" if more else "; not within reach of more boots"
    return text


def gate_table(gates: Sequence[GateResult]) -> list[str]:
    """The gates as a table: outcome, name, value, CI, threshold and deciding evidence."""
    return _md_table(
        ["Outcome", "Gate", "Value", "95% CI", "Threshold", "Decided by"],
        [
            [
                g["outcome"].upper(),
                g["name"],
                g.get("value_text", "–"),
                g.get("ci_text", "–"),
                g.get("threshold_text", "–"),
                gate_evidence(g),
            ]
            for g in gates
        ],
    )


def gate_summary(report: Report) -> str:
    """The gates first, for the GitHub step summary: a headline with the counts, then the table."""
    gates = report.get("gates") or []
    if not gates:
        return ""
    counts = {k: sum(1 for g in gates if g["outcome"] == k) for k in ("fail", "inconclusive", "pass")}
    head = ", ".join(f"{n} {k.upper()}" for k, n in counts.items() if n)
    return "\n".join([f"## pytest-kvcache gates: {head}", "", *gate_table(gates), ""]) + "\n"


def markdown(report: Report, plots: Sequence[str] = ()) -> str:
    """report.md; ``plots`` are the PNG files written beside it (linked at the end)."""
    gates = report.get("gates") or []
    arms = [a["name"] for a in report["arms"]]
    lines = [f"# pytest-kvcache A/B report — run {report.get('run_id')}", ""]
    if report.get("model"):
        lines += [f"Model: `{report['model']}`", ""]
    first = cost.first_screen(report)
    if first:
        lines += [*first, ""]
    lines += ["## Arms", ""]
    lines += _md_table(*arms_table(report))
    gpu_header, gpu_rows = gpu_table(report)
    if gpu_rows:
        lines += ["", "## GPU state", ""]
        lines += _md_table(gpu_header, gpu_rows)
    elif report["arms"] and (report["arms"][0].get("gpu") or {}).get("reason"):
        lines += ["", f"GPU state: none recorded ({report['arms'][0]['gpu']['reason']})."]
    if report.get("boots"):
        lines += ["", "## Boots and order", ""]
        ci = report.get("ci")
        order = order_lines(report)
        if order:
            lines += [*order, ""]
        if ci and ci["text"]:
            lines += [ci["text"], ""]
        header, rows = boot_table(report)
        lines += _md_table(header, rows)
        if report.get("compile_cache"):
            lines += ["", *[f"Compile cache — {line}" for line in report["compile_cache"]]]
        skipped = [b for b in report["boots"] if b.get("skipped")]
        if skipped:
            lines += ["", *[f"- {b['boot']} not booted: {b['skipped']}" for b in skipped]]
    if report.get("blocks"):
        lines += ["", "## Blocks (pytest-xdist lanes)", ""]
        lines += _md_table(*block_table(report))
    if report.get("confounds"):
        lines += ["", "## Confounds", "", *confound_lines(report)]
    header_tail = [f"{arm} delta" for arm in arms[1:]]
    for probe, table in ab_tables(report).items():
        lines += ["", f"## {title(report, probe)}", ""]
        lines += _md_table(["Metric", *arms, *header_tail], table)
    lines += fidelity_lines(report)
    lines += energy_lines(report)
    lines += capacity.lines(report)
    agreement = agreement_table(report)
    notes = report["agreement"]["notes"] if "agreement" in report else []
    if agreement or notes:
        lines += ["", "## Output agreement (greedy token ids, unmeasured requests)", ""]
        if agreement:
            lines += _md_table(
                ["Comparison", "Arms", "Shape", "Identical", "First divergence (mean index)", "Mean abs(Δ logprob)"],
                agreement,
            )
        lines += [f"- not available: {n}" for n in notes]
    lines += ["", *greedy.markdown(report.get("greedy") or [])] if report.get("greedy") else []
    agentic = report.get("agentic") or {"turns": [], "growth": []}
    if agentic["turns"]:
        lines += ["", "## Agentic turns (means across sessions)", ""]
        header, rows = agentic_table(report)
        lines += _md_table(header, rows)
        lines += [""] + [f"- {line}" for line in growth_lines(report)]
    lines += spec_decode_lines(report)
    found = left_out.markdown(report.get("left_out"))
    lines += ["", *found] if found else []
    compare = report.get("compare")
    if compare:
        lines += ["", f"## Against stored run {compare['baseline_run']}", ""]
        lines += _md_table(
            ["Arm", "Probe", "Point", "Metric", "Delta vs stored"],
            [[r["arm"], r["probe"], r["point"], r["metric"], fmt_delta(r)] for r in compare["rows"]],
        )
        lines += [f"- warning: {w}" for w in compare["warnings"]]
    crossovers = report.get("crossovers") or []
    if crossovers:
        lines += ["", "## Crossover", ""]
        lines += [f"- {c['arm']}/{c['baseline']} {c['probe']} {c['metric']}: {c['statement']}" for c in crossovers]
    if report.get("verdicts"):
        lines += ["", "## Verdict", ""]
        lines += [f"- {v}" for v in report["verdicts"]]
    lines += failure_lines(report)
    if gates:
        lines += ["", "## Gates", "", *gate_table(gates)]
    sampling = sampling_lines(report)
    if sampling:
        lines += ["", "## Sampling", ""] + [f"- {line}" for line in sampling]
    notes = note_lines(report)
    if notes:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in notes]
    lines += ["", DELTA_NOTE]
    if plots:
        lines += ["", "## Plots", ""] + [f"![{name[:-4]}]({name})" for name in plots]
    return "\n".join(lines) + "\n"
