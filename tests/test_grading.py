"""Tests for gambit_core.grading: extraction, math-verify equivalence, vote bins."""

from __future__ import annotations

import json
import math
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import sympy
from hypothesis import given, settings
from hypothesis import strategies as st

from gambit_core.grading import (
    extract_boxed,
    extract_choice,
    grade,
    is_equivalent,
    parse_answer,
)
from gambit_core.vote_bins import VoteBins, majority_vote

BENCH_DIR = Path(__file__).resolve().parents[1].parent / "shared" / "benchmarks"


def _gold_answers() -> list[str]:
    files = sorted(BENCH_DIR.glob("*.jsonl")) if BENCH_DIR.is_dir() else []
    if not files:
        pytest.skip(f"benchmark files not found under {BENCH_DIR} (shared/ beside the repo)")
    answers: list[str] = []
    for f in files:
        for line in f.read_text(encoding="utf-8").splitlines():
            if line.strip():
                answers.append(json.loads(line)["answer"])
    return answers


@pytest.fixture(scope="module")
def gold_answers() -> list[str]:
    return _gold_answers()


@pytest.fixture(scope="module")
def unique_golds(gold_answers: list[str]) -> list[str]:
    return list(dict.fromkeys(" ".join(a.split()) for a in gold_answers))


# --- extraction ---------------------------------------------------------------------------


def test_extract_boxed_nested_braces() -> None:
    assert extract_boxed(r"thus \boxed{\frac{a}{b}}.") == r"\frac{a}{b}"
    assert extract_boxed(r"\boxed{\frac{\sqrt{3}}{2^{10}}}") == r"\frac{\sqrt{3}}{2^{10}}"
    assert extract_boxed(r"\fbox{42}") == "42"
    assert extract_boxed(r"\boxed {7}") == "7"


def test_extract_boxed_last_wins() -> None:
    assert extract_boxed(r"first \boxed{1}, then \boxed{2}, finally \boxed{3}") == "3"
    assert extract_boxed(r"\boxed{1} \fbox{2}") == "2"
    # a box nested in the last box belongs to it
    assert extract_boxed(r"\boxed{1} \boxed{x = \fbox{2}}") == r"x = \fbox{2}"


def test_extract_boxed_none_and_unbalanced() -> None:
    assert extract_boxed("no box here") is None
    assert extract_boxed("") is None
    assert extract_boxed(r"\boxed{1} then truncated \boxed{\frac{1}{2}") is None
    assert extract_boxed(r"\boxed{") is None


def test_extract_boxed_escaped_braces() -> None:
    assert extract_boxed(r"\boxed{\left\{1,2\right\}}") == r"\left\{1,2\right\}"
    assert extract_boxed(r"\boxed{\{1,2\}}") == r"\{1,2\}"


def test_extract_choice() -> None:
    assert extract_choice(r"so \boxed{C}") == "C"
    assert extract_choice(r"\boxed{\text{(B)}}") == "B"
    assert extract_choice("The answer is (D).") == "D"
    assert extract_choice("Answer: A") == "A"
    assert extract_choice(r"The answer is (A). On reflection, \boxed{B}") == "B"
    assert extract_choice(r"\boxed{A} ... wait, the answer is (C)") == "C"
    assert extract_choice(r"\boxed{42}") is None
    assert extract_choice("no choice") is None
    assert extract_choice("the answer is E") is None
    assert extract_choice("the answer is a prime") is None
    assert extract_choice("**Answer:** (B)") == "B"


# --- equivalence ---------------------------------------------------------------------------


def test_every_gold_answer_parses(unique_golds: list[str]) -> None:
    bad = [a for a in unique_golds if not parse_answer(a) or isinstance(parse_answer(a)[0], str)]
    assert not bad, f"gold answers math-verify cannot parse: {bad}"


@pytest.mark.parametrize(
    ("gold", "latex"),
    [  # plain-text golds from the benchmark files, as a model would box them
        ("sqrt((7 + 2*sqrt(13))/3)", r"\sqrt{\frac{7+2\sqrt{13}}{3}}"),
        ("pi/3", r"\frac{\pi}{3}"),
        ("2*pi/3 + sqrt(3)/4", r"\frac{2\pi}{3}+\frac{\sqrt{3}}{4}"),
        ("2 + 4*ln(2)", r"2+4\ln 2"),
        ("C(4030,2016)/2^{4030}", r"\frac{\binom{4030}{2016}}{2^{4030}}"),
        ("(7*sqrt(3))/3", r"\frac{7\sqrt{3}}{3}"),
        ("1009!*1010!", r"1009! \cdot 1010!"),
    ],
)
def test_plain_text_golds_read_as_math(gold: str, latex: str) -> None:
    assert is_equivalent(gold, latex)
    assert not is_equivalent(gold, "2")


