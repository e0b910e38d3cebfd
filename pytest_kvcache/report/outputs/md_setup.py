"""``report.md``'s sections about the setup: the arms, GPU state, boots and order, blocks and confounds —
one renderer each (``(report) -> lines``), and the tables the terminal and ``report.html`` share."""

from __future__ import annotations

from pytest_kvcache.model.report import BootEntry, Report
from pytest_kvcache.report import cost
from pytest_kvcache.report.outputs.formats import Column, _md_table, columns, fmt, json_text


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


def arms_table(report: Report) -> tuple[list[str], list[list[str]]]:
    """Each arm as declared and as the engine resolved it."""
    return columns(report["arms"], ARM_COLUMNS)


ARM_COLUMNS: tuple[Column, ...] = (
    ("Arm", lambda a: a["name"] + (" (baseline)" if a["baseline"] else "")),
    ("Declared KV dtype", lambda a: str((a.get("declared") or {}).get("kv_cache_dtype") or "default")),
    ("Resolved cache_dtype", lambda a: str(a["resolved"].get("cache_dtype") or "?")),
    ("Attention backend", lambda a: str(a["resolved"].get("attention_backend") or "not logged")),
    ("KV capacity (tokens)", lambda a: fmt(a["resolved"].get("kv_cache_size_tokens"), "kv_cache_size_tokens")),
    ("Engine", lambda a: str(a["resolved"].get("engine_version") or "?")),
    ("Ready after", lambda a: fmt(a["resolved"].get("ready_s"), "ready_s")),
)


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


def render_head(report: Report) -> list[str]:
    """The title and the model."""
    lines = [f"# pytest-kvcache A/B report — run {report.get('run_id')}", ""]
    if report.get("model"):
        lines += [f"Model: `{report['model']}`", ""]
    return lines


def render_first_screen(report: Report) -> list[str]:
    """What the verdict cost and the open gates (``report.cost``), before anything else."""
    first = cost.first_screen(report)
    return [*first, ""] if first else []


def render_arms(report: Report) -> list[str]:
    return ["## Arms", "", *_md_table(*arms_table(report))]


def render_gpu(report: Report) -> list[str]:
    gpu_header, gpu_rows = gpu_table(report)
    if gpu_rows:
        return ["", "## GPU state", "", *_md_table(gpu_header, gpu_rows)]
    if report["arms"] and (report["arms"][0].get("gpu") or {}).get("reason"):
        return ["", f"GPU state: none recorded ({report['arms'][0]['gpu']['reason']})."]
    return []


def render_boots(report: Report) -> list[str]:
    if not report.get("boots"):
        return []
    lines = ["", "## Boots and order", ""]
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
    return lines


def render_blocks(report: Report) -> list[str]:
    if not report.get("blocks"):
        return []
    return ["", "## Blocks (pytest-xdist lanes)", "", *_md_table(*block_table(report))]


def render_confounds(report: Report) -> list[str]:
    return ["", "## Confounds", "", *confound_lines(report)] if report.get("confounds") else []
