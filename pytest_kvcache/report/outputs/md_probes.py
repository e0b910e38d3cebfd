"""``report.md``'s sections of measurements: a table per probe (the seed's ``Metric | A | B | B delta``),
fidelity, energy, output agreement, greedy texts, agentic turns, speculative decoding and what was left
out — one renderer each (``(report) -> lines``), and the tables the terminal and ``report.html`` share."""

from __future__ import annotations

from pytest_kvcache.model.report import DeltaRow, Report
from pytest_kvcache.probes.registry import ProbeSpec
from pytest_kvcache.report import energy, greedy, left_out
from pytest_kvcache.report.fidelity import nats
from pytest_kvcache.report.outputs.formats import Column, _md_table, columns, fmt, fmt_delta, probe_specs, title

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
    "i-th token was accepted / drafts. The mean's CI is over prompts (each prompt's requests averaged, every "
    "boot's: acceptance is deterministic across boots), none with fewer than 3 prompts. Deltas of "
    "`acceptance_length` and `acceptance_rate` between arms are in the probe tables above."
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


def _nats(value: float | None, ci: list[float | None] | None = None, digits: int = 4, small: bool = False) -> str:
    text = nats(value, digits, small=small)
    lo, hi = (ci or [None, None])[:2]
    if value is not None and lo is not None and hi is not None:
        text += f" [{nats(lo, digits, small=small)}, {nats(hi, digits, small=small)}]"
    elif value is not None and ci is not None:  # a CI was due: fewer than 3 texts (the intro says so)
        text += " [no CI]"
    return text


def fidelity_table(report: Report) -> tuple[list[str], list[list[str]]]:
    """The fidelity-vs-depth rows: each arm against the baseline (and each arm across its boots)."""
    section = report.get("fidelity")
    return columns(section["rows"] if section else [], FIDELITY_COLUMNS)


FIDELITY_COLUMNS: tuple[Column, ...] = (
    ("Comparison", lambda r: r["kind"]),
    ("Arm", lambda r: r["arm"]),
    ("Against", lambda r: r["baseline"]),
    ("Depth", lambda r: r["point"]),
    ("Texts × boots", lambda r: f"{r['texts']} × {r['boots']}"),
    ("Positions", lambda r: f"{r['positions']:,}"),
    ("Mean abs(Δ logprob) [95% CI]", lambda r: _nats(r.get("logprob_drift"), r.get("logprob_drift_ci"))),
    ("Δ NLL [95% CI]", lambda r: _nats(r.get("nll_delta"), r.get("nll_delta_ci"))),
    ("KL top-k ≥ [95% CI]", lambda r: _nats(r.get("kl_topk"), r.get("kl_topk_ci"), small=True)),
    ("Baseline NLL", lambda r: _nats(r.get("baseline_nll"), None, 3)),
)


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
        f"top-{cfg.get('top_k')} logprobs, positions averaged in blocks of {cfg.get('block')}; CIs over texts "
        "(each text's mean of its blocks, averaged over its boots: a t-interval over those means; no CI with fewer "
        "than 3 texts — the scores are deterministic across boots, so only texts replicate them).",
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


def ab_tables(report: Report) -> dict[str, list[list[str]]]:
    """Per probe: rows ``Metric | A | B | B delta …`` (the seed's table shape), one column pair per arm."""
    tables: dict[str, list[list[str]]] = {}
    for probe, cells, deltas in ab_rows(report):
        tables.setdefault(probe, []).append([*cells, *(fmt_delta(d) if d else "–" for d in deltas)])
    return tables


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


def render_probe_tables(report: Report) -> list[str]:
    """A table per probe: ``Metric | A | B | B delta …``."""
    arms = [a["name"] for a in report["arms"]]
    header_tail = [f"{arm} delta" for arm in arms[1:]]
    lines: list[str] = []
    for probe, table in ab_tables(report).items():
        lines += ["", f"## {title(report, probe)}", ""]
        lines += _md_table(["Metric", *arms, *header_tail], table)
    return lines


def render_agreement(report: Report) -> list[str]:
    agreement = agreement_table(report)
    notes = report["agreement"]["notes"] if "agreement" in report else []
    if not agreement and not notes:
        return []
    lines = ["", "## Output agreement (greedy token ids, unmeasured requests)", ""]
    if agreement:
        lines += _md_table(
            ["Comparison", "Arms", "Shape", "Identical", "First divergence (mean index)", "Mean abs(Δ logprob)"],
            agreement,
        )
    lines += [f"- not available: {n}" for n in notes]
    return lines


def render_greedy(report: Report) -> list[str]:
    return ["", *greedy.markdown(report.get("greedy") or [])] if report.get("greedy") else []


def render_agentic(report: Report) -> list[str]:
    agentic = report.get("agentic") or {"turns": [], "growth": []}
    if not agentic["turns"]:
        return []
    lines = ["", "## Agentic turns (means across sessions)", ""]
    header, rows = agentic_table(report)
    lines += _md_table(header, rows)
    lines += [""] + [f"- {line}" for line in growth_lines(report)]
    return lines


def render_left_out(report: Report) -> list[str]:
    found = left_out.markdown(report.get("left_out"))
    return ["", *found] if found else []
