"""gambit-harvest on the scripted fake engine: output format, sharding, crash safety, bad input."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow.dataset as pads
import pytest

from data_pipelines.harvest import HarvestConfig, harvest
from gambit_core.errors import InputError
from gambit_scorer.harvest_io import iter_traces, read_manifest

ROOT = Path(__file__).resolve().parents[1]


def _rows(out: Path) -> dict:
    t = pads.dataset(sorted(str(p) for p in out.glob("data/shard-*.parquet"))).to_table(
        columns=["question_id", "trace_index", "token_ids", "boundary_positions"]).to_pydict()
    keys = list(zip(t["question_id"], t["trace_index"], strict=True))
    assert len(keys) == len(set(keys)), "a trace was written twice"
    return {k: (ids, b) for k, ids, b in zip(keys, t["token_ids"], t["boundary_positions"], strict=True)}


def cfg(out, **kw) -> HarvestConfig:
    base = dict(out=str(out), engine="fake", dataset="toy:train:10", n=4, questions_per_shard=3, max_tokens=64)
    return HarvestConfig(**(base | kw))


def test_harvest_writes_shards_manifest_and_readable_rows(tmp_path):
    s = harvest(cfg(tmp_path / "h"))
    out = tmp_path / "h"
    assert sorted(p.name for p in out.glob("data/shard-*.parquet")) == [f"shard-{i:05d}.parquet" for i in range(4)]
    m = read_manifest(out)
    assert m["counts"]["questions"] == 10 and m["counts"]["traces"] == 40 == s["traces"]
    assert m["hidden_size"] == 16 and m["boundary_token_ids"] == [4]
    assert m["sampling"]["n"] == 4 and "versions" in m
    traces = list(iter_traces(out))
    assert len(traces) == 40
    for t in traces:
        assert t.hidden_states.shape == (len(t.boundary_positions), 16)
        assert all(t.token_ids[p] == 4 for p in t.boundary_positions)  # states sit at boundary tokens
        assert len(t.conf_mean) == len(t.conf_min) == len(t.boundary_positions)
        assert (t.conf_min <= t.conf_mean + 1e-6).all()
        assert t.n_tokens == len(t.token_ids)
    import datasets

    ds = datasets.load_dataset("parquet", data_dir=str(out / "data"), split="train")
    assert len(ds) == 40 and "hidden_states" in ds.column_names


def test_shards_together_equal_one_unsharded_run(tmp_path):
    harvest(cfg(tmp_path / "one"))
    harvest(cfg(tmp_path / "two", shard="1/2"))
    assert not (tmp_path / "two" / "manifest.json").exists()  # incomplete until shard 0/2 lands
    harvest(cfg(tmp_path / "two", shard="0/2"))
    assert (tmp_path / "two" / "manifest.json").exists()
    assert _rows(tmp_path / "one") == _rows(tmp_path / "two")


def test_refuses_a_directory_of_another_config(tmp_path):
    harvest(cfg(tmp_path / "h"))
    with pytest.raises(InputError, match="another config.*temperature"):
        harvest(cfg(tmp_path / "h", temperature=0.5))


def test_bad_inputs_are_one_line_errors(tmp_path):
    with pytest.raises(InputError, match="cannot read dataset"):
        harvest(cfg(tmp_path / "a", dataset=str(tmp_path / "missing.jsonl")))
    with pytest.raises(InputError, match="model path .* does not exist"):
        harvest(cfg(tmp_path / "b", engine="vllm", model="./no/such/model"))
    with pytest.raises(InputError, match="--shard"):
        harvest(cfg(tmp_path / "c", shard="3/2"))


def test_overlong_prompt_fails_that_question_only(tmp_path):
    data = tmp_path / "q.jsonl"
    rows = [{"question": "short one", "answer": "1"}, {"question": "x" * 2000, "answer": "2"},
            {"question": "another", "answer": "3"}]
    data.write_text("\n".join(json.dumps(r) for r in rows))
    s = harvest(cfg(tmp_path / "h", dataset=str(data)))
    m = read_manifest(tmp_path / "h")
    assert m["counts"]["failed_questions"] == 1 and m["failed"][0]["question_id"] == "q-1"
    assert s["traces"] == 12  # failed traces are recorded (correct=False), the others complete
    ok = [t for t in iter_traces(tmp_path / "h") if t.question_id != "q-1"]
    assert all(t.n_tokens > 0 for t in ok)


def test_kill_9_then_rerun_finishes_every_question_exactly_once(tmp_path):
    """A real subprocess is killed mid-run; the same command then completes the harvest.

    The fake engine writes a shard in a few milliseconds, so the run is 200 shards long:
    a kill after the third lands well before the last on any machine (40 questions was
    short enough for a fast CI box to finish between two polls)."""
    out = tmp_path / "h"
    n_q, n_shards = 400, 200
    args = [sys.executable, "-m", "data_pipelines.harvest", "--out", str(out), "--engine", "fake",
            "--dataset", f"toy:train:{n_q}", "--n", "8", "--questions-per-shard", "2", "--max-tokens", "200"]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    p = subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while time.time() < deadline and len(list(out.glob("data/shard-*.parquet"))) < 3:
        time.sleep(0.005)
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    n_before = len(list(out.glob("data/shard-*.parquet")))
    assert 0 < n_before < n_shards, "kill landed before the first or after the last shard"
    assert not (out / "manifest.json").exists()
    subprocess.run(args, cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    m = read_manifest(out)
    assert m["counts"]["questions"] == n_q and m["counts"]["traces"] == 8 * n_q
    rows = _rows(out)
    assert sorted({q for q, _ in rows}) == sorted(f"toy-train-0-{i}" for i in range(n_q))
    assert not list(out.glob("data/*.tmp"))
    # identical to an uninterrupted run
    harvest(cfg(tmp_path / "clean", dataset=f"toy:train:{n_q}", n=8, questions_per_shard=2, max_tokens=200))
    assert rows == _rows(tmp_path / "clean")


@pytest.mark.slow
def test_harvest_on_the_real_engine(tmp_path, engine, toy_hf_model, toy_tokenizer):
    """The shipped toy policy through vLLM: graded rows with real boundary states and
    thought confidences equal to transformers' log-probs of the sampled tokens."""
    import torch

    from gambit_core.prompts import build_prompt_ids

    s = harvest(HarvestConfig(out=str(tmp_path / "h"), dataset="toy:train:8", n=4, questions_per_shard=4), engine=engine)
    assert s["traces"] == 32 and 0.1 < s["accuracy"] < 0.9
    m = read_manifest(tmp_path / "h")
    assert m["hidden_size"] == 128 and m["boundary_token_ids"] == [4] and m["model_hash"]
    from data_pipelines.toy.task import parse_question
    from gambit_core.grading import grade

    for t in iter_traces(tmp_path / "h"):
        assert t.hidden_states.shape == (len(t.boundary_positions), 128)
        assert all(t.token_ids[p] == 4 for p in t.boundary_positions)
        # every "\n\n" but possibly one right before the stop has its state
        assert t.token_ids.count(4) - len(t.boundary_positions) in (0, 1)
        assert (t.conf_min <= 0).all() and (t.conf_min <= t.conf_mean + 1e-6).all()
        assert grade(t.gold, t.text) == (t.answer, t.correct)
        assert str(parse_question(t.question).answer) == t.gold
    prompt = build_prompt_ids(t.question, toy_tokenizer)
    with torch.no_grad():
        logits = toy_hf_model(input_ids=torch.tensor([prompt + list(t.token_ids)])).logits[0]
    ref = torch.log_softmax(logits, -1)[len(prompt) - 1 : -1].gather(1, torch.tensor(t.token_ids)[:, None])[:, 0]
    start = 0
    for b, mean, low in zip(t.boundary_positions, t.conf_mean, t.conf_min, strict=True):
        seg = ref[start : b + 1]
        assert abs(mean - float(seg.mean())) <= 1e-3 and abs(low - float(seg.min())) <= 1e-3
        start = b + 1


