"""The history of a run store as trends: one series per probe × point × metric × arm across runs,
broken wherever the runs stop being comparable (model, engine version, GPU model or arm definitions:
``record.comparability``), with change points found by E-Divisive means within each comparable stretch.

:func:`trends` builds them, :func:`table` is the trend table (pandas), :func:`html_page` the page with a
plot per metric and probe point (one line per arm, commits along the x axis), :func:`gate` the regression
gate on the newest run. ``kvcache-report history`` runs them.
"""

from __future__ import annotations

import base64
import io
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pytest_kvcache.metrics.catalogue import higher_is_better
from pytest_kvcache.store.changepoint import ALPHA, ChangePoint, TailShift, e_divisive, tail_shift
from pytest_kvcache.store.record import Comparability, RunRow

if TYPE_CHECKING:
    import pandas as pd


@dataclass(frozen=True)
class Entry:
    """One run's value of one series."""

    run_id: str
    commit: str | None
    branch: str | None
    mean: float
    ci_low: float | None
    ci_high: float | None
    boots: int
    comparability: str


@dataclass(frozen=True)
class Break:
    """Runs ``index - 1`` and ``index`` of a series are not comparable: what changed."""

    index: int
    changed: tuple[str, ...]


@dataclass(frozen=True)
class Change:
    """A change point of a series, with the commit range it lies in and whether it is a regression."""

    point: ChangePoint
    before: Entry
    after: Entry
    direction: str  # "better" | "worse"


@dataclass
class Series:
    probe: str
    point: str
    metric: str
    arm: str
    entries: list[Entry] = field(default_factory=list)
    breaks: list[Break] = field(default_factory=list)
    changes: list[Change] = field(default_factory=list)

    @property
    def label(self) -> str:
        return f"{self.metric}[{self.probe}@{self.point}] {self.arm}"

    def stretches(self) -> list[tuple[int, int]]:
        """(start, stop) of each comparable stretch."""
        cuts = [0, *(b.index for b in self.breaks), len(self.entries)]
        return list(itertools.pairwise(cuts))


def short(commit: str | None) -> str:
    return commit[:8] if commit else "?"


def _changed(a: Comparability, b: Comparability) -> tuple[str, ...]:
    names = {
        "model": "model",
        "engine_args": "engine args",
        "engine_versions": "engine version",
        "gpus": "GPU model",
        "arms": "arms",
    }
    return tuple(label for key, label in names.items() if a.get(key) != b.get(key))


def trends(
    rows: Sequence[RunRow],
    *,
    metrics: Sequence[str] = (),
    probes: Sequence[str] = (),
    arms: Sequence[str] = (),
    branch: str | None = None,
    alpha: float = ALPHA,
    seed: int = 0,
) -> list[Series]:
    """Every series of ``rows`` (oldest first), filtered: ``probes`` are ``PROBE`` or ``PROBE@POINT``."""
    chosen = [r for r in rows if branch is None or r.get("branch") == branch]
    series: dict[tuple[str, str, str, str], Series] = {}
    parts: dict[tuple[str, str, str, str], list[Comparability]] = {}
    for row in chosen:
        for p in row["points"]:
            if p["mean"] is None:
                continue
            if metrics and p["metric"] not in metrics:
                continue
            if probes and p["probe"] not in probes and f"{p['probe']}@{p['point']}" not in probes:
                continue
            if arms and p["arm"] not in arms:
                continue
            key = (p["probe"], p["point"], p["metric"], p["arm"])
            s = series.setdefault(key, Series(*key))
            s.entries.append(
                Entry(
                    run_id=row["run_id"],
                    commit=row.get("commit"),
                    branch=row.get("branch"),
                    mean=float(p["mean"]),
                    ci_low=p.get("ci_low"),
                    ci_high=p.get("ci_high"),
                    boots=int(p.get("boots") or 1),
                    comparability=row["comparability"],
                )
            )
            parts.setdefault(key, []).append(row["comparable_on"])
    for key, s in series.items():
        for i in range(1, len(s.entries)):
            if s.entries[i].comparability != s.entries[i - 1].comparability:
                s.breaks.append(Break(i, _changed(parts[key][i - 1], parts[key][i]) or ("evidence",)))
        for start, stop in s.stretches():
            means = [e.mean for e in s.entries[start:stop]]
            for cp in e_divisive(means, alpha=alpha, seed=seed):
                shift = cp.mean_after - cp.mean_before
                good = shift > 0 if higher_is_better(s.metric) else shift < 0
                at = ChangePoint(start + cp.index, cp.p_value, cp.mean_before, cp.mean_after)
                s.changes.append(
                    Change(at, s.entries[at.index - 1], s.entries[at.index], "better" if good else "worse")
                )
    return sorted(series.values(), key=lambda s: (s.probe, s.point, s.metric, s.arm))


