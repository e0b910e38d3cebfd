"""Report files from a report dict: ``report.md`` (seed-shaped tables), ``summary.csv``, ``report.html``
with PNG plots (matplotlib, no display), and the compact terminal A/B table."""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from pytest_kvcache.analysis import dumps

PLOTS = ("short.png", "prefill.png", "agentic.png")


def fmt(value: Any, metric: str) -> str:
    if value is None or value != value:
        return "–"
    if metric.endswith("_s"):
        return f"{value:.3f} s" if abs(value) >= 1 else f"{value * 1000:.0f} ms"
    if metric in ("prompt_tokens", "cached_tokens", "kv_cache_size_tokens"):
        return f"{value:,.0f}"
    return f"{value:,.2f}"


def fmt_delta(row: Mapping[str, Any]) -> str:
    if row.get("delta_pct") is None:
        return "–"
    text = f"{row['delta_pct']:+.1f}%"
    if row.get("ci_low") is not None:
        text += f" [{(row['ci_low'] - 1) * 100:+.1f}, {(row['ci_high'] - 1) * 100:+.1f}]"
    verdict = row.get("verdict")
    if row.get("verdict_note"):
        text += f" ({row['verdict_note']})"
    elif verdict and verdict != "inconclusive":
        text += f" {verdict}"
    elif verdict:
        text += " (inconclusive)"
    return text


def _md_table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(cells) + " |" for cells in rows]
    return lines


def _label(probe: str, point: str, metric: str) -> str:
    if probe == "short":
        return f"{point.capitalize()} {metric}"
    if probe == "prefill":
        return f"{metric} @ {point}"
    if probe == "agentic":
        return f"{metric} @ {point}"
    return f"{probe} {point} {metric}"


def ab_tables(report: Mapping[str, Any]) -> dict[str, list[list[str]]]:
    """Per probe: rows ``Metric | A | B | B delta …`` (the seed's table shape), one column pair per arm."""
    arms = [a["name"] for a in report["arms"]]
    means = {(s["probe"], s["point"], s["metric"], s["arm"]): s for s in report["summary"]}
    deltas = {(d["probe"], d["point"], d["metric"], d["arm"]): d for d in report["deltas"]}
    tables: dict[str, list[list[str]]] = {}
    seen: set[tuple[str, str, str]] = set()
    for s in report["summary"]:
        key = (s["probe"], s["point"], s["metric"])
        if key in seen:
            continue
        seen.add(key)
        probe, point, metric = key
        row = [_label(probe, point, metric)]
        for arm in arms:
            stat = means.get((probe, point, metric, arm))
            row.append(
                fmt(stat["mean"], metric) + (f" (n={stat['n']})" if stat and stat["n"] != 1 else "") if stat else "–"
            )
        for arm in arms[1:]:
            delta = deltas.get((probe, point, metric, arm))
            row.append(fmt_delta(delta) if delta else "–")
        tables.setdefault(probe, []).append(row)
    return tables


PROBE_TITLES = {
    "short": "Short-context probes",
    "prefill": "Fresh-prefill probes",
    "agentic": "Agentic decode-at-depth",
    "concurrency": "Concurrency (per trial: aggregate TPS, median per-stream decode TPS, p95 TTFT)",
}


def boot_table(report: Mapping[str, Any]) -> tuple[list[str], list[list[str]]]:
    """Rows = boots in run order; columns = each probe point's primary metric (mean, n)."""
    results = report.get("boot_results") or []
    columns = list(dict.fromkeys((r["probe"], r["point"], r["metric"]) for r in results))
    by = {(r["boot"], r["probe"], r["point"], r["metric"]): r for r in results}
    header = ["#", "Boot", "Arm", "Status", "Ready after", *[f"{p}@{q} {m}" for p, q, m in columns]]
    rows = []
    for b in report.get("boots") or []:
        status = b["status"] + (" (adaptive)" if b.get("extra") else "")
        cells = [str(b["position"]), b["boot"], str(b["arm"]), status, fmt(b.get("ready_s"), "ready_s")]
        for p, q, m in columns:
            r = by.get((b["boot"], p, q, m))
            cells.append(f"{fmt(r['mean'], m)} (n={r['n']})" if r else "–")
        rows.append(cells)
    return header, rows


