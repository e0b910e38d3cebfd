"""The fidelity probe in the report: ``fidelity.jsonl`` paired into comparisons, blocks, a section and
one sentence per arm that puts speed and fidelity side by side.

Two kinds of comparison, each per text and depth:

- "between arms": every arm against the baseline arm, same replicate (the A/B);
- "across boots": every arm's later boots against its first (the same configuration booted again: the
  measure's own noise floor, ~0 on a deterministic engine).

Only records over the same token ids (``ids_sha256``), both scored and proven cold, are compared. Positions
are averaged in blocks of ``probes.fidelity.BLOCK``.

The CIs replicate over texts, not boots. A deterministic engine scores the same ids with the same logprobs
on every boot, so boots add no information: a CI over boots (or over blocks pooled across boots) is
zero-width or covers only the positions of the texts that were scored, and says nothing of how an arm
drifts on another kind of text. So for each row (kind, arm, depth) each text gets one value — the mean of
its blocks in each boot, averaged over its boots — and the CI is Student's t-interval over those per-text
means, ``texts − 1`` degrees of freedom (the row's value is their mean: each text counts once). Student's t,
not a bootstrap with texts as clusters: with the 3–4 texts a run has, a cluster bootstrap has a handful of
distinct resamples and its percentile interval is too narrow (at 4 texts it is the normal interval shrunk
by √(3/4), against the t quantile's 3.18); the t-interval is exact for normal per-text means and honest
about how few there are. With fewer than ``MIN_TEXTS`` texts there is no CI (``NO_CI``): the row says so,
its sentence says so, and a gate on it is inconclusive with that reason (:func:`gate_results`) — more boots
cannot decide it, more texts can. A ratio gate between two arms (``int8 <= fp8 * 0.5``) is judged on
Fieller's interval for the ratio of the two arms' per-text means (paired by text, the same t quantile):
exactly the ratios a paired t-test over texts does not reject. Plain Python: no pytest.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, cast

import numpy as np
import pandas as pd

from pytest_kvcache import stats
from pytest_kvcache.engines.scoring import Window
from pytest_kvcache.model.base import Json
from pytest_kvcache.model.records import FidelityRecord
from pytest_kvcache.model.report import DeltaRow
from pytest_kvcache.model.sections import FidelityRow, FidelitySection
from pytest_kvcache.probes import fidelity
from pytest_kvcache.probes.registry import FIDELITY_METRICS, depth_label
from pytest_kvcache.report.gate_outcome import gate_result, judge
from pytest_kvcache.report.points import point_sort

if TYPE_CHECKING:
    from pytest_kvcache.config.grammars import Gate
    from pytest_kvcache.model.report import GateEvidence, GateResult

PROBE = "fidelity"
KINDS = ("between arms", "across boots")
#: The fewest texts a fidelity CI is computed from (a t-interval over 2 texts has 1 degree of freedom, ±12.7
#: standard errors, and two kinds of text say little of a third).
MIN_TEXTS = stats.MIN_CLUSTERS
#: Why a row or a gate over fewer texts has no CI.
NO_CI = f"fewer than {MIN_TEXTS} texts"
#: What a row's CI is over (``ci_basis``).
CI_BASIS = "over texts"


def _usable(r: FidelityRecord) -> bool:
    return bool(r.get("ok")) and not r.get("excluded_reason") and bool(r.get("windows"))


def _pairs(records: Sequence[FidelityRecord], arms: Sequence[str]) -> list[tuple[str, FidelityRecord, FidelityRecord]]:
    """(kind, baseline-side record, arm-side record) for every comparison the records allow."""
    found: dict[tuple[str, int, str], FidelityRecord] = {}
    for r in records:
        if _usable(r):
            found[(str(r.get("arm")), int(r.get("replicate") or 1), str(r.get("text")))] = r
    texts = list(dict.fromkeys(text for _, _, text in found))
    out: list[tuple[str, FidelityRecord, FidelityRecord]] = []
    if not arms:
        return out
    base = arms[0]

    def reps(arm: str, text: str) -> list[int]:
        """The replicates in which ``arm`` scored ``text`` usably."""
        return sorted(rep for a, rep, t in found if a == arm and t == text)

    for text in texts:
        for arm in arms[1:]:
            for rep in sorted(set(reps(base, text)) & set(reps(arm, text))):
                out.append(("between arms", found[(base, rep, text)], found[(arm, rep, text)]))
        for arm in arms:
            mine = reps(arm, text)  # the first usable boot of this text is the reference
            out += [("across boots", found[(arm, mine[0], text)], found[(arm, rep, text)]) for rep in mine[1:]]
    return out


def _windows(record: FidelityRecord) -> list[Window]:
    """A record's well-formed windows (a malformed one is named in the section's notes)."""
    found = []
    for data in record.get("windows") or []:
        try:
            found.append(Window.from_dict(data))
        except ValueError:
            continue
    return found


def blocks(records: Sequence[FidelityRecord], arms: Sequence[str]) -> pd.DataFrame:
    """One row per comparison × text × depth × block of positions, with the block's mean metrics."""
    rows: list[dict[str, object]] = []
    for kind, b, a in _pairs(records, arms):
        # windows are compared where they hold the same ids (compare_windows checks): arms that cut the
        # prompt at another max_model_len still compare at the depths both reached
        base_windows = {w.depth: w for w in _windows(b)}
        for arm_window in _windows(a):
            base_window = base_windows.get(arm_window.depth)
            if base_window is None:
                continue
            try:
                per = fidelity.compare_windows(base_window, arm_window)
            except ValueError:
                continue
            per["baseline_nll"] = -np.asarray(base_window.logprob, dtype=float)
            for i, block in enumerate(fidelity.block_metrics(per)):
                rows.append(
                    {
                        "kind": kind,
                        "arm": a.get("arm"),
                        "baseline": b.get("arm"),
                        "boot": a.get("boot"),
                        "baseline_boot": b.get("boot"),
                        "replicate": a.get("replicate") or 1,
                        "text": a.get("text"),
                        "depth": arm_window.depth,
                        "point": depth_label(arm_window.depth),
                        "block": i,
                        "positions": min(fidelity.BLOCK, len(base_window.logprob) - i * fidelity.BLOCK),
                        **{name: block.get(name) for name in (*FIDELITY_METRICS, "baseline_nll")},
                    }
                )
    return pd.DataFrame(rows)


