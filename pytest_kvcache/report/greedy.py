"""The arms' greedy texts side by side, where they diverge: the output-agreement requests' own text.

Output agreement compares token ids (``report.sections.agreement``); this section shows what those
tokens say. Per short shape and arm, the first agreement request of the first boot it shares with the
baseline arm: the token where the two greedy decodes part, the text they share up to there (its end), and
each arm's continuation from there on. On a trained model that is the model's own answer changing under a
lossy KV cache; on random weights it is noise. Plain Python: no pytest.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pytest_kvcache.engines.tokenizer_check import first_difference

#: Characters of shared text shown before the divergence, and of each continuation after it.
CONTEXT_CHARS = 80
CONTINUATION_CHARS = 100


def _shared_chars(a: str, b: str) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def section(agreement: Sequence[Mapping[str, Any]], arms: Sequence[str]) -> list[dict[str, Any]]:
    """One entry per arm (after the baseline) and short shape: both greedy texts and where they part."""
    if len(arms) < 2:
        return []
    first: dict[tuple[str, str], Mapping[str, Any]] = {}  # (boot, shape) → its first usable request
    reps: dict[str, dict[int, str]] = {}  # arm → replicate → boot
    for r in agreement:
        if not r.get("ok") or not isinstance(r.get("text"), str) or r.get("index") not in (0, None):
            continue
        key = (str(r.get("boot")), str(r.get("shape")))
        first.setdefault(key, r)
        reps.setdefault(str(r.get("arm")), {}).setdefault(int(r.get("replicate") or 1), str(r.get("boot")))
    base = arms[0]
    out: list[dict[str, Any]] = []
    for arm in arms[1:]:
        shared = sorted(set(reps.get(base, {})) & set(reps.get(arm, {})))
        if not shared:
            continue
        base_boot, arm_boot = reps[base][shared[0]], reps[arm][shared[0]]
        shapes = sorted({shape for boot, shape in first if boot == base_boot})
        for shape in shapes:
            a, b = first.get((base_boot, shape)), first.get((arm_boot, shape))
            if a is None or b is None:
                continue
            text_a, text_b = str(a["text"]), str(b["text"])
            at = first_difference(list(a.get("ids") or []), list(b.get("ids") or []))
            chars = _shared_chars(text_a, text_b)
            out.append(
                {
                    "arm": arm,
                    "baseline": base,
                    "shape": shape,
                    "boot": arm_boot,
                    "baseline_boot": base_boot,
                    "tokens": max(len(a.get("ids") or []), len(b.get("ids") or [])),
                    "first_divergence": at,
                    "shared_chars": chars,
                    "baseline_text": text_a,
                    "arm_text": text_b,
                }
            )
    return out


def _show(text: str) -> str:
    return text.replace("\n", "⏎")


def lines(entries: Sequence[Mapping[str, Any]]) -> list[str]:
    """Plain lines for the terminal and report.md: each pair's verdict, the shared text's end, each arm's
    continuation."""
    out: list[str] = []
    for e in entries:
        head = f"greedy {e['shape']}, {e['arm']} vs {e['baseline']}"
        if e["first_divergence"] is None:
            out.append(f"{head}: identical ({e['tokens']} tokens): {_show(e['baseline_text'][:CONTINUATION_CHARS])}…")
            continue
        chars = int(e["shared_chars"])
        shared = e["baseline_text"][:chars]
        out.append(f"{head}: diverge at token {e['first_divergence']} of {e['tokens']} (character {chars})")
        out.append(f"  shared:  …{_show(shared[-CONTEXT_CHARS:])}")
        out.append(f"  {e['baseline']:<8} →{_show(e['baseline_text'][chars : chars + CONTINUATION_CHARS])}…")
        out.append(f"  {e['arm']:<8} →{_show(e['arm_text'][chars : chars + CONTINUATION_CHARS])}…")
    return out


def markdown(entries: Sequence[Mapping[str, Any]]) -> list[str]:
    """report.md's section: the same lines in a code block, under a heading."""
    if not entries:
        return []
    return [
        "## Greedy texts (output agreement)",
        "",
        "Each arm's greedy answer to the short prompts against the baseline's (first boot each), where they part:",
        "",
        "```",
        *lines(entries),
        "```",
        "",
    ]
