"""The retrieval probe in the report: ``retrieval.jsonl`` (one needle asked on one boot per line) turned into
accuracy per cell, paired differences between arms, gates, a section and one sentence per arm.

A **cell** is ``(depth, position, form, keys)``; a **point** (what a gate selects with ``@``) is the depth's
label (``32k``). The same needles go to every arm, so arms are compared needle by needle.

- Boots collapse per arm and needle: a needle is *found* when at least half of its answered (``ok``) boots
  returned it. Greedy requests normally agree across boots; where they do not, the notes say how often. A
  failed request (``ok`` False) is not a miss: it is left out of accuracy and counted as failed.
- Accuracy per arm and cell: found / needles, with the Wilson score 95% interval (good coverage near 0% and
  100%, where a retrieval accuracy usually sits; the Wald interval collapses there).
- Paired difference per arm and cell against the baseline arm (``arms[0]``), over the needles both answered:
  ``(c − b) / n`` with ``b`` = found by the baseline only, ``c`` = found by the arm only. It is decided by the
  exact McNemar test (two-sided binomial on the discordant pairs) with Holm's step-down procedure within each arm
  over the cells it judges (family = arm × retrieval, as the report's deltas: ``report.multiplicity``). The
  interval printed is the one that decided: exact (:func:`exact_difference_interval`) at the level of the cell's
  Holm step (``stats.holm_levels``), so it excludes 0 exactly when the cell is better or worse; a cell it does
  not decide is *inconclusive*, never "the same".
- A gate pools a depth's judged cells and reads Newcombe's hybrid score interval for paired proportions
  (Newcombe 1998, *Statist. Med.* 17:2635, method 10: the two Wilson intervals combined square-and-add, with the
  phi correlation of the paired outcomes correcting for the pairing; :func:`paired_difference_interval`) at 95%:
  a gate is one pre-registered hypothesis.
- The baseline's ceiling: a cell where the baseline finds fewer than ``retrieval_ceiling`` (default 80%) of
  the needles measures the model's or haystack's limit, not the KV cache's: no verdict, outside the Holm
  family, and a gate there is an error saying so (never a pass or fail).

Plain Python: no pytest.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from pytest_kvcache import stats
from pytest_kvcache.config.grammars import Gate
from pytest_kvcache.model.records import RetrievalRecord
from pytest_kvcache.model.report import GateEvidence, GateResult
from pytest_kvcache.probes.registry import depth_label
from pytest_kvcache.report.gate_outcome import gate_result, judge
from pytest_kvcache.report.retrieval_stats import (
    exact_difference_interval,
    mcnemar_p,
    paired_difference_interval,
    wilson_interval,
)

PROBE = "retrieval"
METRIC = "retrieval_acc"
#: The baseline accuracy below which a cell cannot judge a KV dtype (setting ``retrieval_ceiling``).
DEFAULT_CEILING = 0.8
#: Resamples and seed of the paired bootstrap behind a ratio gate's interval.
BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 0
#: What a gate's CI replicates over (``ci_method``, ``evidence.kind``).
CI_METHOD = "needles"
#: The cell: depth (tokens), position (share of the context), form, keys.
Cell = tuple[int, float, str, int]
#: One needle: its cell and its index within the cell.
Needle = tuple[int, float, str, int, int]


def ceiling_of(settings: Mapping[str, Any]) -> float:
    """The run's baseline ceiling (``retrieval_ceiling``), a share."""
    found = settings.get("retrieval_ceiling")
    return DEFAULT_CEILING if found is None else float(found)


def _cell(r: RetrievalRecord) -> Cell:
    return (
        int(r.get("depth") or 0),
        float(r.get("position") or 0.0),
        str(r.get("form") or ""),
        int(r.get("keys") or 1),
    )