def frame_rows(found: pd.DataFrame) -> pd.DataFrame:
    """The report frame's fidelity rows: each arm's blocks against the baseline (what gates and the
    summary read), in the frame's columns."""
    if found.empty:
        return found
    mine = found[found["kind"] == "between arms"]
    if mine.empty:
        return pd.DataFrame()
    out = pd.DataFrame(
        {
            "arm": mine["arm"],
            "boot": mine["boot"],
            "probe": PROBE,
            "point": mine["point"],
            "depth": mine["depth"],
            "turn": None,
            "session": mine["text"],
            "index": mine["block"],
            "pair": None,
            "valid": True,
            "flagged": False,
            "excluded_reason": None,
            "prompt_tokens": None,
            "cached_tokens": None,
        }
    )
    for metric in FIDELITY_METRICS:
        out[metric] = mine[metric].astype(object).where(mine[metric].notna(), None)
    return out.reset_index(drop=True)


def text_means(group: pd.DataFrame, metric: str, text: str = "text") -> dict[str, float]:
    """Each text's value of ``metric`` in a slice of blocks (one kind, arm and depth): per boot the mean of
    the text's blocks, then the mean over its boots (a text counts once, however many boots scored it).
    ``text``: the column naming the text (``session`` in the report frame's rows)."""
    found: dict[str, float] = {}
    if group.empty or metric not in group:
        return found
    for name, of_text in group.groupby(text, sort=False):
        per_boot = []
        for _, of_boot in of_text.groupby("boot", sort=False):
            values = pd.to_numeric(of_boot[metric], errors="coerce").dropna()
            if not values.empty:
                per_boot.append(float(values.mean()))
        if per_boot:
            found[str(name)] = float(np.mean(per_boot))
    return found


