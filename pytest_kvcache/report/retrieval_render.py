"""The retrieval section rendered: report.md's lines, report.html's tables, the terminal's sentences and
``retrieval.png``'s heat maps, from ``report["retrieval"]`` (``report.retrieval.section``).

Plain Python: no pytest.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from pytest_kvcache.probes.registry import depth_label
from pytest_kvcache.report.outputs.formats import Cell as HtmlCell
from pytest_kvcache.report.outputs.formats import Table, _md_table
from pytest_kvcache.report.retrieval import DEFAULT_CEILING, pct

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from pytest_kvcache.report.outputs.formats import Table


def _section_of(report: Mapping[str, Any]) -> Mapping[str, Any] | None:
    found = report.get("retrieval")
    return cast("Mapping[str, Any]", found) if found else None


def _cell_columns(config: Mapping[str, Any]) -> tuple[bool, bool]:
    """Whether the tables need a form column and a keys column (only when the run has several)."""
    return len(config.get("forms") or []) > 1, len(config.get("keys") or []) > 1


def _cell_cells(row: Mapping[str, Any], forms: bool, keys: bool) -> list[str]:
    out = [str(row["point"]), pct(float(row["position"]))]
    if forms:
        out.append(str(row["form"]))
    if keys:
        out.append(str(row["keys"]))
    return out


#: The footnote of a cell the baseline cannot judge (marked † in the accuracy table).
CEILING_MARK = "†"


def setup_line(sec: Mapping[str, Any]) -> str:
    """The setup in one sentence: needles per cell, forms, haystack, keys, depths, positions, the ceiling."""
    cfg = sec["config"]
    keys = cfg.get("keys") or [1]
    key_words = ", ".join("single needle" if k == 1 else f"{k} keys (one asked)" for k in keys)
    depths = ", ".join(depth_label(int(d)) for d in cfg.get("depths") or [])
    positions = ", ".join(pct(float(p)) for p in cfg.get("positions") or [])
    return (
        f"Needle in a haystack: {cfg.get('needles')} needles per cell, asked as {', '.join(cfg.get('forms') or [])} "
        f"in {cfg.get('haystack') or 'the haystack'} ({key_words}); depths {depths}, needle positions {positions} "
        "of the context. A needle is found when at least half of its boots return it; accuracy with its Wilson 95% "
        f"interval. Differences: each arm − {cfg.get('baseline')} in points over the needles both answered, decided "
        "by the exact McNemar test with Holm within each arm; the interval printed is the exact one at the level of "
        "the cell's Holm step (it excludes 0 exactly when the cell is better or worse). A cell where the baseline "
        f"finds fewer than {pct(float(cfg.get('ceiling') or DEFAULT_CEILING))} of the needles gets no verdict."
    )


def accuracy_table(sec: Mapping[str, Any]) -> tuple[list[str], list[list[str]]]:
    """Accuracy [95% CI] (found/needles) per cell, arms as columns; a ceiling cell marked †."""
    cfg = sec["config"]
    forms, keys = _cell_columns(cfg)
    arms = list(cfg.get("arms") or dict.fromkeys(c["arm"] for c in sec["cells"]))
    header = ["Depth", "Position", *(["Form"] if forms else []), *(["Keys"] if keys else []), *arms]
    by_cell: dict[tuple[Any, ...], dict[str, Mapping[str, Any]]] = {}
    for c in sec["cells"]:
        by_cell.setdefault((c["depth"], c["position"], c["form"], c["keys"]), {})[c["arm"]] = c
    rows = []
    for of_arm in by_cell.values():
        first = next(iter(of_arm.values()))
        line = _cell_cells(first, forms, keys)
        for arm in arms:
            c = of_arm.get(arm)
            if c is None or c["acc"] is None:
                line.append("–")
                continue
            lo, hi = c["ci"]
            mark = CEILING_MARK if c["ceiling"] and arm == cfg.get("baseline") else ""
            text = f"{pct(c['acc'])}{mark} [{pct(lo)}, {pct(hi)}] ({c['found']}/{c['n']})"
            line.append(text + (f", {c['failed']} failed" if c["failed"] else ""))
        rows.append(line)
    return header, rows


def diff_table(sec: Mapping[str, Any]) -> tuple[list[str], list[list[str]]]:
    """Each arm − the baseline per cell: points [the deciding interval, its level], pairs, McNemar p, Holm p and
    the verdict."""
    forms, keys = _cell_columns(sec["config"])
    header = [
        "Arm",
        "Depth",
        "Position",
        *(["Form"] if forms else []),
        *(["Keys"] if keys else []),
        "Pairs",
        "Difference, points [deciding CI]",
        "p",
        "Holm p",
        "Verdict",
    ]
    rows = []
    for d in sec["diffs"]:
        diff = "–"
        if d["diff"] is not None:
            lo, hi = d["ci"]
            level = d.get("ci_level")
            at = f" ({_level(float(level))})" if level is not None else ""
            diff = f"{d['diff'] * 100:+.0f} [{lo * 100:+.0f}, {hi * 100:+.0f}]{at}"
        holm = "–" if d["p_holm"] is None else f"{_p(d['p_holm'])} (of {d['family_size']})"
        p = "–" if d["p"] is None else _p(d["p"])
        rows.append([str(d["arm"]), *_cell_cells(d, forms, keys), str(d["n"]), diff, p, holm, str(d["verdict"])])
    return header, rows


def _level(level: float) -> str:
    """A confidence level as the table prints it: 95%, 99.5%, 99.44%."""
    return f"{level * 100:.4g}%"


def _p(value: float) -> str:
    """A p-value as the section keeps it (4 decimals): one rounded to 0 reads as below 0.0001."""
    return "< 0.0001" if value == 0 else f"{value:.3g}"


def _footnote(sec: Mapping[str, Any]) -> str:
    ceiling = pct(float(sec["config"].get("ceiling") or DEFAULT_CEILING))
    return (
        f"{CEILING_MARK} the baseline finds fewer than {ceiling} of the needles here: the cell measures the model's "
        "limit, not the KV cache's, and gets no verdict."
    )


def markdown_lines(report: Mapping[str, Any]) -> list[str]:
    """report.md's retrieval section: the setup, a sentence per arm, accuracy and difference tables, notes."""
    sec = _section_of(report)
    if sec is None:
        return []
    lines = ["", "## Retrieval at depth", "", setup_line(sec), ""]
    lines += [f"- {s}" for s in sec["sentences"]]
    header, rows = accuracy_table(sec)
    if rows:
        lines += ["", *_md_table(header, rows)]
        if any(c["ceiling"] for c in sec["cells"]):
            lines += ["", _footnote(sec)]
    header, rows = diff_table(sec)
    if rows:
        lines += ["", *_md_table(header, rows)]
    if sec["notes"]:
        lines += ["", *[f"- {n}" for n in sec["notes"]]]
    return lines


