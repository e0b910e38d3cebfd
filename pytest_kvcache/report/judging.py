"""Can the baseline arm judge quality? The report's check of the baseline before any quality figure stands.

Quality figures (fidelity's logprob drift, NLL and KL) compare every arm with the baseline arm. When the
baseline is not a working model of its text — random weights, a tokenizer that splits text into characters,
greedy output that loops on a few characters — those figures measure nothing, and a gate on them would PASS or
FAIL on noise. :func:`check` reads the baseline's fidelity records with :class:`probes.judging.Check`; the report
states the result on its first screen, and a quality gate on a baseline that cannot judge ends as an error with
the reason (``report.gates``). Plain Python: no pytest.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from pytest_kvcache.model.records import FidelityRecord
from pytest_kvcache.model.sections import BaselineCheck
from pytest_kvcache.probes import judging

#: The probes whose figures are judged against the baseline's outputs.
QUALITY_PROBES = frozenset({"fidelity"})


def check(records: Sequence[FidelityRecord], arms: Sequence[str]) -> BaselineCheck | None:
    """The baseline's check from its scored fidelity records (every boot, every text); None without any."""
    if not arms:
        return None
    base = arms[0]
    mine = [r for r in records if r.get("arm") == base and r.get("ok") and r.get("windows")]
    if not mine:
        return None
    logprobs = [lp for r in mine for w in r.get("windows") or [] for lp in w.get("logprob") or []]
    nll = float(-np.mean(logprobs)) if logprobs else None
    vocab = next((int(v) for r in mine if isinstance(v := r.get("vocab_size"), int)), None)
    per_text: dict[str, tuple[int, int]] = {}
    for r in mine:
        chars, tokens = r.get("text_chars"), r.get("text_tokens")
        if isinstance(chars, int) and isinstance(tokens, int) and tokens > 0:
            per_text.setdefault(str(r.get("text")), (chars, tokens))
    cpt = judging.chars_per_token(sum(c for c, _ in per_text.values()), sum(t for _, t in per_text.values()))
    greedy = [str(r["greedy_text"]) for r in mine if r.get("greedy_text")]
    found = judging.Check(nll=nll, vocab=vocab, chars_per_token=cpt, greedy=greedy)
    problems = found.problems()
    return {
        "baseline": base,
        "texts": sorted({str(r.get("text")) for r in mine}),
        "nll": None if nll is None else round(nll, 4),
        "vocab": vocab,
        "nll_share": None if found.nll_share is None else round(found.nll_share, 4),
        "chars_per_token": None if cpt is None else round(cpt, 3),
        "greedy": greedy[:4],
        # NLL against chance is the check that establishes a working model; without it only a problem decides
        "can_judge": False if problems else (True if found.nll_share is not None else None),
        "problems": problems,
        "unchecked": found.unchecked(),
    }


def reason(found: BaselineCheck | None) -> str | None:
    """Why quality cannot be judged in this run (a quality gate's error), or None."""
    if found is None or found["can_judge"] is not False:
        return None
    return f"the baseline {found['baseline']} cannot judge quality: " + "; ".join(found["problems"])


def lines(found: BaselineCheck | None) -> list[str]:
    """The first screen's sentence: what the baseline's figures are and whether they let it judge quality."""
    if found is None:
        return []
    figures = []
    if found["nll"] is not None:
        against = (
            f" ({found['nll_share']:.0%} of ln(vocabulary {found['vocab']:,}))"
            if found["nll_share"] is not None
            else ""
        )
        figures.append(f"NLL {found['nll']:.2f} nats/token{against}")
    if found["chars_per_token"] is not None:
        figures.append(f"{found['chars_per_token']:.2f} characters a token")
    if found["greedy"]:
        repeats = any("greedy output" in p for p in found["problems"])
        figures.append("greedy output " + ("repeats" if repeats else "without short repeats"))
    head = f"Baseline {found['baseline']} ({', '.join(figures)}): "
    if found["can_judge"] is False:
        text = head + "**cannot judge quality** — " + "; ".join(found["problems"]) + ". Quality gates end as errors."
    elif found["can_judge"]:
        text = head + "can judge quality."
    else:
        text = head + "whether it can judge quality is not established."
    if found["unchecked"]:
        text += " Not checked: " + ", ".join(found["unchecked"]) + "."
    return [text]
