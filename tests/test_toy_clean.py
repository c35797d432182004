"""The "no cancelling slips" toy stratum (``toy-clean:<split>[:n]``): the spec loads, its
splits are deterministic and disjoint from each other and from train, and every question
meets the constraint (checked from the running values, not through hard.py's helpers)."""

from __future__ import annotations

import pytest

from data_pipelines.toy.task import draw_questions, parse_question, split_of, step_kind
from gambit_core.errors import DatasetError
from gambit_core.questions import load_questions

N = 60


@pytest.fixture(scope="module")
def clean():
    return {s: load_questions(f"toy-clean:{s}:{N}") for s in ("val", "test")}


def _kinds(text: str) -> tuple[list[str], list[int]]:
    q = parse_question(text)
    before = [q.start, *q.values()[:-1]]
    return [step_kind(v, op) for v, op in zip(before, q.ops, strict=True)], list(q.ops)


def test_the_spec_loads_deterministically(clean):
    for s, qs in clean.items():
        assert len(qs) == N and len({q.question for q in qs}) == N
        assert [q.id for q in qs] == [f"toy-clean-{s}-0-{i}" for i in range(N)]
        assert all(q.source == f"toy-clean:{s}" and q.answer for q in qs)
        assert load_questions(f"toy-clean:{s}:10") == qs[:10]  # a prefix of the longer list
        assert int(qs[0].answer) == parse_question(qs[0].question).answer


def test_no_slip_can_cancel_on_any_question(clean):
    for qs in clean.values():
        for q in qs:
            kinds, ops = _kinds(q.question)
            hard = [op for k, op in zip(kinds, ops, strict=True) if k == "hard"]
            assert 5 <= len(ops) <= 8
            assert len(hard) == 3  # min_hard 3, and drift 3 allows no more
            assert all(op > 0 for op in hard) or all(op < 0 for op in hard)  # one sign
            assert kinds[0] != "hard"  # min_lead 1


def test_splits_are_disjoint_from_each_other_and_from_train(clean):
    val, test = ({q.question for q in clean[s]} for s in ("val", "test"))
    assert not val & test
    for s, qs in clean.items():
        assert all(split_of(parse_question(q.question)) == s for q in qs)
    train = {q.text for q in draw_questions("train", 2000, seed=0)}
    assert not (val | test) & train
    # toy-hard stays the control: a different stratum (five hard steps, 8 operations)
    hard = {q.question for q in load_questions("toy-hard:val:10")}
    assert not hard & val


@pytest.mark.parametrize("spec, msg", [("toy-clean:train", "evaluation only"),
                                       ("toy-clean:nope", "nope"), ("toy-clean:val:0", "count")])
def test_bad_specs_are_one_line_errors(spec, msg):
    with pytest.raises(DatasetError, match=msg):
        load_questions(spec)