@dataclass
class _Outcomes:
    """The records collapsed over boots: per arm, which needles were found; and what was left out."""

    found: dict[str, dict[Needle, bool]] = field(default_factory=dict)
    failed: dict[tuple[str, Cell], int] = field(default_factory=dict)
    errors: dict[str, list[str]] = field(default_factory=dict)
    #: per arm, the needles whose answered boots disagreed
    split: dict[str, int] = field(default_factory=dict)
    cells: list[Cell] = field(default_factory=list)

    def needles(self, arm: str, cells: Iterable[Cell]) -> dict[Needle, bool]:
        """The arm's answered needles in ``cells``."""
        wanted = set(cells)
        return {k: v for k, v in self.found.get(arm, {}).items() if k[:4] in wanted}

    def accuracy(self, arm: str, cells: Iterable[Cell]) -> tuple[int, int]:
        """(found, answered needles) of the arm over ``cells``."""
        mine = self.needles(arm, cells)
        return sum(mine.values()), len(mine)


def _collapse(records: Sequence[RetrievalRecord], arms: Sequence[str]) -> _Outcomes:
    """Per arm and needle, the share of its answered boots that were correct; found at half or more."""
    votes: dict[str, dict[Needle, list[bool]]] = {arm: {} for arm in arms}
    out = _Outcomes()
    cells: set[Cell] = set()
    for r in records:
        arm = str(r.get("arm"))
        if arm not in votes:
            continue
        cell = _cell(r)
        cells.add(cell)
        if not r.get("ok"):
            out.failed[(arm, cell)] = out.failed.get((arm, cell), 0) + 1
            out.errors.setdefault(arm, []).append(str(r.get("error") or "no error given"))
            continue
        votes[arm].setdefault((*cell, int(r.get("needle") or 0)), []).append(bool(r.get("correct")))
    for arm, needles in votes.items():
        out.found[arm] = {k: sum(v) / len(v) >= 0.5 for k, v in needles.items()}
        out.split[arm] = sum(1 for v in needles.values() if 0 < sum(v) < len(v))
    out.cells = sorted(cells)
    return out


@dataclass(frozen=True)
class _Paired:
    """The 2×2 table of two arms over the needles both answered."""

    both: int
    base_only: int
    arm_only: int
    neither: int

    @property
    def n(self) -> int:
        return self.both + self.base_only + self.arm_only + self.neither

    @property
    def diff(self) -> float:
        return (self.arm_only - self.base_only) / self.n


def _pair(arm: Mapping[Needle, bool], base: Mapping[Needle, bool]) -> tuple[_Paired, list[tuple[bool, bool]]]:
    """The paired table of ``arm`` against ``base`` over their shared needles, and the (arm, base) outcomes."""
    pairs = [(arm[k], base[k]) for k in sorted(arm) if k in base]
    table = _Paired(
        both=sum(1 for a, b in pairs if a and b),
        base_only=sum(1 for a, b in pairs if b and not a),
        arm_only=sum(1 for a, b in pairs if a and not b),
        neither=sum(1 for a, b in pairs if not a and not b),
    )
    return table, pairs


def _r(value: float | None) -> float | None:
    return None if value is None else round(float(value), 4)


def pct(value: float) -> str:
    return f"{value * 100:.0f}%"


def _where(cell: Cell, words: Mapping[str, bool]) -> str:
    """A cell in words: "32k, 90% of the context", with the form and keys when the run has several
    (``words``: ``forms`` and ``multi_keys``, whether it has)."""
    depth, position, form, keys = cell
    extra = [form] if words["forms"] else []
    if words["multi_keys"]:
        extra.append("single needle" if keys == 1 else f"{keys} keys")
    return f"{depth_label(depth)}, {pct(position)} of the context" + (f" ({', '.join(extra)})" if extra else "")


