"""The toy world's exact prefix labels (data_pipelines.toy.steps) on hand-built traces, the
harvest column, and gambit-train's data.labels switch on a tiny synthetic harvest."""

from __future__ import annotations

import random
import zlib

import numpy as np
import pytest
from scorer_synth import make_traces, write_harvest

from data_pipelines.toy.steps import clean_after_thoughts, clean_at_boundaries
from data_pipelines.toy.task import draw_questions, first_wrong_step, sample_trace
from gambit_scorer.harvest_io import HarvestError

Q = "Start 48. Ops: +1 -7 +5 -9. Mod 100."  # right values 49 42 47 38


def test_a_clean_trace_is_clean_throughout():
    th = ["48+1=49", "check 49-1=48 ok", "49-7=42", "check 42+7=49 ok", "42+5=47", "check 47-5=42 ok",
          "47-9=38", "check 38+9=47 ok", "\\boxed{38}"]
    assert clean_after_thoughts(Q, th) == [1] * 9


def test_a_slip_at_step_3_that_is_carried_on_stays_dirty():
    # the third thought slips (49-7 gives 52: a borrow dropped), its check says no, the retry slips
    # again, and the trace gives up: every later thought is labelled 0
    th = ["48+1=49", "check 49-1=48 ok", "49-7=52", "check 52+7=59 no", "49-7=52", "52+5=57",
          "57-9=48", "\\boxed{48}"]
    assert clean_after_thoughts(Q, th) == [1, 1, 0, 0, 0, 0, 0, 0]


def test_a_caught_slip_is_clean_again_after_a_right_retry():
    th = ["48+1=49", "check 49-1=48 ok", "49-7=52", "check 52+7=59 no", "49-7=42", "check 42+7=49 ok",
          "42+5=47"]
    assert clean_after_thoughts(Q, th) == [1, 1, 0, 0, 1, 1, 1]


def test_cancelling_slips_do_not_clean_a_trace_again():
    # +1 comes out 10 low (39) and a wrong check passes it; the next step's own slip (10 high)
    # lands on the right value 42 by luck: the trace moved past a wrong value, so it stays 0
    th = ["48+1=39", "check 39-1=48 ok", "39-7=42", "check 42+7=49 no"]
    assert clean_after_thoughts(Q, th) == [0, 0, 0, 0]


def test_wrong_checks_out_of_order_operations_and_junk():
    assert clean_after_thoughts(Q, ["48+1=49", "check 49-1=48 no"]) == [1, 0]  # wrong verdict
    assert clean_after_thoughts(Q, ["48+1=49", "check 49-1=47 ok"]) == [1, 0]  # wrong recomputation
    assert clean_after_thoughts(Q, ["48-7=41", "41+1=42"]) == [0, 0]  # the wrong operation first
    assert clean_after_thoughts(Q, ["48+1=49", "hmm", "49-7=42"]) == [1, 0, 0]
    with pytest.raises(ValueError, match="not a toy question"):
        clean_after_thoughts("What is 2+2?", ["4"])


def test_labels_agree_with_the_worlds_own_bookkeeping():
    """On sampled training traces: clean after the final answer iff the trace is right with no
    wrong value carried (first_wrong_step None), and never clean again after a carried slip."""
    rng = random.Random(3)
    for q in draw_questions("train", 60, 0):
        for _ in range(4):
            t = sample_trace(q, rng)
            lab = clean_after_thoughts(q, t.text.split("\n\n"))
            assert lab[-1] == int(t.correct and first_wrong_step(q, t.text) is None)
            if t.first_wrong_step is not None:
                last_zero_run = lab[lab.index(0):]
                assert lab[-1] == 0 and last_zero_run[-1] == 0


def test_at_boundaries_uses_the_thoughts_each_boundary_closes():
    text = "48+1=49\n\n" + "check 49-1=48 ok\n\n" + "49-7=52\n\n"
    prefixes = [text[: i + 2] for i in range(len(text) - 1) if text[i : i + 2] == "\n\n"]
    assert clean_at_boundaries(Q, prefixes) == [1, 1, 0]
    assert clean_at_boundaries(Q, []) == []


# ----------------------------------------------------------------------------- training


def _harvest(path, with_labels=True):
    traces = make_traces(n_questions=30, traces_per_question=6, hidden_size=8, hidden_signal=1.5, seed=4)
    for t in traces:  # the prefix is clean before the trace's error step: where its states shift
        n = len(t.boundary_positions)
        err = n + 1 if t.correct else 1 + zlib.crc32(f"{t.question_id}/{t.trace_index}".encode()) % n
        t.prefix_labels = [int(k < err) for k in range(1, n + 1)] if with_labels else None
    return write_harvest(path, traces, hidden_size=8, n_shards=2), traces


def test_batches_carry_the_prefix_labels(tmp_path):
    from gambit_scorer.data import HarvestDataModule

    h, traces = _harvest(tmp_path / "h")
    want = {(t.question_id, t.trace_index): t.prefix_labels for t in traces}
    for kind in ("mlp", "seq"):
        dm = HarvestDataModule(str(h), kind=kind, labels="prefix", batch_size=16)
        dm.setup()
        ix = dm.index
        inv = {v: k for k, v in ix.key.items()}
        b = next(iter(dm.train_dataloader()))
        if kind == "seq":
            for i, tid in enumerate(b["trace"].tolist()):
                n = int(b["lengths"][i])
                assert b["y_step"][i, :n].tolist() == want[inv[tid][1:]]
                assert b["y_step_mask"][i].sum() == n
        else:
            for tid, k, y in zip(b["trace"].tolist(), b["step"].tolist(), b["y_step"].tolist(), strict=True):
                assert y == want[inv[tid][1:]][k - 1]
        # outcome batches have no step labels (the reference path is unchanged)
        dm0 = HarvestDataModule(str(h), kind=kind, batch_size=16)
        dm0.setup()
        assert "y_step" not in next(iter(dm0.train_dataloader()))
        assert dm.pos_weight != dm0.pos_weight


def test_train_on_prefix_labels_and_the_errors(tmp_path):
    from gambit_scorer.train import compose, train

    h, _ = _harvest(tmp_path / "h")
    fast = ["threads=1", "trainer.enable_progress_bar=false", "trainer.accelerator=cpu", "trainer.max_epochs=2",
            "scorer=seq", "scorer.model.d_model=32", "scorer.model.dim_feedforward=64"]
    r = train(compose([f"data.harvest={h}", "data.labels=prefix", f"run_dir={tmp_path / 'run'}", *fast]))
    assert r["labels"] == "prefix" and r["loss_position"] == "every"
    assert np.isfinite(r["metrics"]["trace_auroc"])
    import torch

    assert torch.load(r["ckpt_path"], weights_only=True)["gambit"]["labels"] == "prefix"
    bare, _ = _harvest(tmp_path / "bare", with_labels=False)
    with pytest.raises(HarvestError, match="no prefix labels for 180 of its 180 traces"):
        train(compose([f"data.harvest={bare}", "data.labels=prefix", f"run_dir={tmp_path / 'r2'}", *fast]))
    with pytest.raises(HarvestError, match="Monte-Carlo labels for 0 of 2 shards"):
        train(compose([f"data.harvest={h}", "data.labels=mc", f"run_dir={tmp_path / 'r3'}", *fast]))
    with pytest.raises(ValueError, match="data.labels='steps': choose one of outcome|prefix|mc"):
        train(compose([f"data.harvest={h}", "data.labels=steps", *fast]))
