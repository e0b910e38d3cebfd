"""PNG plots of a report (matplotlib, no display): bars with CIs for each probe measured by shape, and one
curve per arm against depth or prompt tokens for each probe whose spec has a curve."""

from __future__ import annotations

import io

import pandas as pd

from pytest_kvcache.model import Report
from pytest_kvcache.report.outputs.markdown import probe_specs


def render(report: Report) -> dict[str, bytes]:
    """``{file name: PNG bytes}``: ``short.png``, ``prefill.png``, ``agentic.png``, a user probe's own …"""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.figure import Figure

    arms = [a["name"] for a in report["arms"]]
    summary = pd.DataFrame(report["summary"])
    deltas = {(d["probe"], d["point"], d["metric"], d["arm"]): d for d in report["deltas"]}
    out: dict[str, bytes] = {}
    if summary.empty:
        return out
    specs = probe_specs(report)

    def save(fig: Figure, name: str) -> None:
        buf = io.BytesIO()
        fig.tight_layout()
        fig.savefig(buf, format="png", dpi=110)
        plt.close(fig)
        out[name] = buf.getvalue()

    for probe in dict.fromkeys(summary["probe"]):
        spec = specs.get(probe)
        sub = summary[summary["probe"] == probe]
        if spec is not None and spec.curve:
            metrics = [m for m in spec.curve if m in set(sub["metric"])]
            if not metrics:
                continue
            x_name = "depth (prompt tokens)" if spec.curve_x == "depth" else "prompt tokens"
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
                    lo, hi = (d.get("ci_low"), d.get("ci_high")) if d else (None, None)
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
    return out