@pytest.mark.slow
def test_harvest_without_vllm_detokenization_gives_the_same_rows(tmp_path, engine):
    """The harvest's own engine skips vLLM's per-token detokenization and decodes each trace
    once at the end: same seeds, same token ids, same text and grades as with vLLM's text."""
    import dataclasses

    kw = dict(dataset="toy:train:4", n=4, questions_per_shard=4)
    harvest(HarvestConfig(out=str(tmp_path / "a"), **kw), engine=engine)
    cfg = engine.config
    engine.config = dataclasses.replace(cfg, detokenize=False)
    try:
        harvest(HarvestConfig(out=str(tmp_path / "b"), **kw), engine=engine)
    finally:
        engine.config = cfg
    a, b = list(iter_traces(tmp_path / "a")), list(iter_traces(tmp_path / "b"))
    assert len(a) == len(b) == 16 and any(t.text for t in a)
    for x, y in zip(a, b, strict=True):
        assert (x.question_id, x.trace_index, x.token_ids) == (y.question_id, y.trace_index, y.token_ids)
        assert x.text == y.text and (x.answer, x.correct) == (y.answer, y.correct)
        np.testing.assert_allclose(x.conf_mean, y.conf_mean, atol=1e-6)


# ---------------------------------------------------------------- majority@n over equivalence bins
# "0.5", "1/2" and "\frac{1}{2}" are one answer: three votes beat two for "3", where an
# exact-string vote would pick "3".
HALF = ["0.5", "1/2", "\\frac{1}{2}", "3", "3"]


