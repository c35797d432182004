"""The vote rules of :mod:`gambit_search.voting`, the lineage rule above all: one vote per
root lineage however many forks the search took of it."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gambit_search.voting import RULES, lineage_roots, vote


def test_lineage_weighs_a_root_and_its_forks_as_one():
    votes = [(0, "42", 0.6), (1, "42", 0.6), (2, "42", 0.6), (3, "41", 0.8)]
    roots = {1: 0, 2: 0}
    assert vote(votes, "weighted", roots) == "42"  # three copies out-weigh one better trace
    assert vote(votes, "lineage", roots) == "41"  # lineage 0 weighs its mean, 0.6 < 0.8
    assert vote(votes, "lineage") == "42"  # no forks: every node is a root


def test_a_lineage_splits_its_weight_over_its_answers():
    # root 0's lineage: 3 traces, answers 7, 7, 9 (0.9 each) -> 0.6 for 7, 0.3 for 9;
    # root 5 alone answers 9 at 0.4: 9 has 0.7 > 0.6
    votes = [(0, "7", 0.9), (1, "7", 0.9), (2, "9", 0.9), (5, "9", 0.4)]
    assert vote(votes, "lineage", {1: 0, 2: 0}) == "9"
    assert vote(votes, "weighted", {1: 0, 2: 0}) == "7"


def test_lineage_with_no_weight_falls_back_to_the_plain_vote():
    votes = [(0, "1", 0.0), (1, "2", None), (2, "2", 0.0)]
    assert vote(votes, "lineage", {}) == vote(votes, "plain") == "2"
    assert vote([], "lineage") is None


def test_lineage_roots_follows_parents_to_the_root():
    nodes = [{"id": 0, "parent": None}, {"id": 1, "parent": 0}, {"id": 3, "parent": 2},
             {"id": 2, "parent": 1}, {"id": 4, "parent": None}, {"id": 5, "parent": 4}]
    assert lineage_roots(nodes) == {0: 0, 1: 0, 2: 0, 3: 0, 4: 4, 5: 4}


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("abc"), st.floats(0, 1)), min_size=1, max_size=12))
def test_without_forks_lineage_is_weighted(pairs):
    votes = [(i, a, s) for i, (a, s) in enumerate(pairs)]
    roots = lineage_roots([{"id": i, "parent": None} for i in range(len(votes))])
    assert vote(votes, "lineage", roots) == vote(votes, "weighted")


def test_an_unknown_rule_is_refused():
    assert "lineage" in RULES
    with pytest.raises(ValueError, match="unknown vote rule"):
        vote([(0, "1", 1.0)], "lineal")