def test_tiny_values_are_not_all_equal() -> None:
    # math-verify alone rounds to 6 decimals and calls these equal
    assert not is_equivalent(r"\frac{1}{2^{2011}}", "1/2^{2012}")
    assert not is_equivalent(r"\frac{1}{2062300}", r"\frac{1}{2062301}")
    assert not is_equivalent(r"\frac{1}{2062300}", "0")
    assert is_equivalent(r"\frac{1}{2^{2011}}", r"2^{-2011}")


def test_gold_answers_equal_themselves(unique_golds: list[str]) -> None:
    for a in unique_golds:
        assert is_equivalent(a, a), a
    for a in unique_golds:  # boxed completions of each gold grade correct
        assert grade(a, f"so the answer is \\boxed{{{a}}}.") == (a, True), a


def _value_key(answer: str) -> str:
    """A value for telling gold answers apart: 12 significant digits, else the string."""
    try:
        return str(sympy.N(parse_answer(answer)[0], 12))
    except Exception:
        return " ".join(answer.split())


def test_distinct_gold_answers_get_distinct_bins(unique_golds: list[str]) -> None:
    bins = VoteBins()
    landed = {a: bins.add(a) for a in unique_golds}
    by_bin: dict[int, list[str]] = {}
    for a, i in landed.items():
        by_bin.setdefault(i, []).append(a)
    # golds share a bin only when they have the same value (e.g. "\frac{3}{4}" and "3/4")
    shared = [group for group in by_bin.values() if len({_value_key(a) for a in group}) > 1]
    assert not shared, f"answers of different value share a bin: {shared}"
    assert len(bins) >= len({_value_key(a) for a in unique_golds})
    if {r"\frac{3}{4}", "3/4"} <= set(unique_golds):
        assert landed[r"\frac{3}{4}"] == landed["3/4"]


def test_each_gold_lands_in_its_own_bin(unique_golds: list[str]) -> None:
    for a in unique_golds:
        bins = VoteBins()
        bins.add(a, 1.0)
        bins.add("-123456789", 0.5)
        bins.add(f" {a} ", 2.0)
        assert [(b.representative, b.count) for b in bins.bins()] == [(a, 2), ("-123456789", 1)]
        assert bins.winner() == a


@pytest.mark.parametrize(
    ("gold", "pred", "expected"),
    [
        (r"\frac{1}{2}", "1/2", True),
        (r"\frac{1}{2}", "0.5", True),
        ("1/2", r"\dfrac12", True),
        ("70", "70", True),
        ("70", "70.0", True),
        ("70", "71", False),
        (r"\sqrt{2}", r"2^{1/2}", True),
        (r"\sqrt{2}/2", r"\frac{\sqrt{2}}{2}", True),
        ("3", "", False),
        ("", "", False),
    ],
)
def test_is_equivalent(gold: str, pred: str, expected: bool) -> None:
    assert is_equivalent(gold, pred) is expected


def test_half_forms_share_a_bin() -> None:
    bins = VoteBins()
    for a in (r"\frac{1}{2}", "1/2", "0.5", r"\dfrac{1}{2}", "3"):
        bins.add(a)
    assert [(b.representative, b.count) for b in bins.bins()] == [(r"\frac{1}{2}", 4), ("3", 1)]
    assert bins.winner() == r"\frac{1}{2}"


def test_grade() -> None:
    assert grade("70", r"The sum is \boxed{70}.") == ("70", True)
    assert grade(r"\frac{1}{2}", r"\boxed{0.5}") == ("0.5", True)
    assert grade("70", r"\boxed{69}") == ("69", False)
    assert grade("70", "I think 70") == (None, False)


