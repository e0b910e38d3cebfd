"""PNG plots of a report (matplotlib, no display): bars with CIs for each probe measured by shape, one
curve per arm against depth or prompt tokens for each probe whose spec has a curve, acceptance length
against depth, and fidelity beside prefill speed against depth."""

from __future__ import annotations

import io
import math
from typing import TYPE_CHECKING, Any, cast

import pandas as pd

from pytest_kvcache.metrics import catalogue
from pytest_kvcache.model.report import Report
from pytest_kvcache.model.sections import FidelityRow
from pytest_kvcache.probes.registry import ProbeSpec
from pytest_kvcache.report import deciding, retrieval_render
from pytest_kvcache.report.capacity import render as capacity_render
from pytest_kvcache.report.outputs.formats import probe_specs
from pytest_kvcache.report.points import point_sort

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def render(report: Report) -> dict[str, bytes]:
    """``{file name: PNG bytes}``: ``short.png``, ``prefill.png``, ``agentic.png``, a user probe's own …"""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = [a["name"] for a in report["arms"]]
    summary = pd.DataFrame(report["summary"])
    deltas = {(d["probe"], d["point"], d["metric"], d["arm"]): d for d in report["deltas"]}
    out: dict[str, bytes] = {}
    specs = probe_specs(report)

    def save(fig: Figure, name: str) -> None:
        buf = io.BytesIO()
        fig.tight_layout()
        fig.savefig(buf, format="png", dpi=110)
        plt.close(fig)
        out[name] = buf.getvalue()

    def own_sections() -> None:  # fidelity's and retrieval's plots, drawn with or without a comparison
        for name, draw in (("fidelity.png", fidelity_figure), ("retrieval.png", retrieval_render.heatmap_figure)):
            if (drawn := draw(report, plt)) is not None:
                save(drawn, name)

    if summary.empty:  # nothing between arms; a single arm's fidelity (or retrieval) still has its plot
        own_sections()
        return out

    for probe in dict.fromkeys(summary["probe"]):
        spec = specs.get(probe)
        if spec is not None and spec.own_section:
            continue
        sub = summary[summary["probe"] == probe]
        if spec is not None and spec.curve:
            metrics = [m for m in spec.curve if m in set(sub["metric"])]
            if not metrics:
                continue
            x_name = "depth (prompt tokens)" if spec.curve_x == "depth" else "prompt tokens per turn"
            fig, axes = plt.subplots(1, len(metrics), figsize=(5.5 * len(metrics), 3.8), squeeze=False)
            for ax, metric in zip(axes[0], metrics, strict=True):
                for arm in arms:
                    rows = sub[(sub["metric"] == metric) & (sub["arm"] == arm)]
                    tokens = sub[(sub["metric"] == "prompt_tokens") & (sub["arm"] == arm)].set_index("point")["mean"]
                    xs, ys, err = [], [], []
                    for _, row in rows.iterrows():
                        if row["mean"] is None or row["point"] not in tokens.index:
                            continue
                        xs.append(float(tokens[row["point"]]))
                        ys.append(float(row["mean"]))
                        err.append(_mean_half_width(row))
                    ax.errorbar(xs, ys, yerr=err, marker="o", capsize=3, label=arm)
                ax.set_xlabel(x_name)
                ax.set_ylabel(catalogue.label(metric))
                ax.set_title(f"{probe}: {metric}")
                ax.legend()
            save(fig, f"{probe}.png")
            delta = delta_figure(report, spec, plt)
            if delta is not None:
                save(delta, f"{probe}_delta.png")
            continue
        wanted = [spec.primary_metric] if spec is not None else ["decode_tps"]
        wanted += [m for m in ("ttft_s", "acceptance_length") if m not in wanted]
        metrics = [m for m in wanted if m in set(sub["metric"])]
        if not metrics:
            continue
        fig, axes = plt.subplots(1, len(metrics), figsize=(5 * len(metrics), 3.6), squeeze=False)
        for ax, metric in zip(axes[0], metrics, strict=True):
            at = sub[sub["metric"] == metric]
            points = list(dict.fromkeys(at["point"]))
            width = 0.8 / max(1, len(arms))
            for i, arm in enumerate(arms):
                vals: list[float] = []
                errs: list[list[float]] = [[], []]
                for p in points:
                    row = at[(at["point"] == p) & (at["arm"] == arm)]
                    mean = float(row["mean"].iloc[0]) if not row.empty and row["mean"].iloc[0] is not None else 0.0
                    vals.append(mean)
                    d = deltas.get((probe, p, metric, arm))
                    base = at[(at["point"] == p) & (at["arm"] == arms[0])]
                    lo, hi, _ = deciding.deciding(d) if d else (None, None, "")  # the interval that decided
                    if lo is not None and hi is not None and not base.empty:
                        b = float(base["mean"].iloc[0])
                        errs[0].append(max(0.0, mean - b * lo))
                        errs[1].append(max(0.0, b * hi - mean))
                    else:
                        errs[0].append(0.0)
                        errs[1].append(0.0)
                xs = [j + i * width for j in range(len(points))]
                ax.bar(xs, vals, width, yerr=errs, capsize=3, label=arm)
            ax.set_xticks([j + width * (len(arms) - 1) / 2 for j in range(len(points))], points)
            ax.set_ylabel(catalogue.label(metric))
            ax.set_title(f"{probe}: {metric}")
            ax.legend()
        save(fig, f"{probe}.png")
    accepted = summary[summary["metric"] == "acceptance_length"]
    curves = [p for p in dict.fromkeys(accepted["probe"]) if (sp := specs.get(p)) is not None and sp.curve]
    if curves:  # acceptance length against depth: one line per arm and probe
        fig, ax = plt.subplots(figsize=(6.5, 4.0))
        for probe in curves:
            sub = summary[summary["probe"] == probe]
            for arm in arms:
                tokens = sub[(sub["metric"] == "prompt_tokens") & (sub["arm"] == arm)].set_index("point")["mean"]
                rows = accepted[(accepted["probe"] == probe) & (accepted["arm"] == arm)]
                pts = [
                    (float(tokens[r["point"]]), float(r["mean"])) for _, r in rows.iterrows() if r["point"] in tokens
                ]
                if pts:
                    pts.sort()
                    ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", label=f"{arm} {probe}")
        ax.set_xlabel("prompt tokens")
        ax.set_ylabel("mean acceptance length (tokens per step)")
        ax.set_title("speculative decoding: acceptance length against depth")
        ax.legend()
        save(fig, "spec_decode.png")
    own_sections()
    for name, figure in capacity_render.figures(report, plt).items():  # goodput against sessions, per depth
        save(figure, name)
    return out


