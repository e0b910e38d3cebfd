"""The retrieval probe's needles and prompts (``probes.retrieval``): seeded and paired, exact in depth, the asked
needle where its position says, the multi-key variant's distractors distinct, and the exact-match scoring."""

from __future__ import annotations

import pytest

from pytest_kvcache.config import values
from pytest_kvcache.config.constants import SettingsError
from pytest_kvcache.probes import retrieval
from pytest_kvcache.probes.retrieval import Needle


def _encode(text: str) -> list[int]:
    """A toy tokenizer: one id per character (the prompt arithmetic does not depend on the vocabulary)."""
    return [ord(c) for c in text]


HAY = [1000 + i for i in range(50_000)]


def test_needles_are_the_same_for_the_same_coordinates_and_differ_across_them() -> None:
    a = retrieval.needles_for(7, 4000, 0.5, 1, 3)
    assert a == retrieval.needles_for(7, 4000, 0.5, 1, 3)
    assert a != retrieval.needles_for(8, 4000, 0.5, 1, 3)
    assert a != retrieval.needles_for(7, 4000, 0.5, 1, 4)
    numbers = [retrieval.needles_for(7, 4000, 0.5, 1, i)[0] for i in range(0, 40, 2)]
    assert all(n.kind == "number" and 5 <= len(n.value) <= 7 and n.value[0] != "0" for n in numbers)
    words = retrieval.needles_for(7, 4000, 0.5, 1, 1)[0]
    assert words.kind == "words" and len(words.value.split()) == 2


def test_multi_key_needles_have_distinct_keys_and_values_of_one_kind() -> None:
    needles = retrieval.needles_for(1, 8000, 0.9, 5, 0)
    assert len({n.key for n in needles}) == 5 and len({n.value for n in needles}) == 5
    assert {n.kind for n in needles} == {"number"}


@pytest.mark.parametrize("position", [0.0, 0.1, 0.5, 0.9, 1.0])
@pytest.mark.parametrize("keys", [1, 4])
def test_a_recall_prompt_is_exactly_its_depth_with_the_needle_at_its_position(position: float, keys: int) -> None:
    needles = retrieval.needles_for(3, 2000, position, keys, 0)
    prompt = retrieval.recall_prompt(
        depth=2000, position=position, needles=needles, hay=HAY, start=123, encode=_encode, prefix=[1]
    )
    assert len(prompt.ids) == 2000 and prompt.ids[0] == 1
    sentence = _encode(needles[0].sentence)
    assert prompt.ids[prompt.needle_at : prompt.needle_at + len(sentence)] == sentence
    lead = _encode("\n" + needles[0].lead_in)
    assert prompt.ids[-len(lead) :] == lead
    for other in needles[1:]:  # every distractor is in the haystack too
        text = _encode(other.sentence)
        assert any(prompt.ids[i : i + len(text)] == text for i in range(len(prompt.ids)))
    room = 2000 - 1 - sum(len(_encode(n.sentence)) for n in needles) - len(lead)
    assert abs(prompt.needle_at - (1 + round(position * room))) <= sum(len(_encode(n.sentence)) for n in needles)


def test_a_haystack_too_short_for_the_depth_is_said() -> None:
    needles = retrieval.needles_for(3, 2000, 0.5, 1, 0)
    with pytest.raises(retrieval.HaystackTooShort, match="tokens from"):
        retrieval.recall_prompt(depth=2000, position=0.5, needles=needles, hay=HAY[:500], start=0, encode=_encode)


def test_the_haystack_start_leaves_room_for_the_depth() -> None:
    for index in range(50):
        start = retrieval.haystack_start(1, 4000, 0.5, 1, index, 10_000, 4000)
        assert 0 <= start <= 6000
    assert retrieval.haystack_start(1, 4000, 0.5, 1, 0, 3000, 4000) == 0


@pytest.mark.parametrize(
    ("returned", "found"),
    [
        (" 48213.", True),
        ("48213", True),
        ("  48213\n\nThe", True),
        ("**48213**", True),
        (" 482130", False),
        (" 4821", False),
        (" The number is 48213", False),
    ],
)
def test_a_number_is_found_only_at_the_start_of_the_answer_and_whole(returned: str, found: bool) -> None:
    assert retrieval.found(returned, Needle("Alice", "number", "48213")) is found


def test_a_word_pair_is_found_whatever_its_case_and_spacing() -> None:
    needle = Needle("Bruno", "words", "amber falcon")
    assert retrieval.found(" Amber  falcon.", needle)
    assert not retrieval.found(" amber falconry", needle)
    assert needle.lead_in == "The secret words of Bruno are"


def test_key_counts_are_distinct_counts_up_to_sixteen() -> None:
    assert values.key_counts("1,4") == (1, 4) and values.key_counts("3") == (3,) and values.key_counts([1, 2]) == (1, 2)
    for bad, said in (("0", ">= 1"), ("17", "from 1 to 16"), ("1,1", "distinct"), ("x", "whole number")):
        with pytest.raises(SettingsError, match=said):
            values.key_counts(bad)


def test_the_plan_line_counts_every_key_variant_as_cells_of_its_own() -> None:
    line = retrieval.plan_line(
        depths=(1000, 4000),
        positions=(0.1, 0.5, 0.9),
        needles=90,
        form="recall",
        keys=(1, 4),
        haystack="texts",
        ceiling=0.8,
        cpu=False,
    )
    assert "one needle a haystack and 4 needles a haystack with distinct keys, one asked" in line
    assert "12 cells of 90 needle(s), 1080 requests an arm" in line


@pytest.mark.parametrize(
    ("kind", "value", "returned", "found"),
    [  # answers SmolLM2-135M-Instruct gave on vLLM's CPU build (the question form, 2026-12-06)
        ("number", "22754", "The secret number of Alice is 22754.", True),
        ("number", "79553", "The secret number of Omar, as stated in the text, is 79553.", True),
        ("number", "379398", "The secret number of Bruno is 3.", False),
        ("words", "thunder ember", 'The secret two words of Greta, as stated in the text, are "thunder ember".', True),
        ("words", "nectar apple", 'The secret two words of Greta are:\n\n- "nectar"\n- "apple"', True),
        ("words", "cedar basket", 'The secret two words of Yara, as stated in the text, are "Y" and "A".', False),
        ("words", "carpet saddle", 'The secret two words of Quentin are "scratch" and "carpet saddle"', True),
        ("number", "48213", "It is 12345, or maybe 48213.", False),  # only the first candidate counts
        ("words", "amber falcon", "silver raven, amber falcon", False),
        ("number", "48213", "I cannot find it.", False),
    ],
)
def test_a_chat_answer_is_scored_on_its_first_candidate(kind: str, value: str, returned: str, found: bool) -> None:
    assert retrieval.found(returned, Needle("Alice", kind, value), "question") is found