def confound_lines(report: Mapping[str, Any]) -> list[str]:
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


def json_text(value: Any) -> str:
    return "absent" if value is None else str(value)


def agreement_table(report: Mapping[str, Any]) -> list[list[str]]:
    rows = []
    for r in (report.get("agreement") or {}).get("rows") or []:
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


def sampling_lines(report: Mapping[str, Any]) -> list[str]:
    lines = []
    for s in report.get("sampling") or []:
        if s.get("kind") == "rounds":
            lines.append(f"round {s['round']}: {s['decision']} — {s['reason']}")
        else:
            lines.append(f"{s.get('probe')}@{s.get('point')} on {s.get('boot')}: {s.get('reason')}")
    return lines


def self_check_line(report: Mapping[str, Any]) -> str | None:
    check = report.get("self_check")
    if not check:
        return None
    if check.get("error"):
        return f"Measuring-client self-check failed: {check['error']}"
    summary = check.get("summary")
    return str(summary) if summary else None


def markdown(report: Mapping[str, Any], gates: Sequence[Mapping[str, Any]] = ()) -> str:
    arms = [a["name"] for a in report["arms"]]
    lines = [f"# pytest-kvcache A/B report — run {report.get('run_id')}", ""]
    if report.get("model"):
        lines += [f"Model: `{report['model']}`", ""]
    lines += ["## Arms", ""]
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
    lines += _md_table(
        [
            "Arm",
            "Declared KV dtype",
            "Resolved cache_dtype",
            "Attention backend",
            "KV capacity (tokens)",
            "Engine",
            "Ready after",
        ],
        rows,
    )
    gpu_rows = []
    for a in report["arms"]:
        info = a.get("gpu") or {}
        for card in info.get("cards") or []:
            gpu_rows.append(
                [
                    a["name"],
                    f"{card['index']} {card.get('name') or ''}".strip(),
                    fmt(card.get("power_limit_before_w"), "w") + " W",
                    fmt(card.get("power_limit_after_w"), "w") + " W",
                    fmt(card.get("vram_ready_mib"), "prompt_tokens") + " MiB",
                    fmt(card.get("vram_before_stop_mib"), "prompt_tokens") + " MiB",
                ]
            )
    if gpu_rows:
        lines += ["", "## GPU state", ""]
        lines += _md_table(
            ["Arm", "GPU", "Power cap before", "Power cap after", "VRAM when ready", "VRAM after probes"], gpu_rows
        )
    elif report["arms"] and (report["arms"][0].get("gpu") or {}).get("reason"):
        lines += ["", f"GPU state: none recorded ({report['arms'][0]['gpu']['reason']})."]
    if report.get("boots"):
        ci = report.get("ci") or {}
        lines += ["", "## Boots and order", ""]
        if ci.get("order"):
            lines += ["Order: " + " → ".join(ci["order"]), ""]
        if ci.get("text"):
            lines += [ci["text"], ""]
        header, rows = boot_table(report)
        lines += _md_table(header, rows)
        skipped = [b for b in report["boots"] if b.get("skipped")]
        if skipped:
            lines += ["", *[f"- {b['boot']} not booted: {b['skipped']}" for b in skipped]]
    if report.get("confounds"):
        lines += ["", "## Confounds", "", *confound_lines(report)]
    header_tail = [f"{arm} delta" for arm in arms[1:]]
    for probe, table in ab_tables(report).items():
        lines += ["", f"## {PROBE_TITLES.get(probe, probe)}", ""]
        lines += _md_table(["Metric", *arms, *header_tail], table)
    agreement = agreement_table(report)
    notes = (report.get("agreement") or {}).get("notes") or []
    if agreement or notes:
        lines += ["", "## Output agreement (greedy token ids, unmeasured requests)", ""]
        if agreement:
            lines += _md_table(
                ["Comparison", "Arms", "Shape", "Identical", "First divergence (mean index)", "Mean |Δ logprob|"],
                agreement,
            )
        lines += [f"- not available: {n}" for n in notes]
    crossovers = report.get("crossovers") or []
    if crossovers:
        lines += ["", "## Crossover", ""]
        lines += [f"- {c['probe']} {c['metric']}: {c['statement']}" for c in crossovers]
    if report.get("verdicts"):
        lines += ["", "## Verdict", ""]
        lines += [f"- {v}" for v in report["verdicts"]]
    if gates:
        lines += ["", "## Gates", ""]
        lines += _md_table(
            ["Gate", "Outcome", "Value", "95% CI", "Threshold"],
            [
                [
                    g["name"],
                    g["outcome"].upper(),
                    g.get("value_text", "–"),
                    g.get("ci_text", "–"),
                    g.get("threshold_text", "–"),
                ]
                for g in gates
            ],
        )
    sampling = sampling_lines(report)
    if sampling:
        lines += ["", "## Sampling", ""] + [f"- {line}" for line in sampling]
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
    if notes:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in notes]
    lines += [
        "",
        "Deltas: ratio of means arm/baseline − 1, with the 95% bootstrap CI in brackets — over boots (boots,",
        "then samples) with 3+ boots per arm, else within boots, paired by request or turn where the probe",
        "pairs them; verdict direction-aware, inconclusive when the CI contains 0.",
    ]
    return "\n".join(lines) + "\n"