def test_is_equivalent_thread_safe() -> None:
    cases = [
        (r"\frac{1}{2}", "0.5", True),
        ("1/2", r"\frac{2}{4}", True),
        (r"\sqrt{3}", r"3^{1/2}", True),
        ("70", "71", False),
        (r"\frac{3}{4}", "0.75", True),
        (r"2\sqrt{6}", r"\sqrt{24}", True),
        ("577", "5.77", False),
        (r"\frac{1}{9}", "0.1", False),
    ] * 8
    thread_ids: set[int] = set()

    def check(case: tuple[str, str, bool]) -> bool:
        thread_ids.add(threading.get_ident())
        gold, pred, expected = case
        return is_equivalent(gold, pred) is expected

    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(check, cases))
    assert all(results)
    assert threading.get_ident() not in thread_ids  # really ran off the main thread


# --- voting --------------------------------------------------------------------------------


def test_vote_bins_weighted_winner_and_ties() -> None:
    bins = VoteBins()
    bins.add("3", 0.4)
    bins.add("0.5", 0.3)
    bins.add(r"\frac{1}{2}", 0.3)
    assert bins.winner() == "0.5"
    assert [(b.representative, b.count) for b in bins.bins()] == [("3", 1), ("0.5", 2)]
    tie = VoteBins(["7", "8"])
    assert tie.winner() == "7"  # first seen wins a tie
    assert VoteBins().winner() is None


def test_majority_vote() -> None:
    assert majority_vote(["1/2", "3", r"\frac12", None]) == "1/2"
    assert majority_vote(["1/2", "3", "3"], weights=[5.0, 1.0, 1.0]) == "1/2"
    assert majority_vote([]) is None
    assert majority_vote([None, " "]) is None
    with pytest.raises(ValueError):
        majority_vote(["1"], weights=[1.0, 2.0])


# --- properties ----------------------------------------------------------------------------

_PLAIN = st.text(
    alphabet=st.characters(blacklist_characters="{}\\", blacklist_categories=("Cs",)), max_size=8
)
_COMMAND = st.sampled_from(
    [r"\frac", r"\sqrt", r"\pi", r"\cdot ", r"\left(", r"\right)", r"\{", r"\}"]
)
_BALANCED = st.recursive(
    st.one_of(_PLAIN, _COMMAND),
    lambda inner: st.one_of(
        st.builds(lambda s: "{" + s + "}", inner),
        st.builds(lambda a, b: a + b, inner, inner),
    ),
    max_leaves=12,
)
_PREFIX = st.text(alphabet=st.characters(blacklist_characters="\\", blacklist_categories=("Cs",)))


@settings(max_examples=300, deadline=None)
@given(prefix=_PREFIX, s=_BALANCED)
def test_extract_boxed_round_trip(prefix: str, s: str) -> None:
    assert extract_boxed(prefix + r"\boxed{" + s + "}") == s


@settings(max_examples=40, deadline=None)
@given(
    votes=st.lists(
        st.tuples(
            st.sampled_from(["1", "2", "0.5", r"\frac{1}{2}", "1/2", r"\sqrt{2}", "x"]),
            st.floats(min_value=0, max_value=1e6, allow_nan=False),
        ),
        max_size=25,
    )
)
def test_vote_bins_total_weight(votes: list[tuple[str, float]]) -> None:
    bins = VoteBins()
    for a, w in votes:
        bins.add(a, w)
    total = math.fsum(w for _, w in votes)
    assert math.isclose(bins.total_weight, total, rel_tol=1e-9, abs_tol=1e-9)
    assert math.isclose(math.fsum(b.weight for b in bins.bins()), total, rel_tol=1e-9, abs_tol=1e-9)
    assert sum(b.count for b in bins.bins()) == len(votes)


@settings(max_examples=150, deadline=None)
@given(n=st.integers(-(10**6), 10**6), m=st.integers(-(10**6), 10**6))
def test_integers_share_a_bin_iff_equal(n: int, m: int) -> None:
    bins = VoteBins()
    i = bins.add(str(n))
    j = bins.add(str(m))
    assert (i == j) == (n == m)
    assert is_equivalent(str(n), str(m)) == (n == m)


@settings(max_examples=60, deadline=None)
@given(st.integers(-10**6, 10**6), st.integers(-10**6, 10**6), st.sampled_from(["", "0", "+"]))
def test_integer_fast_path_agrees_with_math_verify(a, b, prefix):
    """Plain integers skip math-verify's parse; its verdict must be the same."""
    from gambit_core.grading import _verify_cached

    pa = str(a) if prefix == "" or a < 0 else prefix + str(a)
    for g, p in ((pa, str(b)), (pa, str(a))):
        assert is_equivalent(g, p) == (g == p or _verify_cached(g, p, True)) == (int(g) == int(p))
