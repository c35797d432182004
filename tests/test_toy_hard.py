"""The hard toy split (``toy-hard:<split>[:n]``): spec parsing, determinism, hardness, splits."""

from __future__ import annotations

import dataclasses
import random

import pytest

import data_pipelines.questions as questions_mod
from data_pipelines.questions import DatasetError, Question, load_questions
from data_pipelines.toy.hard import (
    HARD_SPLITS,
    ToyHardConfig,
    draw_hard_questions,
    is_hard,
    n_hard_steps,
)
from data_pipelines.toy.task import (
    ToyQuestion,
    draw_questions,
    parse_question,
    sample_trace,
    split_of,
    step_kind,
)

N = 40


@pytest.fixture(scope="module")
def hard() -> dict[str, list[Question]]:
    return {s: load_questions(f"toy-hard:{s}:{N}") for s in HARD_SPLITS}


def _hard_steps_independently(q: ToyQuestion) -> int:
    """Count hard steps from the running values (not through n_hard_steps)."""
    before = [q.start, *q.values()[:-1]]
    return sum(step_kind(v, op) == "hard" for v, op in zip(before, q.ops, strict=True))


def test_specs_parse(hard: dict[str, list[Question]]) -> None:
    for s, qs in hard.items():
        assert len(qs) == N
        assert [q.id for q in qs] == [f"toy-hard-{s}-0-{i}" for i in range(N)]
        assert {q.source for q in qs} == {f"toy-hard:{s}"}
        for q in qs:
            assert q.answer == str(parse_question(q.question).answer)
    assert len(load_questions("toy-hard:val", max_questions=3)) == 3
    assert len(load_questions("toy-hard", split="test", max_questions=2)) == 2
    assert len(load_questions(" toy-hard:test:9 ", max_questions=4)) == 4
    assert load_questions("toy-hard:val:5", split="val") == hard["val"][:5]


def test_deterministic_and_prefix_stable(hard: dict[str, list[Question]]) -> None:
    assert load_questions(f"toy-hard:val:{N}") == hard["val"]
    # a shorter spec is the start of a longer one
    assert load_questions("toy-hard:val:7") == hard["val"][:7]
    # another seed is another stream; and it is not the plain toy stream
    other = [q.text for q in draw_hard_questions("val", 10, seed=1)]
    assert other != [q.question for q in hard["val"][:10]]
    assert len({q.question for q in hard["val"]}) == N  # distinct


def test_every_question_is_hard(hard: dict[str, list[Question]]) -> None:
    cfg = ToyHardConfig()
    assert cfg.min_hard == 5
    for qs in hard.values():
        for rec in qs:
            q = parse_question(rec.question)
            assert _hard_steps_independently(q) >= cfg.min_hard
            assert n_hard_steps(q) == _hard_steps_independently(q)
            assert cfg.min_ops <= len(q.ops) <= cfg.max_ops
    six = draw_hard_questions("test", 5, cfg=ToyHardConfig(min_hard=6))
    assert all(_hard_steps_independently(q) == 6 for q in six)


def test_n_hard_steps_by_hand() -> None:
    # 05+8=13 hard (carry, 8); 13-9=04 hard (borrow, 9); 04+7=11 hard; 11+2=13 easy; 13-4=09 carry
    q = ToyQuestion(5, (8, -9, 7, 2, -4))
    assert n_hard_steps(q) == 3
    assert not is_hard(q)
    assert is_hard(q, ToyHardConfig(min_hard=3))
    assert not is_hard(q, ToyHardConfig(min_hard=3, min_ops=6, max_ops=8))


def test_splits_disjoint_and_never_train(hard: dict[str, list[Question]]) -> None:
    texts = {s: {q.question for q in qs} for s, qs in hard.items()}
    assert not texts["val"] & texts["test"]
    for s, ts in texts.items():
        assert all(split_of(parse_question(t)) == s for t in ts)
    train = {q.text for q in draw_questions("train", 3000)}
    assert not train & (texts["val"] | texts["test"])
    # the plain toy split of the same name contains questions of the same hash bucket
    assert all(split_of(parse_question(q.question)) == "val" for q in load_questions("toy:val:20"))


@pytest.mark.parametrize(
    ("spec", "kwargs", "match"),
    [
        ("toy-hard:train", {}, "toy-hard is for evaluation only"),
        ("toy-hard:dev", {}, "unknown toy-hard split 'dev'"),
        ("toy-hard:val:x", {}, "bad toy-hard count"),
        ("toy-hard:val:0", {}, "must be >= 1"),
        ("toy-hard:val:-3", {}, "must be >= 1"),
        ("toy-hard", {}, "needs a split"),
        ("toy-hard:val:5:1", {}, "expected toy-hard:<split>"),
        ("toy-hard:val", {"split": "test"}, "conflicts with split='test'"),
        ("toy-hard", {"split": "train"}, "toy-hard is for evaluation only"),
    ],
)
def test_bad_specs_one_line(spec: str, kwargs: dict[str, str], match: str) -> None:
    with pytest.raises(DatasetError, match=match) as e:
        load_questions(spec, **kwargs)
    assert "\n" not in str(e.value)


def test_loader_splits_match_generator() -> None:
    assert questions_mod._TOY_HARD_SPLITS == HARD_SPLITS
    with pytest.raises(ValueError, match="train"):
        draw_hard_questions("train", 1)


def test_config_is_frozen_and_checked() -> None:
    cfg = ToyHardConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.min_hard = 3  # type: ignore[misc]
    for bad in ({"min_hard": 0}, {"min_hard": 7}, {"min_ops": 6, "max_ops": 5}, {"max_ops": 4}):
        with pytest.raises(ValueError):
            ToyHardConfig(**bad)
    assert cfg.task.min_ops == cfg.min_ops and cfg.task.max_ops == cfg.max_ops


def test_hard_questions_are_harder_under_the_error_model(hard: dict[str, list[Question]]) -> None:
    """The point of the split: the world's slip model solves them less often (measured
    0.31 vs 0.50 per trace; not lower because opposite dropped carries cancel mod 100)."""

    def trace_acc(texts: list[str]) -> float:
        rng = random.Random(0)
        ok = [sample_trace(parse_question(t), rng).correct for t in texts for _ in range(30)]
        return sum(ok) / len(ok)

    easy = trace_acc([q.question for q in load_questions(f"toy:val:{N}")])
    tough = trace_acc([q.question for q in hard["val"]])
    assert tough < 0.75 * easy, (tough, easy)
