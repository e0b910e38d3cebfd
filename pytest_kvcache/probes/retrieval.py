"""Retrieval at depth: needles in a haystack of real text, at exact depths and positions, the same in every arm.

A cell is (depth, position, form, keys). Each of its needles is a sentence naming a key and a value — a random
5–7 digit number or a random word pair, drawn from the run seed and the needle's coordinates, so arm A's k-th
needle of a cell is arm B's — inserted into a haystack of the committed prose or code texts (or repeated filler)
at ``position`` of the context. With ``keys`` K > 1 the haystack holds K needles with distinct keys and one is
asked (the multi-key variant).

Two forms:

- ``recall``: a completion whose prompt ends with the asked needle's own lead-in (``… The secret number of Alice
  is``); the model continues with the value. Small and base models retrieve this way: they copy, they do not
  answer questions. The prompt is token ids, so its depth is exact by construction.
- ``question``: a chat question after the haystack, for instruct models; its depth is the haystack's tokens plus
  the chat template's, as the server counts them.

Greedy decoding, a few tokens; the score is an exact match of the needle's value at the start of the answer,
normalised for whitespace (:func:`found`). Plain Python: no pytest, no HTTP (the suite module sends).
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pytest_kvcache.probes import registry
from pytest_kvcache.probes.registry import depth_label

#: The committed texts a ``texts`` haystack cycles through.
HAYSTACK_TEXTS = ("prose", "code")
FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "

#: Keys a needle can name (distinct within one haystack).
KEYS = (
    "Alice", "Bruno", "Chiara", "Dmitri", "Elena", "Farid", "Greta", "Hiro", "Ines", "Jonas", "Kavya", "Lars",
    "Mei", "Nadia", "Omar", "Petra", "Quentin", "Rosa", "Sanjay", "Tomas", "Uma", "Viktor", "Wen", "Yara",
)  # fmt: skip
#: Words a word-pair needle draws from: common, each one token or two in most vocabularies.
WORDS = (
    "amber", "anchor", "apple", "arrow", "basket", "beacon", "cactus", "candle", "canyon", "carpet", "cedar",
    "cobalt", "copper", "coral", "crystal", "dolphin", "ember", "falcon", "feather", "forest", "garnet", "glacier",
    "harbor", "hazel", "island", "jasper", "lantern", "lemon", "marble", "meadow", "meteor", "mirror", "nectar",
    "orchid", "otter", "pepper", "pillow", "planet", "quartz", "raven", "ribbon", "saddle", "silver", "spiral",
    "summit", "thunder", "tulip", "velvet", "violet", "walnut", "willow", "window", "yellow", "zephyr",
)  # fmt: skip


@dataclass(frozen=True)
class Needle:
    """One fact in the haystack: ``kind`` is ``number`` or ``words``."""

    key: str
    kind: str
    value: str

    @property
    def lead_in(self) -> str:
        """The sentence up to its value: a ``recall`` prompt ends with it."""
        noun = "number" if self.kind == "number" else "words"
        verb = "is" if self.kind == "number" else "are"
        return f"The secret {noun} of {self.key} {verb}"

    @property
    def sentence(self) -> str:
        """The needle as inserted: its own line, so it reads as one record among the text's."""
        return f"\n{self.lead_in} {self.value}.\n"

    @property
    def question(self) -> str:
        """The ``question`` form's ask, after the haystack."""
        noun = "number" if self.kind == "number" else "two words"
        return (
            f"\n\nQuestion: what is the secret {noun} of {self.key}, as stated in the text above? "
            f"Answer with the {noun} only."
        )