def over_texts(means: Mapping[str, float]) -> tuple[float | None, float | None, float | None]:
    """Mean of the per-text means and its Student t-interval (``texts − 1`` df); no interval with fewer than
    ``MIN_TEXTS`` texts. Per-text means that are all equal give a zero-width interval at that value."""
    return stats.mean_ci_clusters(list(means.values()), min_clusters=MIN_TEXTS)


def ratio_over_texts(
    arm: Mapping[str, float], other: Mapping[str, float]
) -> tuple[float | None, float | None, float | None, int]:
    """The ratio of two arms' means over the texts both have (``arm / other``), Fieller's interval for it
    (paired by text, Student's t on ``texts − 1`` df: the ratios r a paired t-test of ``arm − r·other`` over
    the texts does not reject), and how many texts were paired. No interval with fewer than ``MIN_TEXTS``
    texts, or when ``other``'s mean is not distinguishable from 0 (the set is then unbounded)."""
    shared = [t for t in arm if t in other]
    n = len(shared)
    x = np.asarray([arm[t] for t in shared], dtype=float)
    y = np.asarray([other[t] for t in shared], dtype=float)
    if n == 0 or float(y.mean()) == 0.0:
        return None, None, None, n
    mx, my = float(x.mean()), float(y.mean())
    ratio = mx / my
    if n < MIN_TEXTS:
        return ratio, None, None, n
    q = stats.t_quantile(n - 1) ** 2
    vx, vy = float(x.var(ddof=1)) / n, float(y.var(ddof=1)) / n
    cxy = float(np.cov(x, y, ddof=1)[0, 1]) / n
    a = my * my - q * vy
    if a <= 0:
        return ratio, None, None, n
    b = mx * my - q * cxy
    c = mx * mx - q * vx
    root = math.sqrt(max(0.0, b * b - a * c))
    return ratio, (b - root) / a, (b + root) / a, n


def _texts_words(means: Mapping[str, float]) -> str:
    return f"{len(means)}: {', '.join(sorted(means))}" if means else "0"


def no_ci(means: Mapping[str, float]) -> str:
    """Why there is no CI over these texts, in words."""
    return (
        f"{NO_CI} ({_texts_words(means)}): fidelity is deterministic across boots, so only texts replicate it; "
        f"give {MIN_TEXTS}+ (--kv-fidelity-texts)"
    )


def gate_results(gate: Gate, label: str, at: pd.DataFrame, arms: Sequence[str]) -> list[GateResult]:
    """A fidelity gate at one point (``at``: the report frame's fidelity rows there), judged over texts: an
    absolute one on :func:`over_texts` per arm (every arm but the baseline when it names none), one between
    two arms on :func:`ratio_over_texts`. Evidence ``texts``; with fewer than ``MIN_TEXTS`` texts the gate
    is inconclusive and says why (:func:`no_ci`). No ``boots_to_decide``: boots cannot decide it."""

    def of(arm: str | None) -> dict[str, float]:
        mine = at[at["arm"] == arm] if not at.empty else at
        return text_means(mine, gate.metric, text="session")

    def one(
        name: str, value: float | None, lo: float | None, hi: float | None, means: Mapping[str, float]
    ) -> GateResult:
        ratio = gate.kind == "between"
        if not means or value is None:
            why = f"{gate.other}'s {gate.metric} averages 0 over the texts: no ratio" if means else "no valid samples"
            result = gate_result(gate, name, "inconclusive", value, None, None, why, ratio=ratio)
            result["evidence"] = {"kind": "none"}
            return result
        n = len(means)
        evidence: GateEvidence = {"kind": "texts", "texts": n}
        if n < MIN_TEXTS:
            evidence["text"] = no_ci(means)
        elif lo is None or hi is None:
            evidence["text"] = (
                f"no CI over texts ({n} texts): {gate.other}'s {gate.metric} is not distinguishable from 0, so the "
                "ratio's interval is unbounded"
            )
        else:
            evidence["df"] = n - 1
            how = "Fieller's interval for the ratio, paired by text" if ratio else "t-interval"
            evidence["text"] = f"CI over texts ({_texts_words(means)}: {how}, {n - 1} df)"
        result = gate_result(gate, name, judge(gate.op, lo, hi, gate.threshold), value, lo, hi, evidence["text"], ratio)
        result["ci_method"] = "texts"
        result["evidence"] = evidence
        return result

    if gate.kind == "between":
        mine, other = of(gate.arm), of(gate.other)
        value, lo, hi, _ = ratio_over_texts(mine, other)
        paired = {t: v for t, v in mine.items() if t in other}
        return [one(f"{label} ({gate.arm}/{gate.other})", value, lo, hi, paired)]
    found = []
    for arm in [gate.arm] if gate.arm else list(arms[1:]):
        means = of(arm)
        mean, lo, hi = over_texts(means)
        found.append(one(f"{label} ({arm})", mean, lo, hi, means))
    return found