def summary_csv(report: Mapping[str, Any]) -> str:
    rows = [{k: v for k, v in s.items() if k != "excluded_reasons"} for s in report["summary"]]
    return str(pd.DataFrame(rows).to_csv(index=False))


def plots(report: Mapping[str, Any]) -> dict[str, bytes]:
    """PNG plots: short-probe bars with CIs, prefill and agentic curves per arm."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = [a["name"] for a in report["arms"]]
    summary = pd.DataFrame(report["summary"])
    deltas = {(d["probe"], d["point"], d["metric"], d["arm"]): d for d in report["deltas"]}
    out: dict[str, bytes] = {}
    if summary.empty:
        return out

    def save(fig: Any, name: str) -> None:
        buf = io.BytesIO()
        fig.tight_layout()
        fig.savefig(buf, format="png", dpi=110)
        plt.close(fig)
        out[name] = buf.getvalue()

    short = summary[summary["probe"] == "short"]
    if not short.empty:
        metrics = [m for m in ("decode_tps", "ttft_s") if m in set(short["metric"])]
        fig, axes = plt.subplots(1, len(metrics), figsize=(5 * len(metrics), 3.6), squeeze=False)
        for ax, metric in zip(axes[0], metrics, strict=True):
            sub = short[short["metric"] == metric]
            points = list(dict.fromkeys(sub["point"]))
            width = 0.8 / max(1, len(arms))
            for i, arm in enumerate(arms):
                vals: list[float] = []
                errs: list[list[float]] = [[], []]
                for p in points:
                    row = sub[(sub["point"] == p) & (sub["arm"] == arm)]
                    mean = float(row["mean"].iloc[0]) if not row.empty and row["mean"].iloc[0] is not None else 0.0
                    vals.append(mean)
                    d = deltas.get(("short", p, metric, arm))
                    base = sub[(sub["point"] == p) & (sub["arm"] == arms[0])]
                    if d and d.get("ci_low") is not None and not base.empty:
                        b = float(base["mean"].iloc[0])
                        errs[0].append(max(0.0, mean - b * d["ci_low"]))
                        errs[1].append(max(0.0, b * d["ci_high"] - mean))
                    else:
                        errs[0].append(0.0)
                        errs[1].append(0.0)
                xs = [j + i * width for j in range(len(points))]
                ax.bar(xs, vals, width, yerr=errs, capsize=3, label=arm)
            ax.set_xticks([j + width * (len(arms) - 1) / 2 for j in range(len(points))], points)
            ax.set_title(f"short: {metric}")
            ax.legend()
        save(fig, "short.png")

    for probe, x_name in (("prefill", "depth (prompt tokens)"), ("agentic", "prompt tokens")):
        sub = summary[summary["probe"] == probe]
        if sub.empty:
            continue
        metrics = [
            m
            for m in (("prefill_tps", "ttft_s") if probe == "prefill" else ("decode_tps", "ttft_s"))
            if m in set(sub["metric"])
        ]
        if not metrics:
            continue
        fig, axes = plt.subplots(1, len(metrics), figsize=(5.5 * len(metrics), 3.8), squeeze=False)
        for ax, metric in zip(axes[0], metrics, strict=True):
            for arm in arms:
                rows = sub[(sub["metric"] == metric) & (sub["arm"] == arm)]
                tokens = sub[(sub["metric"] == "prompt_tokens") & (sub["arm"] == arm)].set_index("point")["mean"]
                xs, ys = [], []
                for _, row in rows.iterrows():
                    if row["mean"] is None or row["point"] not in tokens.index:
                        continue
                    xs.append(float(tokens[row["point"]]))
                    ys.append(float(row["mean"]))
                ax.plot(xs, ys, marker="o", label=arm)
            ax.set_xlabel(x_name)
            ax.set_title(f"{probe}: {metric}")
            ax.legend()
        save(fig, f"{probe}.png")
    return out


def html_page(report: Mapping[str, Any], md: str, images: Mapping[str, bytes]) -> str:
    body = []
    in_table = False
    for line in md.splitlines():
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            if set(line) <= {"|", "-"}:
                continue
            if not in_table:
                body.append("<table>")
                in_table = True
                body.append("<tr>" + "".join(f"<th>{html.escape(c)}</th>" for c in cells) + "</tr>")
                continue
            body.append("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>")
            continue
        if in_table:
            body.append("</table>")
            in_table = False
        if line.startswith("# "):
            body.append(f"<h1>{html.escape(line[2:])}</h1>")
        elif line.startswith("## "):
            body.append(f"<h2>{html.escape(line[3:])}</h2>")
        elif line.startswith("- "):
            body.append(f"<p>• {html.escape(line[2:])}</p>")
        elif line.strip():
            body.append(f"<p>{html.escape(line)}</p>")
    if in_table:
        body.append("</table>")
    for name, png in images.items():
        data = base64.b64encode(png).decode()
        body.append(
            f'<h2>{html.escape(name[:-4])}</h2><img alt="{html.escape(name)}" src="data:image/png;base64,{data}">'
        )
    style = (
        "body{font-family:sans-serif;max-width:1100px;margin:2em auto}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}td:first-child,th:first-child{text-align:left}"
    )
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>pytest-kvcache {report.get('run_id')}</title>"
        f"<style>{style}</style></head><body>{''.join(body)}</body></html>\n"
    )


def write_all(run: Path, report: Mapping[str, Any], gates: Sequence[Mapping[str, Any]] = ()) -> list[Path]:
    """Write report.json, report.md, summary.csv, the PNG plots and report.html into the run folder."""
    full = dict(report)
    if gates:
        full["gates"] = list(gates)
    md = markdown(report, gates)
    images = plots(report)
    written = []
    for name, content in (
        ("report.json", dumps(full)),
        ("report.md", md),
        ("summary.csv", summary_csv(report)),
        ("report.html", html_page(report, md, images)),
    ):
        path = run / name
        path.write_text(content, encoding="utf-8")
        written.append(path)
    for name, png in images.items():
        (run / name).write_bytes(png)
        written.append(run / name)
    return written


def terminal_lines(report: Mapping[str, Any]) -> list[str]:
    """The compact A/B table for the terminal summary."""
    arms = [a["name"] for a in report["arms"]]
    lines = []
    for probe, table in ab_tables(report).items():
        frame = pd.DataFrame(table, columns=["metric", *arms, *[f"{a} delta" for a in arms[1:]]])
        lines.append(f"{PROBE_TITLES.get(probe, probe)}:")
        lines += ["  " + line for line in frame.to_string(index=False).splitlines()]
    for c in report.get("crossovers") or []:
        lines.append(f"crossover {c['probe']} {c['metric']}: {c['statement']}")
    lines += [f"verdict: {v}" for v in report.get("verdicts") or []]
    ci = report.get("ci") or {}
    if ci.get("order") and len(ci["order"]) > len(arms):
        lines.append("boot order: " + " → ".join(ci["order"]))
    if ci.get("text"):
        lines.append(ci["text"])
    for row in agreement_table(report):
        lines.append(f"agreement {row[0]} {row[1]} {row[2]}: identical {row[3]}, first divergence {row[4]}")
    lines += [f"sampling: {line}" for line in sampling_lines(report)]
    check = self_check_line(report)
    if check:
        lines.append(check)
    found = report.get("confounds") or {}
    if found.get("status") == "clean":
        lines.append(f"confounds: none ({found.get('compared', 0)} evidence paths compared)")
    return lines