def html_tables(report: Mapping[str, Any]) -> list[Table]:
    """report.html's retrieval tables (accuracy, differences), a verdict cell classed better/worse."""
    sec = _section_of(report)
    if sec is None:
        return []
    header, rows = accuracy_table(sec)
    notes = [_footnote(sec)] if any(c["ceiling"] for c in sec["cells"]) else []
    intro = " ".join([setup_line(sec), *sec["sentences"]])
    tables = [Table("Retrieval at depth", header, [[HtmlCell(c) for c in row] for row in rows], intro, notes)]
    header, rows = diff_table(sec)
    if rows:
        cells = [[HtmlCell(c) for c in row[:-1]] + [HtmlCell(row[-1], _verdict_class(row[-1]))] for row in rows]
        tables.append(Table("Retrieval: each arm against the baseline", header, cells, notes=list(sec["notes"])))
    return tables


def _verdict_class(verdict: str) -> str:
    """The HTML class of a verdict cell: its colour for a better or worse, none otherwise."""
    return verdict if verdict in ("better", "worse") else ""


def terminal_lines(report: Mapping[str, Any]) -> list[str]:
    """The terminal's retrieval lines: one sentence per arm."""
    sec = _section_of(report)
    return [f"retrieval: {s}" for s in sec["sentences"]] if sec is not None else []


