"""Fidelity at depth: what an arm does to the model's output distribution, teacher-forced.

A fixed long text (committed, sha256-checked) is tokenized once per boot by the engine itself and scored, as
token ids, by the arm's kind (``Kind.score_prompt``, ``engines.scoring``: vLLM's ``prompt_logprobs``, llama-server's
forced continuations): for every position of the prompt, the logprob of the actual next token and its top-k
alternatives. The same ids go to every arm, so positions line up. At each depth D of ``--kv-fidelity-depths`` a
*window* of the last ``window`` positions before D is kept (one prompt, as deep as the deepest depth, serves every
depth: attention is causal, so position p sees the same context whatever comes after it).

Per position the baseline arm and another arm are compared:

- ``logprob_drift``: |Δ logprob| of the actual token (nats);
- ``nll_delta``: the arm's negative log-likelihood minus the baseline's (nats; > 0 means the arm finds the
  text less likely);
- ``kl_topk``: KL(baseline ‖ arm) over the partition {tokens both sides returned} ∪ {everything else},
  a lower bound of the true KL (coarsening a distribution can only shrink a KL divergence).

Positions are averaged in blocks of ``BLOCK`` (neighbouring positions are correlated). The report's CIs
replicate over texts (``report.fidelity``): scores are deterministic across boots, so four texts of different
kinds are committed — prose, code, JSON Lines data and HTML markup. Plain Python: no pytest, no server access
(the probe test asks the kind's scorer).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

import numpy as np

from pytest_kvcache.config.constants import FIDELITY_DEPTHS
from pytest_kvcache.engines.scoring import Window
from pytest_kvcache.probes import registry
from pytest_kvcache.probes.registry import depth_label

#: The committed texts (``pytest_kvcache/data/fidelity/NAME-v1.txt``): English prose, Python code, JSON Lines
#: records (the Unicode character database) and HTML (pydoc's pages of standard-library modules).
TEXTS = ("prose", "code", "data", "markup")
TEXT_VERSION = "v1"
#: Positions per block (the report averages each text's blocks; its CIs are over texts).
BLOCK = 32
#: A probability floor for the KL's "everything else" bucket (logprobs of the top-k can sum past 1 by rounding).
_FLOOR = 1e-12


class TextError(ValueError):
    """A fidelity text that is unknown or whose bytes do not match its committed sha256."""


@dataclass(frozen=True)
class Text:
    name: str
    text: str
    sha256: str


@cache
def load_text(name: str) -> Text:
    """One committed text, its bytes checked against the sha256 beside it."""
    if name not in TEXTS:
        raise TextError(f"unknown fidelity text {name!r}; known: {', '.join(TEXTS)}")
    folder = resources.files("pytest_kvcache") / "data" / "fidelity"
    file = folder / f"{name}-{TEXT_VERSION}.txt"
    data = file.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    recorded = (folder / f"{name}-{TEXT_VERSION}.txt.sha256").read_text().split()[0]
    if digest != recorded:
        raise TextError(
            f"{file}: content sha256 {digest[:12]}… differs from the recorded {recorded[:12]}…; "
            "regenerate it with fixtures/make_fidelity_texts.py (a changed text is a new version)"
        )
    return Text(name, data.decode("utf-8"), digest)


def ids_sha256(ids: Sequence[int]) -> str:
    """The identity of a token-id sequence: arms are compared only on the same ids."""
    return hashlib.sha256(",".join(map(str, ids)).encode()).hexdigest()


def _kl_coarse(base: Mapping[int, float], arm: Mapping[int, float]) -> float | None:
    """KL(base ‖ arm) over {tokens both sides returned} ∪ {the rest}; None when they share no token."""
    shared = [t for t in base if t in arm]
    if not shared:
        return None
    # math (libm), not numpy: numpy's exp/log take another SIMD path on AVX-512 than on AVX2, and a report
    # re-rendered on another host must read the same last digits
    p = [math.exp(base[t]) for t in shared]
    q = [math.exp(arm[t]) for t in shared]
    p_rest = max(_FLOOR, 1.0 - math.fsum(p))
    q_rest = max(_FLOOR, 1.0 - math.fsum(q))
    terms = [pi * (base[t] - arm[t]) for pi, t in zip(p, shared, strict=True)]
    kl = math.fsum(terms) + p_rest * (math.log(p_rest) - math.log(q_rest))
    return max(0.0, kl)


def compare_windows(base: Window, arm: Window) -> dict[str, np.ndarray]:
    """Per position of two windows over the same ids: |Δ logprob|, Δ NLL and the top-k KL (NaN where the
    engine returned no top-k). ValueError when the windows do not cover the same tokens."""
    if (base.depth, base.start, base.ids) != (arm.depth, arm.start, arm.ids):
        raise ValueError(
            f"windows differ: depth {base.depth} from {base.start} ({len(base.ids)} positions) vs "
            f"depth {arm.depth} from {arm.start} ({len(arm.ids)} positions), or their token ids do"
        )
    b = np.asarray(base.logprob, dtype=float)
    a = np.asarray(arm.logprob, dtype=float)
    kl = np.full(b.size, np.nan)
    if any(base.top_ids) and any(arm.top_ids):
        for i, token in enumerate(base.ids):
            # the actual token's logprob is known on both sides: it joins the partition
            p = {**dict(zip(base.top_ids[i], base.top_logprobs[i], strict=True)), token: float(b[i])}
            q = {**dict(zip(arm.top_ids[i], arm.top_logprobs[i], strict=True)), token: float(a[i])}
            value = _kl_coarse(p, q)
            kl[i] = np.nan if value is None else value
    return {"logprob_drift": np.abs(a - b), "nll_delta": b - a, "kl_topk": kl}


def block_metrics(per_position: Mapping[str, np.ndarray], block: int = BLOCK) -> list[dict[str, float | None]]:
    """Means over consecutive blocks of ``block`` positions (a last, shorter block counts if at least half
    full)."""
    n = len(next(iter(per_position.values()))) if per_position else 0
    out: list[dict[str, float | None]] = []
    for start in range(0, n, block):
        end = min(n, start + block)
        if end - start < max(1, block // 2) and start > 0:
            break
        row: dict[str, float | None] = {}
        for name, values in per_position.items():
            part = values[start:end]
            part = part[np.isfinite(part)]
            row[name] = float(part.mean()) if part.size else None
        out.append(row)
    return out


def plan(st: Any) -> str | None:
    """The boot plan's line: the fidelity probe's sizes for the embedded model on the CPU."""
    return registry.sized_for_cpu(
        st,
        "fidelity",
        f"depths {','.join(depth_label(d) for d in st.fidelity_depths)}, window {st.fidelity_window}",
        f"elsewhere: --kv-fidelity-depths={','.join(depth_label(d) for d in FIDELITY_DEPTHS)} --kv-fidelity-window=512",
    )


registry.with_plan("fidelity", plan)