def section(
    found: pd.DataFrame, records: Sequence[FidelityRecord], arms: Sequence[str], settings: Mapping[str, Json], seed: int
) -> FidelitySection:
    """The report's fidelity section: one row per kind × arm × depth, the setup, and what was left out."""
    notes = _notes(records, arms)
    config: dict[str, Json] = {
        "depths": settings.get("fidelity_depths"),
        "top_k": settings.get("fidelity_top_k"),
        "window": settings.get("fidelity_window"),
        "block": fidelity.BLOCK,
        "texts": cast(Json, {str(r.get("text")): r.get("text_sha256") for r in records if r.get("text")}),
        "baseline": arms[0] if arms else None,
    }
    rows: list[FidelityRow] = []
    if found.empty:
        return {"config": config, "rows": rows, "notes": notes}
    for kind in KINDS:
        mine = found[found["kind"] == kind]
        for arm in arms:
            at_arm = mine[mine["arm"] == arm]
            for point in sorted(at_arm["point"].unique(), key=point_sort):
                group = at_arm[at_arm["point"] == point]
                row: FidelityRow = {
                    "kind": kind,
                    "arm": arm,
                    "baseline": str(group["baseline"].iloc[0]) if kind == "between arms" else f"{arm} (first boot)",
                    "point": str(point),
                    "depth": int(group["depth"].iloc[0]),
                    "texts": int(group["text"].nunique()),
                    "boots": int(group["boot"].nunique()),
                    "positions": int(group["positions"].sum()),
                    "blocks": len(group),
                    "ci_method": "texts",
                    "ci_basis": CI_BASIS,
                    "baseline_nll": float(group["baseline_nll"].mean()),
                }
                for metric in FIDELITY_METRICS:
                    means = text_means(group, metric)
                    mean, lo, hi = over_texts(means)
                    row[metric] = mean  # type: ignore[literal-required]
                    row[f"{metric}_ci"] = [lo, hi]  # type: ignore[literal-required]
                    if metric == "logprob_drift":
                        row["per_text"] = {name: round(value, 6) for name, value in means.items()}
                        if lo is not None:
                            row["ci_df"] = len(means) - 1
                        elif means:
                            row["no_ci"] = no_ci(means)
                rows.append(row)
    if found["kl_topk"].isna().all():
        notes.append("no top-k logprobs (--kv-fidelity-topk=0 or the engine returned none): KL not estimated")
    return {"config": config, "rows": rows, "notes": notes}