def heatmap_figure(report: Mapping[str, Any], plt: Any) -> Figure | None:
    """Accuracy per depth × position, one heat map per arm side by side (0–100%, the value in each square);
    the baseline's ceiling cells hatched (the title says so). With several forms or key counts, one row of maps
    per variant (in the forms' order, fewer keys first), each map titled with its variant."""
    from matplotlib.patches import Rectangle

    sec = _section_of(report)
    if sec is None or not sec["cells"]:
        return None
    cfg = sec["config"]
    forms = list(cfg.get("forms") or dict.fromkeys(c["form"] for c in sec["cells"]))
    variants = sorted({(str(c["form"]), int(c["keys"])) for c in sec["cells"]}, key=lambda v: (forms.index(v[0]), v[1]))
    several = len(variants) > 1
    arms = list(dict.fromkeys(c["arm"] for c in sec["cells"]))
    depths = sorted({int(c["depth"]) for c in sec["cells"]})
    positions = sorted({float(c["position"]) for c in sec["cells"]})
    size = (2.6 + 0.9 * len(positions) * len(arms), 0.6 + (1.6 + 0.5 * len(depths)) * len(variants))
    # a narrow last column holds each row's colour bar (tight_layout keeps it clear of the maps)
    fig, grid_axes = plt.subplots(
        len(variants),
        len(arms) + 1,
        figsize=size,
        squeeze=False,
        gridspec_kw={"width_ratios": [1.0] * len(arms) + [0.06]},
    )
    axes, bars = grid_axes[:, :-1], grid_axes[:, -1]
    image = None
    for row, (form, keys) in enumerate(variants):
        mine = [c for c in sec["cells"] if c["form"] == form and c["keys"] == keys]
        for ax, arm in zip(axes[row], arms, strict=True):
            grid = np.full((len(depths), len(positions)), np.nan)
            for c in (c for c in mine if c["arm"] == arm):
                i, j = depths.index(int(c["depth"])), positions.index(float(c["position"]))
                if c["acc"] is not None:
                    grid[i, j] = float(c["acc"]) * 100
                if c["ceiling"]:
                    ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, hatch="//", edgecolor="grey", lw=0))
                text = "–" if c["acc"] is None else pct(float(c["acc"]))
                ax.text(j, i, text, ha="center", va="center", fontsize=8)
            image = ax.imshow(grid, vmin=0, vmax=100, cmap="RdYlGn", origin="lower", aspect="auto")
            ax.set_xticks(range(len(positions)), [pct(p) for p in positions])
            ax.set_yticks(range(len(depths)), [depth_label(d) for d in depths])
            ax.set_xlabel("needle position (share of the context)")
            ax.set_ylabel("depth (prompt tokens)")
            variant = f"{form}, {'single needle' if keys == 1 else f'{keys} keys'}"
            ax.set_title(f"{arm} ({variant})" if several else arm)
        fig.colorbar(image, cax=bars[row], label="needles found (%)")
    which = (
        ""
        if several
        else f" ({variants[0][0]}, {'single needle' if variants[0][1] == 1 else f'{variants[0][1]} keys'})"
    )
    note = ""
    if any(c["ceiling"] for c in sec["cells"]):
        note = (
            f"\nhatched: the baseline finds fewer than {pct(float(cfg.get('ceiling') or DEFAULT_CEILING))}, no verdict"
        )
    fig.suptitle(f"Retrieval accuracy by depth and position{which}{note}")
    return cast("Figure", fig)