def _mean_half_width(row: pd.Series) -> float:
    """Half the 95% CI of a summary row's mean, normal approximation (1.96 · std / √n); 0 below 2 samples."""
    n, std = row.get("n"), row.get("std")
    if n is None or std is None or n < 2 or std != std:
        return 0.0
    return float(1.96 * std / math.sqrt(n))


def _pct(ratio: float | None, fallback: float) -> float:
    return (ratio - 1) * 100 if ratio is not None else fallback


def delta_figure(report: Report, spec: ProbeSpec, plt: Any) -> Figure | None:
    """Each arm against the baseline along the probe's curve: ratio − 1 (%) with its deciding 95% interval as a
    band, the zero line, and a crossover (with its interval) where the report found a significant one."""
    arms = [a["name"] for a in report["arms"]]
    deltas = [d for d in report["deltas"] if d["probe"] == spec.name and d["metric"] in spec.curve]
    metrics = [m for m in spec.curve if any(d["metric"] == m and d.get("delta_pct") is not None for d in deltas)]
    if not metrics or len(arms) < 2:
        return None
    tokens: dict[str, float] = {}
    for row in report["summary"]:
        mean = row.get("mean")
        if row["probe"] == spec.name and row["metric"] == "prompt_tokens" and row["arm"] == arms[0] and mean:
            tokens[row["point"]] = float(mean)

    def x_of(point: str) -> float:
        return tokens.get(point) or point_sort(point)[1]

    crossings = [c for c in report.get("crossovers") or [] if c["probe"] == spec.name]
    fig, axes = plt.subplots(1, len(metrics), figsize=(5.8 * len(metrics), 3.9), squeeze=False)
    for ax, metric in zip(axes[0], metrics, strict=True):
        for arm in arms[1:]:
            mine = sorted(
                (d for d in deltas if d["arm"] == arm and d["metric"] == metric and d.get("delta_pct") is not None),
                key=lambda d: x_of(d["point"]),
            )
            if not mine:
                continue
            xs = [x_of(d["point"]) for d in mine]
            ys = [float(d["delta_pct"] or 0.0) for d in mine]
            (line,) = ax.plot(xs, ys, marker="o", label=f"{arm} / {arms[0]}")
            decided = [deciding.deciding(d) for d in mine]  # the interval each verdict was taken on
            lo = [_pct(found[0], y) for found, y in zip(decided, ys, strict=True)]
            hi = [_pct(found[1], y) for found, y in zip(decided, ys, strict=True)]
            ax.fill_between(xs, lo, hi, color=line.get_color(), alpha=0.18, linewidth=0)
            for c in crossings:
                if (
                    c["arm"] == arm
                    and c["metric"] == metric
                    and c.get("estimate") is not None
                    and c.get("significant", True)
                ):
                    estimate = float(c["estimate"] or 0.0)
                    if c.get("ci_low") is not None and c.get("ci_high") is not None:
                        ax.axvspan(
                            float(c["ci_low"] or 0.0), float(c["ci_high"] or 0.0), color=line.get_color(), alpha=0.1
                        )
                    ax.axvline(estimate, color=line.get_color(), linestyle=":", linewidth=1.2)
                    ax.annotate(
                        f"crosses ~{estimate / 1000:.1f}K",
                        (estimate, 0),
                        textcoords="offset points",
                        xytext=(4, 6),
                        fontsize=8,
                    )
        ax.axhline(0.0, color="black", linewidth=0.9)
        ax.set_xlabel("depth (prompt tokens)" if spec.curve_x == "depth" else "prompt tokens per turn")
        ax.set_ylabel(f"{metric}: arm / baseline − 1 (%)")
        ax.set_title(f"{spec.name}: {metric} against {arms[0]} (95% CI band)")
        ax.legend()
    return cast("Figure", fig)