def _write_answers(out: Path, by_question: dict[str, tuple[str, list[str | None]]]) -> None:
    import pyarrow.parquet as pq

    from gambit_core.grading import is_equivalent
    from gambit_scorer.harvest_io import HarvestTrace, traces_to_table

    traces = []
    for qid, (gold, answers) in by_question.items():
        for i, a in enumerate(answers):
            traces.append(HarvestTrace(
                question_id=qid, question="?", gold=gold, trace_index=i, token_ids=[1, 2],
                text="" if a is None else f"so \\boxed{{{a}}}", answer=a,
                correct=a is not None and is_equivalent(gold, a), boundary_positions=[],
                hidden_states=np.zeros((0, 4), np.float16), conf_mean=np.zeros(0, np.float32),
                conf_min=np.zeros(0, np.float32), n_tokens=2))
    (out / "data").mkdir(parents=True)
    pq.write_table(traces_to_table(traces), out / "data" / "shard-00000.parquet")


def test_summary_majority_pools_equivalent_answers(tmp_path):
    from data_pipelines.harvest import summarize

    _write_answers(tmp_path, {
        "half": ("1/2", HALF),             # bins {0.5, 1/2, \frac{1}{2}} x3 > {3} x2: right
        "none": ("5", [None, None]),       # nobody answered: wrong
        "seven": ("7", ["8", "7", "07"]),  # equal integers written differently: right
    })
    s = summarize(tmp_path)
    assert s["questions"] == 3 and s["traces"] == 10
    assert s["majority@n"] == pytest.approx(2 / 3)  # exact strings: "3" and "8" win: 0
    assert s["pass@n"] == pytest.approx(2 / 3)


def test_summary_majority_can_also_lose_to_a_bin(tmp_path):
    from data_pipelines.harvest import summarize

    # "3" has the most votes as a string, but the three halves are one answer
    _write_answers(tmp_path, {"three": ("3", ["3", "3", "0.5", "1/2", "\\frac12", None])})
    s = summarize(tmp_path)
    assert s["majority@n"] == 0.0 and s["pass@n"] == 1.0


def test_majority_correct_reuses_the_winning_traces_grade():
    from gambit_core.vote_bins import majority_correct

    assert majority_correct(HALF, [True, True, True, False, False]) == ("0.5", True)
    # the winner's verdict is its own trace's grade (the representative: the bin's first answer)
    assert majority_correct(["0.5", "1/2", "3"], [False, True, False]) == ("0.5", False)
    assert majority_correct([None, "", None], [False, False, False]) == (None, False)
    with pytest.raises(ValueError, match="2 answers but 1 verdicts"):
        majority_correct(["1", "2"], [True])


def test_toy_evaluator_votes_over_equivalence_bins():
    """The toy evaluator's majority@n uses the same bins as the harvest's summary."""
    from data_pipelines.toy.evaluate import question_votes

    texts = [f"step\n\nso the answer is \\boxed{{{a}}}" for a in HALF] + ["no box"]
    ok, majority_ok = question_votes("1/2", texts)
    assert ok == [True, True, True, False, False, False] and majority_ok
    assert question_votes("3", texts) == ([False, False, False, True, True, False], False)