def section(
    records: Sequence[RetrievalRecord], arms: Sequence[str], settings: Mapping[str, Any]
) -> dict[str, Any] | None:
    """The report's retrieval section (None without retrieval records): the setup, accuracy per arm and
    cell, paired differences against the baseline with McNemar p-values Holm-adjusted per arm, a sentence
    per arm and what was left out. JSON-serialisable, floats rounded to 4 decimals, ordered by arm (run
    order), depth, position, form and keys."""
    if not records or not arms:
        return None
    ceiling = ceiling_of(settings)
    got = _collapse(records, arms)
    base = arms[0]
    forms = list(dict.fromkeys(c[2] for c in got.cells))
    keys = sorted({c[3] for c in got.cells})
    words = {"forms": len(forms) > 1, "multi_keys": len(keys) > 1}
    per_cell = {c: len({k for arm in arms for k in got.found[arm] if k[:4] == c}) for c in got.cells}
    config: dict[str, Any] = {
        "baseline": base,
        "arms": list(arms),
        "forms": forms,
        "depths": sorted({c[0] for c in got.cells}),
        "positions": sorted({c[1] for c in got.cells}),
        "keys": keys,
        "needles": max(per_cell.values(), default=0),
        "ceiling": ceiling,
        "haystack": ", ".join(sorted({str(r.get("haystack")) for r in records if r.get("haystack")})) or None,
        "boots": {arm: len({str(r.get("boot")) for r in records if r.get("arm") == arm}) for arm in arms},
    }
    notes: list[str] = []
    below: dict[Cell, bool] = {}
    cells: list[dict[str, Any]] = []
    for arm in arms:
        for cell in got.cells:
            found, n = got.accuracy(arm, [cell])
            lo, hi = wilson_interval(found, n) if n else (None, None)
            if arm == base:
                below[cell] = n > 0 and found / n < ceiling
                if below[cell]:
                    notes.append(
                        f"the baseline finds {found} of {n} needles at {_where(cell, words)}: below the "
                        f"{pct(ceiling)} ceiling, no verdict"
                    )
            cells.append(
                {
                    "arm": arm,
                    "point": depth_label(cell[0]),
                    "depth": cell[0],
                    "position": cell[1],
                    "form": cell[2],
                    "keys": cell[3],
                    "n": n,
                    "found": found,
                    "acc": _r(found / n) if n else None,
                    "ci": [_r(lo), _r(hi)],
                    "failed": got.failed.get((arm, cell), 0),
                    "ceiling": below[cell],
                }
            )
    diffs = _diffs(got, arms, below, words, notes)
    for arm in arms:
        failed = sum(v for (a, _), v in got.failed.items() if a == arm)
        if failed:
            first = got.errors[arm][0]
            notes.append(f"{arm}: {failed} request(s) failed, left out of its accuracy (first: {first})")
        if got.split.get(arm):
            notes.append(
                f"{arm}: {got.split[arm]} needle(s) whose boots disagreed (found when at least half of its boots "
                "returned it)"
            )
    return {
        "config": config,
        "cells": cells,
        "diffs": diffs,
        "sentences": _sentences(diffs, arms, ceiling, words),
        "comparisons": sum(1 for d in diffs if d["family_size"] is not None),
        "notes": notes,
    }


def _diffs(
    got: _Outcomes, arms: Sequence[str], below: Mapping[Cell, bool], words: Mapping[str, bool], notes: list[str]
) -> list[dict[str, Any]]:
    """One row per arm (not the baseline) and cell: the paired difference, its interval, McNemar's p and
    Holm's within the arm's judged cells, the verdict. Unpaired needles are named in ``notes``."""
    base = arms[0]
    rows: list[dict[str, Any]] = []
    for arm in arms[1:]:
        mine: list[dict[str, Any]] = []
        for cell in got.cells:
            arm_found, base_found = got.needles(arm, [cell]), got.needles(base, [cell])
            table, _ = _pair(arm_found, base_found)
            unpaired = len(set(arm_found) ^ set(base_found))
            if not arm_found or not base_found:  # a cell one side never answered (a run stopped before it)
                missing = arm if not arm_found else base
                notes.append(f"{missing} at {_where(cell, words)}: not measured (no needle answered)")
            elif unpaired:
                notes.append(
                    f"{arm} at {_where(cell, words)}: {unpaired} needle(s) answered on one side only, left out "
                    "of the pairing"
                )
            row: dict[str, Any] = {
                "arm": arm,
                "baseline": base,
                "point": depth_label(cell[0]),
                "depth": cell[0],
                "position": cell[1],
                "form": cell[2],
                "keys": cell[3],
                "n": table.n,
                "b": table.base_only,
                "c": table.arm_only,
                "diff": None,
                "ci": [None, None],
                "ci_level": None,
                "p": None,
                "p_holm": None,
                "family_size": None,
                "verdict": "cannot judge" if table.n else "not measured",
                "ceiling": below.get(cell, False),
            }
            if table.n:
                row["diff"] = _r(table.diff)
                if row["ceiling"]:  # no verdict: the interval only describes, at 95%
                    lo, hi = exact_difference_interval(table.base_only, table.arm_only, table.n, 1 - stats.CONFIDENCE)
                    row.update({"ci": [_r(lo), _r(hi)], "ci_level": stats.CONFIDENCE})
                else:
                    row["p"] = mcnemar_p(table.base_only, table.arm_only)
            mine.append(row)
        judged = [row for row in mine if row["p"] is not None]
        p_values = [row["p"] for row in judged]
        for row, adjusted, alpha in zip(judged, stats.holm(p_values), stats.holm_levels(p_values), strict=True):
            # the printed interval is the one that decided: at the level of the cell's Holm step
            lo, hi = exact_difference_interval(row["b"], row["c"], row["n"], alpha)
            significant = adjusted < stats.FAMILY_ALPHA and row["diff"] != 0
            row.update(
                {
                    "ci": [_r(lo), _r(hi)],
                    "ci_level": _r(1 - alpha),
                    "p": _r(row["p"]),
                    "p_holm": _r(adjusted),
                    "family_size": len(judged),
                    "verdict": ("worse" if row["diff"] < 0 else "better") if significant else "inconclusive",
                }
            )
        rows += mine
    return rows