def _notes(records: Sequence[FidelityRecord], arms: Sequence[str]) -> list[str]:
    notes: list[str] = []
    for r in records:
        where = f"{r.get('boot')} {r.get('text')}"
        if not r.get("ok"):
            notes.append(f"{where}: not scored: {r.get('error')}")
        elif r.get("excluded_reason"):
            notes.append(f"{where}: excluded: {r.get('excluded_reason')}")
        if r.get("ok") and r.get("short_depths"):
            depths = ", ".join(depth_label(int(d)) for d in r.get("short_depths") or [])
            notes.append(f"{where}: depth(s) {depths} beyond the {r.get('prompt_tokens', 0):,} tokens it could score")
        for data in r.get("windows") or []:
            try:
                Window.from_dict(data)
            except ValueError as exc:
                notes.append(f"{where}: a window left out: {exc}")
    base = arms[0] if arms else None
    ids = {(r.get("replicate") or 1, r.get("text")): r.get("ids_sha256") for r in records if r.get("arm") == base}
    for r in records:
        want = ids.get((r.get("replicate") or 1, r.get("text")))
        if r.get("ok") and r.get("arm") != base and want and r.get("ids_sha256") != want:
            notes.append(
                f"{r.get('boot')} {r.get('text')}: other token ids than {base}'s (another tokenizer, or another "
                "length): compared only at depths whose windows hold the same ids"
            )
    return sorted(set(notes))


def nats(value: float | None, digits: int = 4, *, small: bool = False) -> str:
    """A nats figure with fixed decimals; ``small`` (the KL): two significant digits in e-notation when the
    decimals would show nothing."""
    if value is None:
        return "–"
    if small and value != 0 and abs(value) < 10 ** (1 - digits):
        return f"{value:.2e}"
    return f"{value:.{digits}f}"


def _pct(value: float | None) -> str:
    return f"{value:+.1f}%" if value is not None else "–"


def sentences(rows: Sequence[FidelityRow], deltas: Sequence[DeltaRow], arms: Sequence[str]) -> list[str]:
    """One sentence per arm with speed and fidelity together, at the deepest fidelity depth:
    "int8: +2.9% short decode, −89.0% prefill at 32k; |Δ logprob| 0.041 nats/token at 32k (…)"."""
    out = []
    for arm in arms[1:]:
        mine = [r for r in rows if r.get("kind") == "between arms" and r.get("arm") == arm]
        if not mine:
            continue
        deepest = max(mine, key=lambda r: int(r.get("depth") or 0))
        parts = []
        short = [d for d in deltas if d["arm"] == arm and d["probe"] == "short" and d["metric"] == "decode_tps"]
        if short:
            parts.append("/".join(_pct(d.get("delta_pct")) for d in short) + " short decode")
        prefill = [d for d in deltas if d["arm"] == arm and d["probe"] == "prefill" and d["metric"] == "prefill_tps"]
        if prefill:
            at = min(prefill, key=lambda d: abs(point_sort(d["point"])[1] - float(deepest.get("depth") or 0)))
            parts.append(f"{_pct(at.get('delta_pct'))} prefill at {at['point']}")
        drift, (lo, hi) = deepest.get("logprob_drift"), deepest.get("logprob_drift_ci") or [None, None]
        text = "no fidelity data"
        if drift is not None:
            text = f"|Δ logprob| {nats(drift, 3)} nats/token at {deepest['point']}"
        if lo is not None and hi is not None:
            text += f" (95% CI over {deepest.get('texts')} texts {nats(lo, 3)}–{nats(hi, 3)})"
        elif drift is not None:
            text += f" (no CI: {NO_CI}, undecided)"
        kl = deepest.get("kl_topk")
        if kl is not None:
            text += f", KL ≥ {nats(kl, small=True)}"
        floor = [
            r
            for r in rows
            if r.get("kind") == "across boots" and r.get("arm") == arms[0] and r.get("point") == deepest["point"]
        ]
        if floor and floor[0].get("logprob_drift") is not None:
            text += f"; A/A across {arms[0]}'s boots: {nats(floor[0]['logprob_drift'], 3)}"
        speed = ", ".join(parts)
        out.append(f"{arm} vs {arms[0]}: " + (f"{speed}; " if speed else "") + text + ".")
    return out