def table(series: Sequence[Series]) -> pd.DataFrame:
    """The trend table: a row per run (commit, branch), a column per series; ``|`` marks a break."""
    import pandas as pd

    order: dict[str, tuple[str, str | None, str | None]] = {}
    cells: dict[str, dict[str, str]] = {}
    for s in series:
        breaks = {b.index for b in s.breaks}
        changes = {c.point.index for c in s.changes}
        for i, e in enumerate(s.entries):
            order.setdefault(e.run_id, (e.run_id, e.commit, e.branch))
            mark = ("| " if i in breaks else "") + ("▼ " if i in changes else "")
            cells.setdefault(s.label, {})[e.run_id] = f"{mark}{e.mean:.4g}"
    index = list(order)
    frame = pd.DataFrame({label: [col.get(r, "") for r in index] for label, col in cells.items()}, index=index)
    frame.insert(0, "branch", [order[r][2] or "" for r in index])
    frame.insert(0, "commit", [short(order[r][1]) for r in index])
    frame.index.name = "run"
    return frame


def change_lines(series: Sequence[Series]) -> list[str]:
    """One sentence per break and per change point."""
    lines = []
    for s in series:
        for b in s.breaks:
            before, after = s.entries[b.index - 1], s.entries[b.index]
            lines.append(
                f"break: {s.label} between {short(before.commit)} and {short(after.commit)} "
                f"({', '.join(b.changed)} changed): not compared across it"
            )
        for c in s.changes:
            shift = c.point.shift_pct
            lines.append(
                f"change point: {s.label} at run {c.point.index + 1} (commits {short(c.before.commit)}..."
                f"{short(c.after.commit)}): {c.point.mean_before:.4g} → {c.point.mean_after:.4g} "
                f"({shift:+.1f}%), p={c.point.p_value:.3f}, {c.direction}"
                if shift is not None
                else f"change point: {s.label} at run {c.point.index + 1}: {c.direction}"
            )
    return lines


@dataclass(frozen=True)
class GateResult:
    series: Series
    outcome: str  # "fail" | "pass" | "not judged"
    reason: str
    shift: TailShift | None = None


def gate(series: Sequence[Series], *, alpha: float = ALPHA, min_shift_pct: float = 0.0) -> list[GateResult]:
    """Does the newest run start a change point in the bad direction? Each series' newest value is judged
    against the regime it follows — its comparable stretch since the last change point — by a Student-t
    prediction interval (E-Divisive's permutation test cannot judge a one-run segment). It fails when the
    shift is significant at ``alpha``, in the bad direction and at least ``min_shift_pct``."""
    results = []
    for s in series:
        n = len(s.entries)
        starts = [0, *(b.index for b in s.breaks), *(c.point.index for c in s.changes if c.point.index < n - 1)]
        start = max(starts)
        shifted = tail_shift([e.mean for e in s.entries], start)
        newest = s.entries[-1] if s.entries else None
        if shifted is None or newest is None:
            regime = n - 1 - start
            results.append(GateResult(s, "not judged", f"{regime} comparable run(s) before the newest; needs 3"))
            continue
        pct = shifted.shift_pct or 0.0
        bad = (pct < 0) if higher_is_better(s.metric) else (pct > 0)
        text = (
            f"newest run {short(newest.commit)}: {shifted.value:.4g} against {shifted.mean_before:.4g} "
            f"({pct:+.1f}%, p={shifted.p_value:.2g}, {n - 1 - start} runs since {short(s.entries[start].commit)})"
        )
        failed = bad and shifted.p_value < alpha and abs(pct) >= min_shift_pct
        results.append(GateResult(s, "fail" if failed else "pass", text, shifted))
    return results