def _points(value: float) -> str:
    return f"{value * 100:.0f}"


def _sentences(
    diffs: Sequence[Mapping[str, Any]], arms: Sequence[str], ceiling: float, words: Mapping[str, bool]
) -> list[str]:
    """One sentence per arm: its worst decided loss (else its largest decided gain) with the interval that decided
    it; for the cells nothing was decided on, the largest loss their intervals still allow (a cell that differs by
    no more than its interval is not "the same": it is undecided)."""
    out: list[str] = []
    for arm in arms[1:]:
        mine = [d for d in diffs if d["arm"] == arm]
        judged = [d for d in mine if d["family_size"] is not None]
        blocked = sum(1 for d in mine if d["ceiling"])
        unmeasured = sum(1 for d in mine if d["verdict"] == "not measured")
        cannot = f"; {blocked} cell{'' if blocked == 1 else 's'} the baseline cannot judge" if blocked else ""
        cannot += f"; {unmeasured} cell{'' if unmeasured == 1 else 's'} not measured" if unmeasured else ""
        if not judged:
            out.append(
                f"{arm} against {arms[0]}: no cell can be judged (the baseline finds fewer than {pct(ceiling)} of "
                "the needles, or no needle was answered by both)"
            )
            continue

        def where(d: Mapping[str, Any]) -> str:
            return _where((d["depth"], d["position"], d["form"], d["keys"]), words)

        def allowed(rows: Sequence[Mapping[str, Any]]) -> str:
            """The largest loss the undecided cells' intervals allow, and where."""
            worst = min(rows, key=lambda row: float(row["ci"][0]))
            if float(worst["ci"][0]) >= 0:
                return "their intervals allow no loss"
            return f"their intervals allow a loss of up to {_points(-float(worst['ci'][0]))} points, at {where(worst)}"

        moved = sorted((d for d in judged if d["verdict"] in ("worse", "better")), key=lambda d: d["diff"])
        rest = [d for d in judged if d["verdict"] == "inconclusive"]
        cells = f"{len(judged)} cell{'' if len(judged) == 1 else 's'}"
        if not moved:
            out.append(f"{arm}: no cell differs from {arms[0]} (Holm over {cells}{cannot}); {allowed(rest)}")
            continue
        head = moved[0] if moved[0]["verdict"] == "worse" else moved[-1]
        lo, hi = head["ci"]
        if head["verdict"] == "worse":
            text = f"{arm} loses {_points(-head['diff'])} points [{_points(-hi)}, {_points(-lo)}] at {where(head)}"
        else:
            text = f"{arm} finds {_points(head['diff'])} points more [{_points(lo)}, {_points(hi)}] at {where(head)}"
        also = [d for d in moved if d is not head]
        if also:
            text += "; also " + ", ".join(
                f"{d['verdict']} at {where(d)} ({float(d['diff']) * 100:+.0f} points)" for d in also
            )
        if rest:
            text += f"; {len(rest)} more undecided, {allowed(rest)}"
        text += f" (Holm over {cells}{cannot})"
        out.append(text)
    return out


