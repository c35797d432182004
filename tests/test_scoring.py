"""Run-time scoring: the batched forward equals scoring each trace alone."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gambit_scorer.checkpoint import build_checkpoint, scorer_from_checkpoint
from gambit_scorer.models import SeqScorer, StepMLP
from gambit_search.scoring import RuntimeScorer, thought_confidence


def _loaded(model, features=("hidden",), conf_norm=None):
    ck = build_checkpoint(model, features=list(features), hidden_size=16, conf_norm=conf_norm)
    return scorer_from_checkpoint(ck)


def _drive(rs: RuntimeScorer, ref, rng, steps=10, branch_at=4):
    """Random boundaries for 6 traces (trace 9 branches from trace 0 at ``branch_at``);
    returns the largest |batched - one-by-one| score difference."""
    s = ref
    hist = {}
    for k in range(6):
        rs.add(k)
        hist[k] = s.init_history()
    worst = 0.0
    for step in range(steps):
        if step == branch_at:
            rs.add(9, parent=0)
            hist[9] = s.copy_history(hist[0])
        items = [(k, rng.standard_normal(16).astype(np.float32), step)
                 for k in hist if rng.random() < 0.7]
        if items:
            items.append((items[0][0], rng.standard_normal(16).astype(np.float32), step))  # 2 in a step
        got = rs.score(items)
        for (k, h, _), g in zip(items, got, strict=True):
            hist[k], want = s.append(hist[k], h)
            worst = max(worst, abs(want - g))
    return worst


@pytest.mark.parametrize("layers", [1, 2])
def test_seq_batched_equals_one_by_one(layers):
    torch.manual_seed(0)
    s = _loaded(SeqScorer(16, d_model=32, nhead=4, num_layers=layers, dim_feedforward=64).eval())
    rs = RuntimeScorer(s, threads=None)
    assert _drive(rs, s, np.random.default_rng(1)) < 1e-5
    assert rs.forwards > 0


def test_seq_sliding_window_matches():
    torch.manual_seed(0)
    s = _loaded(SeqScorer(16, d_model=32, nhead=4, num_layers=1, dim_feedforward=64,
                          max_len=3).eval())
    assert _drive(RuntimeScorer(s, threads=None), s, np.random.default_rng(2), steps=8) < 1e-5


def test_mlp_is_the_running_mean():
    torch.manual_seed(0)
    s = _loaded(StepMLP(16, [8]).eval())
    rs = RuntimeScorer(s, threads=None)
    rng = np.random.default_rng(3)
    hs = rng.standard_normal((4, 16)).astype(np.float32)
    rs.add("a")
    got = [rs.score([("a", h, i)])[0] for i, h in enumerate(hs)]
    want = s.score_trace(hs)
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_confidence_features_come_from_each_thought():
    torch.manual_seed(0)
    norm = {"mean": [0.0, 0.0], "std": [1.0, 1.0]}
    s = _loaded(StepMLP(18, [8]).eval(), ("hidden", "conf_mean", "conf_min"), norm)
    rs = RuntimeScorer(s, threads=None)
    lp = np.array([-0.1, -0.5, -0.2, -2.0, -0.3, np.nan], dtype=np.float32)
    h = np.ones(16, np.float32)
    rs.add(0)
    first = rs.score([(0, h, 2)], {0: lp})[0]   # thought = tokens 0..2
    second = rs.score([(0, h, 5)], {0: lp})[0]  # thought = tokens 3..5 (NaN left out)
    p1 = s.score_steps(h, np.float32(np.mean(lp[:3])), np.float32(lp[:3].min()))
    p2 = s.score_steps(h, np.float32(np.mean(lp[3:5])), np.float32(lp[3:5].min()))
    assert first == pytest.approx(float(p1), rel=1e-5)
    assert second == pytest.approx((float(p1) + float(p2)) / 2, rel=1e-5)
    assert thought_confidence(lp, 3, 5) == pytest.approx((-1.15, -2.0))
    with pytest.raises(ValueError, match="logprobs"):
        rs.score([(0, h, 6)])