def _plot(group: Sequence[Series]) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs: dict[str, str] = {}
    for s in group:
        for e in s.entries:
            runs.setdefault(e.run_id, short(e.commit))
    x_of = {run: i for i, run in enumerate(runs)}
    fig, ax = plt.subplots(figsize=(9, 3.6))
    for s in group:
        for start, stop in s.stretches():
            part = s.entries[start:stop]
            xs = [x_of[e.run_id] for e in part]
            ys = [e.mean for e in part]
            lo = [e.mean - e.ci_low if e.ci_low is not None else 0.0 for e in part]
            hi = [e.ci_high - e.mean if e.ci_high is not None else 0.0 for e in part]
            ax.errorbar(xs, ys, yerr=[lo, hi], marker="o", ms=3, capsize=2, label=s.arm if start == 0 else None)
        for b in s.breaks:
            ax.axvline(x_of[s.entries[b.index].run_id] - 0.5, color="grey", ls="--", lw=1)
            ax.annotate(
                "break: " + ", ".join(b.changed),
                (x_of[s.entries[b.index].run_id] - 0.5, 1.0),
                xycoords=("data", "axes fraction"),
                fontsize=7,
                color="grey",
                va="top",
            )
        for c in s.changes:
            x = x_of[c.after.run_id] - 0.5
            ax.axvline(x, color="red" if c.direction == "worse" else "green", lw=1.5)
            shift = c.point.shift_pct
            ax.annotate(
                f"{s.arm} {shift:+.1f}%" if shift is not None else s.arm,
                (x, 0.02),
                xycoords=("data", "axes fraction"),
                fontsize=7,
                color="red" if c.direction == "worse" else "green",
            )
    first = group[0]
    ax.set_title(f"{first.metric} [{first.probe}@{first.point}]")
    ax.set_xticks(range(len(runs)), list(runs.values()), rotation=60, fontsize=7)
    ax.set_ylabel(first.metric)
    ax.legend(fontsize=8)
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    return buf.getvalue()


PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>pytest-kvcache history</title>
<style>body{font-family:system-ui,sans-serif;margin:2em;max-width:1100px}
table{border-collapse:collapse;font-size:12px}td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}
.worse{color:#b00}.better{color:#070}.break{color:#666}img{max-width:100%}</style></head><body>
<h1>Run history</h1>
<p>{{ runs }} run(s) in the store {{ store }}. Change points by E-Divisive means (permutation test,
p &lt; {{ alpha }}), found only within comparable runs; a dashed line is a break (model, engine version, GPU
model or arms changed), never compared across.</p>
{% if gates %}<h2>Gate on the newest run</h2><ul>
{% for g in gates %}<li class="{{ 'worse' if g.outcome == 'fail' else '' }}">{{ g.outcome }}: {{ g.series.label }}
— {{ g.reason }}</li>{% endfor %}</ul>{% endif %}
<h2>Change points and breaks</h2>
{% if lines %}<ul>{% for line in lines %}
<li class="{{ 'break' if line.startswith('break') else 'worse' if line.endswith('worse') else 'better' }}">
{{ line }}</li>
{% endfor %}</ul>
{% else %}<p>None.</p>{% endif %}
<h2>Trends</h2>
{% for title, png in plots %}<h3>{{ title }}</h3><img alt="{{ title }}" src="data:image/png;base64,{{ png }}">
{% endfor %}
<h2>Table</h2>
{{ table }}
</body></html>
"""


def html_page(
    series: Sequence[Series], *, store: str, runs: int, alpha: float = ALPHA, gates: Sequence[GateResult] = ()
) -> str:
    """One self-contained page: change points and breaks, a plot per metric and probe point, the table."""
    import jinja2
    import markupsafe

    groups: dict[tuple[str, str, str], list[Series]] = {}
    for s in series:
        groups.setdefault((s.metric, s.probe, s.point), []).append(s)
    plots = [
        (f"{metric} [{probe}@{point}]", base64.b64encode(_plot(group)).decode("ascii"))
        for (metric, probe, point), group in groups.items()
    ]
    env = jinja2.Environment(autoescape=True)
    frame = table(series)
    return env.from_string(PAGE).render(
        runs=runs,
        store=store,
        alpha=alpha,
        gates=list(gates),
        lines=change_lines(series),
        plots=plots,
        table=markupsafe.Markup(frame.to_html(escape=True)),
    )
