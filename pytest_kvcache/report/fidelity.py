"""The fidelity probe in the report: ``fidelity.jsonl`` paired into comparisons, blocks, a section and
one sentence per arm that puts speed and fidelity side by side.

Two kinds of comparison, each per text and depth:

- "between arms": every arm against the baseline arm, same replicate (the A/B);
- "across boots": every arm's later boots against its first (the same configuration booted again: the
  measure's own noise floor, ~0 on a deterministic engine).

Only records over the same token ids (``ids_sha256``), both scored and proven cold, are compared. Blocks
of ``probes.fidelity.BLOCK`` positions are the unit of the CIs: pooled over texts with fewer than
``MIN_BOOTS_FOR_BOOT_CI`` boots per arm, else hierarchical (boots, then blocks). Plain Python: no pytest.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import cast

import numpy as np
import pandas as pd

from pytest_kvcache import stats
from pytest_kvcache.model import DeltaRow, FidelityRecord, FidelityRow, FidelitySection, Json
from pytest_kvcache.probes import fidelity
from pytest_kvcache.probes.registry import FIDELITY_METRICS
from pytest_kvcache.report.frame import MIN_BOOTS_FOR_BOOT_CI, point_sort

PROBE = "fidelity"
KINDS = ("between arms", "across boots")


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


def _windows(record: FidelityRecord) -> list[fidelity.Window]:
    """A record's well-formed windows (a malformed one is named in the section's notes)."""
    found = []
    for data in record.get("windows") or []:
        try:
            found.append(fidelity.Window.from_dict(data))
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
                        "point": fidelity.depth_label(arm_window.depth),
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


def _ci(group: pd.DataFrame, metric: str, hierarchical: bool, seed: int) -> tuple[float | None, list[float | None]]:
    values = group[metric].dropna()
    if values.empty:
        return None, [None, None]
    if hierarchical:
        per_boot = [g[metric].dropna().astype(float).tolist() for _, g in group.groupby("boot", sort=False)]
        mean, lo, hi = stats.mean_ci_boots(per_boot, seed=seed)
    else:
        mean, lo, hi = stats.mean_ci(values.astype(float).tolist(), seed=seed)
    return mean, [lo, hi]


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
                boots = int(group["boot"].nunique())
                hierarchical = boots >= MIN_BOOTS_FOR_BOOT_CI
                row: FidelityRow = {
                    "kind": kind,
                    "arm": arm,
                    "baseline": str(group["baseline"].iloc[0]) if kind == "between arms" else f"{arm} (first boot)",
                    "point": str(point),
                    "depth": int(group["depth"].iloc[0]),
                    "texts": int(group["text"].nunique()),
                    "boots": boots,
                    "positions": int(group["positions"].sum()),
                    "blocks": len(group),
                    "ci_method": "boots" if hierarchical else "blocks",
                    "baseline_nll": float(group["baseline_nll"].mean()),
                }
                for metric in FIDELITY_METRICS:
                    mean, ci = _ci(group, metric, hierarchical, seed)
                    row[metric] = mean  # type: ignore[literal-required]
                    row[f"{metric}_ci"] = ci  # type: ignore[literal-required]
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
            depths = ", ".join(fidelity.depth_label(int(d)) for d in r.get("short_depths") or [])
            notes.append(f"{where}: depth(s) {depths} beyond the {r.get('prompt_tokens', 0):,} tokens it could score")
        for data in r.get("windows") or []:
            try:
                fidelity.Window.from_dict(data)
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
            text += f" (95% CI {nats(lo, 3)}–{nats(hi, 3)})"
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
