"""The toy reasoning world: generator, splits, traces, tokenizer, policy trainer smoke run."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from data_pipelines.toy.task import (
    MOD,
    SPLITS,
    ToyQuestion,
    ToyTaskConfig,
    draw_question,
    draw_questions,
    first_wrong_step,
    make_questions,
    parse_question,
    reference_trace,
    sample_trace,
    split_of,
    step_kind,
)
from data_pipelines.toy.tokenizer import BOUNDARY, build_tokenizer
from gambit_core.grading import extract_boxed


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


def test_generator_is_deterministic_and_splits_are_disjoint():
    a = draw_questions("test", 300, seed=3)
    assert [q.text for q in a] == [q.text for q in draw_questions("test", 300, seed=3)]
    assert [q.text for q in a] != [q.text for q in draw_questions("test", 300, seed=4)]
    sets = {s: {q.text for q in draw_questions(s, 400, seed=0)} for s in SPLITS}
    assert not (sets["train"] & sets["val"]) and not (sets["train"] & sets["test"]) and not (sets["val"] & sets["test"])
    assert all(split_of(parse_question(t)) == "val" for t in sets["val"])


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_question_round_trips_and_belongs_to_one_split(seed):
    q = draw_question(random.Random(seed))
    assert parse_question(q.text) == q
    assert split_of(q) in SPLITS
    assert len(set(q.ops)) == len(q.ops)  # distinct operands: unambiguous step lookup


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_sampled_trace_format_and_labels(seed):
    rng = random.Random(seed)
    q = draw_question(rng)
    t = sample_trace(q, rng)
    thoughts = t.text.split(BOUNDARY)
    assert thoughts[-1] == f"\\boxed{{{t.answer:02d}}}"
    assert int(extract_boxed(t.text)) == t.answer
    assert t.correct == (t.answer == q.answer)
    # every check's verdict is right about the step before it
    for prev, th in zip(thoughts, thoughts[1:], strict=False):
        if th.startswith("check"):
            a, rest = prev.split("=")[0], prev.split("=")[1]
            value = int(a[:2])
            op = int(a[2:])
            assert th.endswith(" ok") == (int(rest) == (value + op) % MOD)
    # the trace's own record of where it went wrong agrees with the grader
    assert first_wrong_step(q, t.text) == t.first_wrong_step
    if t.first_wrong_step is None:
        assert t.correct or t.n_slips >= 2  # only cancelling slips can hide


def test_reference_trace_is_slip_free():
    for q in draw_questions("train", 50, seed=1):
        text = reference_trace(q)
        assert int(extract_boxed(text)) == q.answer
        assert " no" not in text and first_wrong_step(q, text) is None
        assert text.count(BOUNDARY) == 2 * len(q.ops)  # a step and its check per operation


def test_first_wrong_step_catches_a_slip_in_the_middle():
    q = ToyQuestion(47, (8, -3, 9))
    good = reference_trace(q)
    bad = good.replace("52+9=61", "52+9=71").replace("check 61-9=52 ok", "check 71-9=62 no")
    assert first_wrong_step(q, good) is None
    assert first_wrong_step(q, bad) == 2
    assert first_wrong_step(q, "garbage") == 0


def test_step_kinds():
    assert step_kind(47, 8) == "hard"  # 7 + 8 carries with a large operand
    assert step_kind(47, 3) == "carry"
    assert step_kind(41, 3) == "easy"
    assert step_kind(41, -7) == "hard"  # borrow
    assert ToyTaskConfig().p_hard > ToyTaskConfig().p_carry > ToyTaskConfig().p_easy


def test_make_questions_records():
    qs = make_questions("test", 5, seed=0)
    assert [q.id for q in qs] == [f"toy-test-0-{i}" for i in range(5)]
    assert all(q.answer.isdigit() and q.source == "toy:test" for q in qs)
    with pytest.raises(ValueError, match="unknown toy split"):
        draw_questions("dev", 3)


def test_tokenizer_boundary_is_one_token_and_round_trips(tok):
    ids = tok.encode("check 55-8=47 ok\n\n55-3=52", add_special_tokens=False)
    assert tok.convert_tokens_to_ids(BOUNDARY) in ids
    assert tok.decode(ids) == "check 55-8=47 ok\n\n55-3=52"
    assert None not in (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id)
    assert len({tok.bos_token_id, tok.eos_token_id, tok.pad_token_id}) == 3
    assert len(tok) <= 128


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_tokenizer_round_trips_any_toy_text(seed):
    tok = build_tokenizer()
    rng = random.Random(seed)
    q = draw_question(rng)
    text = q.text + "\n" + sample_trace(q, rng).text
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text


def test_shipped_policy_files_exist_and_are_small():
    from pathlib import Path

    d = Path(__file__).resolve().parents[1] / "checkpoints" / "toy-policy"
    for name in ("config.json", "model.safetensors", "tokenizer.json", "README.md"):
        assert (d / name).is_file(), name
    assert (d / "model.safetensors").stat().st_size <= 20 * 2**20
    import json

    cfg = json.loads((d / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"]
    assert cfg["hidden_size"] // cfg["num_attention_heads"] in (32, 64, 80, 96, 112, 128)


def test_policy_trainer_smoke(tmp_path):
    """A few steps of the real Lightning recipe on a tiny config: it trains and saves a loadable model."""
    import json

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from data_pipelines.toy.train_policy import main

    out = tmp_path / "p"
    main(["--out", str(out), "--steps", "4", "--batch-size", "4", "--hidden", "32", "--n-heads", "1", "--ffn", "64",
          "--n-layers", "1", "--n-val", "4", "--warmup", "2", "--workers", "0", "--accelerator", "cpu"])
    meta = json.loads((out / "train_meta.json").read_text())
    assert meta["train_tokens"] > 0 and meta["config"]["steps"] == 4
    model = AutoModelForCausalLM.from_pretrained(out)
    tok = AutoTokenizer.from_pretrained(out)
    assert model.config.vocab_size >= len(tok)
    assert tok.convert_tokens_to_ids(BOUNDARY) != tok.unk_token_id


def test_char_roles_cover_every_character_of_sampled_traces():
    from data_pipelines.toy.task import char_roles

    for seed in range(50):
        rng = random.Random(seed)
        text = sample_trace(draw_question(rng), rng).text
        roles = char_roles(text)
        assert len(roles) == len(text) and "other" not in roles
        # a check's verdict is its last two characters
        for th, start in zip(text.split(BOUNDARY), _starts(text), strict=True):
            if th.startswith("check"):
                assert roles[start + len(th) - 2 : start + len(th)] == ["verdict"] * 2


def _starts(text: str) -> list[int]:
    out, k = [], 0
    for th in text.split(BOUNDARY):
        out.append(k)
        k += len(th) + len(BOUNDARY)
    return out