def _judgeable(got: _Outcomes, reference: str, cells: Sequence[Cell], ceiling: float) -> list[Cell]:
    """The cells (of ``cells``) where ``reference`` finds at least ``ceiling`` of the needles it answered."""
    judged = []
    for cell in cells:
        found, n = got.accuracy(reference, [cell])
        if n and found / n >= ceiling:
            judged.append(cell)
    return judged


def gate_results(
    gate: Gate,
    label: str,
    point: str,
    records: Sequence[RetrievalRecord],
    arms: Sequence[str],
    settings: Mapping[str, Any],
) -> list[GateResult]:
    """A retrieval gate at one point (a depth label), over every cell of that depth its reference arm can
    judge (the baseline for an absolute or baseline gate, the other arm of a between gate):

    - between with an offset (``fp8 >= auto - 0.05``): the paired difference over those cells' needles and
      its Newcombe interval (:func:`paired_difference_interval`) against the offset;
    - between with a factor, or against the baseline (``>= -5%``): the ratio of the two accuracies with a
      percentile interval from a paired bootstrap over needles (2,000 resamples, seed 0) against the factor;
    - absolute: each arm's (every arm's, the baseline's too, without one named) Wilson interval.

    Where the reference is below the ceiling in every cell the outcome is ``error`` ("cannot judge: …"),
    never a pass or fail; so is a point without records, or a gate against a stored run."""
    ceiling = ceiling_of(settings)
    at = [r for r in records if depth_label(int(r.get("depth") or 0)) == point]
    got = _collapse(at, arms)

    def error(name: str, reason: str) -> GateResult:
        result = gate_result(gate, name, "error", None, None, None, reason)
        result["ci_method"] = CI_METHOD
        evidence: GateEvidence = {"kind": "none", "text": reason}
        result["evidence"] = evidence
        return result

    def blocked(reference: str) -> tuple[list[Cell], str | None]:
        """The cells ``reference`` can judge, or why none."""
        judged = _judgeable(got, reference, got.cells, ceiling)
        if judged:
            return judged, None
        found, n = got.accuracy(reference, got.cells)
        if not n:
            return [], f"cannot judge: {reference} answered no needle at {point}"
        who = "the baseline" if reference == arms[0] else f"{reference} (the reference)"
        return [], (
            f"cannot judge: {who} finds {pct(found / n)} of the needles at {point}, below the {pct(ceiling)} ceiling"
        )

    def done(name: str, value: float | None, lo: float | None, hi: float | None, text: str, ratio: bool) -> GateResult:
        outcome = judge(gate.op, lo, hi, gate.threshold) if value is not None else "inconclusive"
        result = gate_result(gate, name, outcome, value, lo, hi, text, ratio=ratio)
        result["ci_method"] = CI_METHOD
        evidence: GateEvidence = {"kind": CI_METHOD, "text": text}
        result["evidence"] = evidence
        return result

    if not got.cells:
        return [error(label, f"no retrieval records at {point}")]
    if gate.kind == "saved":
        return [error(label, "a retrieval gate compares arms of this run, not a stored run")]
    if gate.kind == "absolute":
        judged, why = blocked(arms[0])
        results = []
        for arm in [gate.arm] if gate.arm else list(arms):
            name = f"{label} ({arm})"
            if why is not None:
                results.append(error(name, why))
                continue
            found, n = got.accuracy(arm, judged)
            if not n:
                results.append(done(name, None, None, None, f"{arm} answered no needle at {point}", False))
                continue
            lo, hi = wilson_interval(found, n)
            text = f"Wilson interval over {n} needles at {point} ({found} found, {len(judged)} cells)"
            results.append(done(name, found / n, lo, hi, text, False))
        return results
    pairs = [(str(gate.arm), str(gate.other))] if gate.kind == "between" else [(arm, arms[0]) for arm in arms[1:]]
    results = []
    for arm, other in pairs:
        name = f"{label} ({arm}/{other})"
        judged, why = blocked(other)
        if why is not None:
            results.append(error(name, why))
            continue
        table, outcomes = _pair(got.needles(arm, judged), got.needles(other, judged))
        if not table.n:
            results.append(done(name, None, None, None, f"no needle at {point} answered by both arms", False))
        elif gate.offset is not None:
            lo, hi = paired_difference_interval(table.both, table.base_only, table.arm_only, table.neither)
            text = (
                f"paired difference over {table.n} needles at {point} ({table.base_only} found by {other} only, "
                f"{table.arm_only} by {arm} only; Newcombe's paired score interval)"
            )
            results.append(done(name, table.diff, lo, hi, text, False))
        else:
            value, low, high = _ratio_bootstrap(outcomes)
            text = (
                f"ratio of accuracies over {table.n} paired needles at {point} (paired bootstrap, "
                f"{BOOTSTRAP_RESAMPLES:,} resamples)"
            )
            if value is None:
                text = f"{other} finds none of the {table.n} paired needles at {point}: no ratio"
            results.append(done(name, value, low, high, text, True))
    return results


