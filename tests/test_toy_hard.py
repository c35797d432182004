"""The hard toy split (``toy-hard:<split>[:n]``): spec parsing, determinism, hardness, splits."""

from __future__ import annotations

import dataclasses
import random

import pytest

import gambit_core.questions as questions_mod
from data_pipelines.toy.hard import (
    HARD_SPLITS,
    ToyHardConfig,
    draw_hard_questions,
    drift,
    first_hard_step,
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
from gambit_core.errors import DatasetError
from gambit_core.questions import Question, load_questions

N = 40


@pytest.fixture(scope="module")
def hard() -> dict[str, list[Question]]:
    return {s: load_questions(f"toy-hard:{s}:{N}") for s in HARD_SPLITS}


def _hard_signs_independently(q: ToyQuestion) -> list[int]:
    """Signs of the hard steps from the running values (not through hard.hard_signs)."""
    before = [q.start, *q.values()[:-1]]
    return [
        1 if op > 0 else -1
        for v, op in zip(before, q.ops, strict=True)
        if step_kind(v, op) == "hard"
    ]


def _hard_steps_independently(q: ToyQuestion) -> int:
    return len(_hard_signs_independently(q))


def _lead_independently(q: ToyQuestion) -> int:
    """Operations before the first hard one (len(ops) when none is hard)."""
    before = [q.start, *q.values()[:-1]]
    kinds = [step_kind(v, op) for v, op in zip(before, q.ops, strict=True)]
    return kinds.index("hard") if "hard" in kinds else len(kinds)


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


def test_resumed_stream_equals_a_fresh_one() -> None:
    from data_pipelines.toy import hard as hard_mod

    hard_mod._STREAMS.clear()
    short = draw_hard_questions("test", 7, seed=2)
    longer = draw_hard_questions("test", 20, seed=2)  # resumes the kept stream
    short.clear()  # callers get their own lists
    hard_mod._STREAMS.clear()
    fresh = draw_hard_questions("test", 20, seed=2)
    assert longer == fresh and len(draw_hard_questions("test", 7, seed=2)) == 7
    # another config is another stream, even with the same split and seed
    loose = draw_hard_questions("test", 20, seed=2, cfg=ToyHardConfig(min_lead=0, min_ops=5))
    assert loose != fresh


def test_every_question_is_hard(hard: dict[str, list[Question]]) -> None:
    cfg = ToyHardConfig()
    assert cfg.min_hard == 5
    for qs in hard.values():
        for rec in qs:
            q = parse_question(rec.question)
            assert _hard_steps_independently(q) >= cfg.min_hard
            assert n_hard_steps(q) == _hard_steps_independently(q)
            assert cfg.min_ops <= len(q.ops) <= cfg.max_ops
            assert _lead_independently(q) >= cfg.min_lead
            assert abs(sum(_hard_signs_independently(q))) >= cfg.min_drift
    six = draw_hard_questions("test", 5, cfg=ToyHardConfig(min_hard=6, min_lead=0))
    assert all(_hard_steps_independently(q) == 6 for q in six)


def test_n_hard_steps_by_hand() -> None:
    # 05+8=13 hard (carry, 8); 13-9=04 hard (borrow, 9); 04+7=11 hard; 11+2=13 easy; 13-4=09 carry
    q = ToyQuestion(5, (8, -9, 7, 2, -4))
    assert n_hard_steps(q) == 3 and drift(q) == 1 and first_hard_step(q) == 0
    assert not is_hard(q)
    loose = {"min_hard": 3, "min_ops": 5, "min_lead": 0}
    assert is_hard(q, ToyHardConfig(**loose))
    assert not is_hard(q, ToyHardConfig(**loose | {"min_hard": 4}))
    assert not is_hard(q, ToyHardConfig(**loose | {"min_ops": 6}))  # 5 ops: too short
    assert not is_hard(q, ToyHardConfig(**loose | {"min_drift": 2}))
    assert not is_hard(q, ToyHardConfig(**loose | {"min_lead": 1}))  # first op is hard
    # 05+8=13 hard; 13+9=22 hard; 22+7=29 easy; 29+1=30 carry: two '+' hard steps, drift 2
    q2 = ToyQuestion(5, (8, 9, 7, 1))
    assert n_hard_steps(q2) == 2 and drift(q2) == 2
    assert is_hard(q2, ToyHardConfig(min_hard=2, min_ops=4, min_drift=2, min_lead=0))
    # 01+2=03 easy; 03+8=11 hard; 11-9=02 hard: lead 1
    q3 = ToyQuestion(1, (2, 8, -9))
    assert first_hard_step(q3) == 1 and first_hard_step(ToyQuestion(1, (2, 3))) is None
    assert is_hard(q3, ToyHardConfig(min_hard=2, min_ops=3, min_lead=1))
    assert not is_hard(q3, ToyHardConfig(min_hard=2, min_ops=3, min_lead=2))


def test_drift_filter() -> None:
    cfg = ToyHardConfig(min_hard=2, min_ops=5, min_drift=2, min_lead=0)
    qs = draw_hard_questions("val", 30, cfg=cfg)
    assert all(abs(sum(_hard_signs_independently(q))) >= 2 for q in qs)
    assert all(_hard_steps_independently(q) >= 2 for q in qs)
    assert {len(q.ops) for q in qs} - set(range(5, 9)) == set()


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
    assert questions_mod.generated_sources()["toy-hard"].splits == HARD_SPLITS
    with pytest.raises(ValueError, match="train"):
        draw_hard_questions("train", 1)


def test_config_is_frozen_and_checked() -> None:
    cfg = ToyHardConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.min_hard = 3  # type: ignore[misc]
    for bad in (
        {"min_hard": 0},
        {"min_hard": 7},
        {"min_ops": 6, "max_ops": 5},
        {"max_ops": 4},
        {"min_drift": 4},
        {"min_drift": -1},
        {"min_hard": 5, "min_drift": 2},  # 5 hard steps use 3 + 2 of the 6 large operands
        {"min_hard": 4, "min_drift": 3},
        {"min_lead": -1},
        {"min_hard": 5, "min_lead": 4},  # 4 + 5 > 8 operations
    ):
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


def test_calibration_metrics_on_a_synthetic_run(tmp_path) -> None:
    import importlib.util
    import json
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "toy_hard_calibration.py"
    spec = importlib.util.spec_from_file_location("toy_hard_calibration", path)
    assert spec is not None and spec.loader is not None
    cal = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cal)

    def node(i: int, answer: str | None, score: float | None, state: str = "completed") -> dict:
        return {
            "id": i,
            "state": state,
            "answer": answer,
            "scores": [] if score is None else [[3, 0.0], [9, score]],
        }

    trees = {
        "q1": [
            node(0, "5", 0.9),
            node(1, "05", 0.4),
            node(2, "6", 0.5),
            node(3, "7", 0.1),
            node(4, "5", 0.99, state="pruned"),
        ],
        "q2": [node(0, "3", 0.2), node(1, "3", None)],
    }
    run = tmp_path / "bon"
    (run / "trees").mkdir(parents=True)
    rows = [
        {
            "id": "q1",
            "gold": "5",
            "correct": True,
            "correct_weighted": True,
            "correct_plain": False,
            "correct_top1": True,
        },
        {
            "id": "q2",
            "gold": "3",
            "correct": True,
            "correct_weighted": True,
            "correct_plain": True,
            "correct_top1": False,
        },
    ]
    (run / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    for qid, nodes in trees.items():
        (run / "trees" / f"{qid}.json").write_text(json.dumps({"id": qid, "nodes": nodes}))

    m = cal.run_metrics(run)
    assert m["questions"] == 2
    assert m["accuracy_plain"] == 0.5 and m["accuracy_top1"] == 0.5 and m["accuracy"] == 1.0
    # q1: 2 of 4 completed traces right ("05" equals "5"; the pruned node does not count)
    assert m["per_trace_accuracy"] == pytest.approx((2 / 4 + 2 / 2) / 2)
    assert m["pass_at_n"] == 1.0
    # q1's AUROC: right {0.9, 0.4} vs wrong {0.5, 0.1}: 3 of 4 pairs ordered; q2 has no wrong
    assert m["within_question_auroc"] == pytest.approx(0.75) and m["auroc_questions"] == 1
    pooled = cal.calibrate([tmp_path / "bon"], pool=True)
    assert pooled["pooled/bon"]["within_question_auroc"] == pytest.approx(0.75)