def _rng(seed: int, *parts: object) -> random.Random:
    digest = hashlib.sha256(":".join(str(p) for p in (seed, "retrieval", *parts)).encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def needles_for(seed: int, depth: int, position: float, keys: int, index: int) -> list[Needle]:
    """The ``keys`` needles of needle ``index`` in a cell; the first is the one asked. Numbers (5–7 digits,
    no leading zero) and word pairs alternate by index; distractors take the asked needle's kind, so only the
    key tells them apart."""
    rng = _rng(seed, depth, f"{position:.4f}", keys, index)
    kind = "number" if index % 2 == 0 else "words"
    names = rng.sample(KEYS, keys)
    out: list[Needle] = []
    values: set[str] = set()
    for name in names:
        while True:
            if kind == "number":
                digits = rng.randint(5, 7)
                value = str(rng.randint(10 ** (digits - 1), 10**digits - 1))
            else:
                value = " ".join(rng.sample(WORDS, 2))
            if value not in values:
                break
        values.add(value)
        out.append(Needle(name, kind, value))
    return out


def haystack_text(index: int, haystack: str) -> str:
    """Which committed text (or the filler) needle ``index``'s haystack is cut from."""
    return "filler" if haystack == "filler" else HAYSTACK_TEXTS[index % len(HAYSTACK_TEXTS)]


def haystack_start(seed: int, depth: int, position: float, keys: int, index: int, available: int, need: int) -> int:
    """Where in its text's tokens needle ``index``'s haystack starts: a different stretch for every needle."""
    room = max(0, available - need)
    return _rng(seed, "start", depth, f"{position:.4f}", keys, index).randint(0, room) if room else 0


@dataclass(frozen=True)
class Prompt:
    """One request's prompt: ``ids`` (recall: the whole prompt; question: the haystack with its needles, to be
    detokenised into the chat message), where the asked needle starts, and the needles."""

    ids: list[int]
    needle_at: int
    needles: list[Needle]


class HaystackTooShort(ValueError):
    """The haystack's text has fewer tokens than the depth needs."""


def recall_prompt(
    *,
    depth: int,
    position: float,
    needles: Sequence[Needle],
    hay: Sequence[int],
    start: int,
    encode: Callable[[str], list[int]],
    prefix: Sequence[int] = (),
    ask: bool = True,
) -> Prompt:
    """``depth`` tokens exactly: ``prefix`` (the tokenizer's BOS, where it has one), the haystack from ``start``
    with the asked needle's sentence at ``position`` of the room the haystack leaves and every distractor at a
    seeded position of its own, then (``ask``) the asked needle's lead-in. ``encode`` tokenises text without
    special tokens (the server's tokenizer)."""
    asked, *others = needles
    sentences = [encode(n.sentence) for n in needles]
    lead = encode("\n" + asked.lead_in) if ask else []
    room = depth - len(prefix) - sum(map(len, sentences)) - len(lead)
    if room < len(needles):
        raise HaystackTooShort(f"depth {depth} leaves no room for the haystack around {len(needles)} needle(s)")
    if start + room > len(hay):
        raise HaystackTooShort(f"the haystack has {len(hay):,} tokens from {start:,}; {room:,} are needed")
    at = round(position * room)
    rng = _rng(len(hay), start, depth, asked.key)  # distractors' places: seeded by the cell's own coordinates
    cuts = sorted([(at, 0)] + [(rng.randint(0, room), i + 1) for i in range(len(others))])
    ids: list[int] = list(prefix)
    taken = 0
    needle_at = 0
    for cut, which in cuts:
        ids += hay[start + taken : start + cut]
        taken = cut
        if which == 0:
            needle_at = len(ids)
        ids += sentences[which]
    ids += hay[start + taken : start + room]
    ids += lead
    return Prompt(ids, needle_at, list(needles))


_SPACE = re.compile(r"\s+")


def normalise(text: str) -> str:
    """Whitespace collapsed, the ends stripped of spaces, quotes and the markdown a chat answer may wrap."""
    return _SPACE.sub(" ", text).strip().strip("*`\"'“”").strip()


def found(returned: str, needle: Needle, form: str = "recall") -> bool:
    """Whether ``returned`` gives the needle's value.

    ``recall``: the completion starts with the value (whitespace normalised; case too for words), and the value
    ends there: ``48213.`` finds 48213, ``482130`` does not.

    ``question``: a chat answer restates the question before its value ("The secret number of Alice is 48213."),
    so its **first candidate** is scored: a number's first run of digits, a word pair's first word of the needles'
    vocabulary with the word after it. Only the first counts: an answer listing every key's value, or quoting
    another number first, is not found."""
    if form == "question":
        return _first_candidate(returned, needle.kind) == needle.value.lower()
    got, want = normalise(returned), needle.value
    if needle.kind == "words":
        got, want = got.lower(), want.lower()
    if not got.startswith(want):
        return False
    rest = got[len(want) :]
    return not rest or not rest[0].isalnum()


_DIGITS = re.compile(r"\d+")
_WORD = re.compile(r"[A-Za-z]+")


def _first_candidate(text: str, kind: str) -> str | None:
    """A chat answer's first value of ``kind``: its first run of digits, or its first word of :data:`WORDS` with
    the next word (lower case); None without one."""
    if kind == "number":
        digits = _DIGITS.search(text)
        return digits.group(0) if digits else None
    words = [w.lower() for w in _WORD.findall(text)]
    for i, word in enumerate(words[:-1]):
        if word in WORDS:
            return f"{word} {words[i + 1]}"
    return None


def plan_line(
    *,
    depths: Sequence[int],
    positions: Sequence[float],
    needles: int,
    form: str,
    keys: Sequence[int],
    haystack: str,
    ceiling: float,
    cpu: bool,
) -> str:
    """The boot plan's sentence: which form runs, the cells, the needles, and what the sizes can decide."""
    cells = len(depths) * len(positions) * len(keys)
    where = ", ".join(f"{p * 100:g}%" for p in positions)
    variant = " and ".join(
        "one needle a haystack" if k == 1 else f"{k} needles a haystack with distinct keys, one asked" for k in keys
    )
    form_text = (
        "recall (a completion ending with the needle's lead-in)" if form == "recall" else "question (a chat question)"
    )
    line = (
        f"retrieval: {form_text}, {variant}, in {'the committed prose and code' if haystack == 'texts' else 'filler'}"
        f" at depths {','.join(depth_label(d) for d in depths)} × positions {where}: {cells} cells of {needles} "
        f"needle(s), {cells * needles} requests an arm; a cell where the baseline finds under "
        f"{ceiling * 100:g}% of its needles judges nothing"
    )
    if needles < 30:
        line += (
            f" — {needles} needles a cell give wide intervals (a Wilson interval of {needles}/{needles} reaches down "
            f"to {_wilson_low(needles):.0%}); --kv-retrieval-needles=90 decides a 10-point loss"
        )
    elif cpu:
        line += " (sized for a GPU: minutes of prefill an arm on the CPU)"
    return line


def _wilson_low(n: int, z: float = 1.959964) -> float:
    """The lower end of the Wilson interval of n successes in n trials."""
    return n / (n + z * z)


def answer_tokens(form: str = "recall") -> int:
    """Tokens a greedy answer may take: a 7-digit number is up to 7 tokens in a digit-split vocabulary, a word
    pair up to 6; a chat answer may open with a few words more."""
    return 12 if form == "recall" else 24


def plan(st: Any) -> str:
    """The boot plan's line for the retrieval probe, from the settings."""
    return plan_line(
        depths=st.retrieval_depths,
        positions=st.retrieval_positions,
        needles=st.retrieval_needles,
        form=st.retrieval_form,
        keys=st.retrieval_keys,
        haystack=st.retrieval_haystack,
        ceiling=st.retrieval_ceiling,
        cpu=registry.on_embedded_cpu(st),
    )


registry.with_plan("retrieval", plan)