def _ratio_bootstrap(pairs: Sequence[tuple[bool, bool]]) -> tuple[float | None, float | None, float | None]:
    """arm accuracy / other accuracy over paired needles ``(arm found, other found)``, with the 95% percentile
    interval of a paired bootstrap over needles (resamples where the other finds nothing are left out)."""
    outcomes = np.asarray(pairs, dtype=float)
    if not outcomes[:, 1].sum():
        return None, None, None
    value = float(outcomes[:, 0].sum() / outcomes[:, 1].sum())
    rng = np.random.default_rng(BOOTSTRAP_SEED)
    picks = rng.integers(0, len(outcomes), size=(BOOTSTRAP_RESAMPLES, len(outcomes)))
    arm, other = outcomes[picks, 0].sum(axis=1), outcomes[picks, 1].sum(axis=1)
    keep = other > 0
    ratios = arm[keep] / other[keep]
    tail = (1 - stats.CONFIDENCE) / 2
    lo, hi = np.quantile(ratios, [tail, 1 - tail])
    return value, float(lo), float(hi)


def frame_rows(records: Sequence[RetrievalRecord]) -> pd.DataFrame:
    """The report frame's retrieval rows, one per record in the frame's columns (as ``report.fidelity``'s):
    ``retrieval_acc`` 1.0 / 0.0 for a needle found or missed, None (and not valid) for a failed request, so
    the frame knows the probe's points and arms."""
    if not records:
        return pd.DataFrame()
    rows = [
        {
            "arm": r.get("arm"),
            "boot": r.get("boot"),
            "replicate": r.get("replicate") or 1,
            "probe": PROBE,
            "point": depth_label(int(r.get("depth") or 0)),
            "depth": r.get("depth"),
            "turn": None,
            "session": None,
            "index": r.get("needle"),
            "pair": None,
            "valid": bool(r.get("ok")),
            "flagged": False,
            "excluded_reason": None,
            "prompt_tokens": r.get("prompt_tokens"),
            "cached_tokens": None,
            METRIC: (1.0 if r.get("correct") else 0.0) if r.get("ok") else None,
            # what pairs a needle across arms: gates read the records back from the frame (records_of)
            "position": r.get("position"),
            "form": r.get("form"),
            "keys": r.get("keys"),
        }
        for r in records
    ]
    return pd.DataFrame(rows)


def records_of(frame: pd.DataFrame) -> list[RetrievalRecord]:
    """The retrieval records :func:`frame_rows` made rows of (as much of them as gates judge on)."""
    if frame.empty or "position" not in frame:
        return []
    found: list[RetrievalRecord] = []
    for row in frame.to_dict("records"):
        ok = bool(row.get("valid"))
        found.append(
            {
                "arm": str(row["arm"]),
                "boot": str(row["boot"]),
                "replicate": int(row.get("replicate") or 1),
                "depth": int(row["depth"]),
                "position": float(row["position"]),
                "form": str(row["form"]),
                "keys": int(row["keys"]),
                "needle": int(row["index"]),
                "ok": ok,
                "correct": ok and row.get(METRIC) == 1.0,
            }
        )
    return found


# ---- renderers over the finished report ------------------------------------------------------------------------