def _fidelity_curve(rows: list[FidelityRow], metric: str) -> tuple[list[float], list[float], list[list[float]]]:
    """Depths, values and asymmetric CI errors of one arm's fidelity rows, by depth."""
    xs: list[float] = []
    ys: list[float] = []
    err: list[list[float]] = [[], []]
    for r in sorted(rows, key=lambda r: r["depth"]):
        value = cast("float | None", r.get(metric))
        if value is None:
            continue
        lo, hi = (cast("list[float | None]", r.get(f"{metric}_ci")) or [None, None])[:2]
        xs.append(float(r["depth"]))
        ys.append(value)
        err[0].append(max(0.0, value - lo) if lo is not None else 0.0)
        err[1].append(max(0.0, hi - value) if hi is not None else 0.0)
    return xs, ys, err


def fidelity_figure(report: Report, plt: Any) -> Figure | None:
    """Speed and fidelity against depth side by side: prefill speed delta (when measured), mean |Δ logprob|
    and the top-k KL per arm against the baseline, with 95% CIs; the baseline's A/A across boots dashed."""
    rows = (report.get("fidelity") or {"rows": []})["rows"]
    if not rows:
        return None
    arms = [a["name"] for a in report["arms"]]
    prefill = [d for d in report["deltas"] if d["probe"] == "prefill" and d["metric"] == "prefill_tps"]
    panels: list[str] = (["prefill"] if prefill else []) + ["logprob_drift"]
    if any(r.get("kl_topk") is not None for r in rows):
        panels.append("kl_topk")
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 3.8), squeeze=False)
    for ax, panel in zip(axes[0], panels, strict=True):
        if panel == "prefill":
            for arm in arms[1:]:
                points = sorted(
                    (d for d in prefill if d["arm"] == arm and d.get("delta_pct") is not None),
                    key=lambda d: point_sort(d["point"]),
                )
                ax.plot(
                    [point_sort(d["point"])[1] for d in points],
                    [float(d["delta_pct"] or 0.0) for d in points],
                    marker="o",
                    label=arm,
                )
            ax.axhline(0.0, color="grey", linewidth=0.8)
            ax.set_title("prefill_tps vs baseline (%)")
        else:
            series = [("between arms", arm, arm, "-") for arm in arms[1:]]
            series.append(("across boots", arms[0], f"{arms[0]} A/A across boots", "--"))
            for kind, arm, label, style in series:
                mine = [r for r in rows if r["kind"] == kind and r["arm"] == arm]
                xs, ys, err = _fidelity_curve(mine, panel)
                if xs:
                    ax.errorbar(xs, ys, yerr=err, marker="o", linestyle=style, capsize=3, label=label)
            ax.set_title("mean |Δ logprob| (nats/token)" if panel == "logprob_drift" else "KL top-k ≥ (nats/token)")
        ax.set_xlabel("depth (prompt tokens)")
        ax.legend()
    return cast("Figure", fig)
