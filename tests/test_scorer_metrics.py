"""Validation metrics: AUROC equals scikit-learn's, within-question vs pooled, selection."""

from __future__ import annotations

import math

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from gambit_scorer.metrics import auroc, evaluate, trace_scores_so_far, within_question_auroc


def test_auroc_matches_sklearn_with_ties():
    rng = np.random.default_rng(0)
    for _ in range(20):
        y = rng.integers(0, 2, 50)
        s = np.round(rng.random(50), 1)  # many ties
        if 0 < y.sum() < 50:
            assert auroc(y, s) == pytest.approx(roc_auc_score(y, s))
    assert math.isnan(auroc(np.ones(4), np.arange(4)))


def test_within_question_ignores_difficulty():
    # the score only knows the question's difficulty: pooled AUROC is high, within-question is 0.5
    q = np.repeat(np.arange(10), 10)
    p_correct = np.linspace(0.1, 0.9, 10)
    rng = np.random.default_rng(1)
    y = (rng.random(100) < p_correct[q]).astype(int)
    s = p_correct[q]
    assert auroc(y, s) > 0.7
    wq, n = within_question_auroc(q, y, s)
    assert wq == pytest.approx(0.5) and n >= 5
    # a perfect within-question ranking
    wq, _ = within_question_auroc(q, y, y + 0.01 * q)
    assert wq == 1.0


def test_trace_scores_so_far():
    trace = np.array([0, 0, 0, 1, 1])
    step = np.array([1, 2, 3, 1, 2])
    prob = np.array([0.2, 0.4, 0.9, 0.5, 0.1])
    np.testing.assert_allclose(
        trace_scores_so_far(trace, step, prob, "mlp"), [0.2, 0.3, 0.5, 0.5, 0.3]
    )
    np.testing.assert_allclose(trace_scores_so_far(trace, step, prob, "seq"), prob)


def _records(n_q=12, n_t=8, n_s=5, seed=0):
    rng = np.random.default_rng(seed)
    rows = []
    for q in range(n_q):
        for t in range(n_t):
            y = int(rng.random() < 0.5)
            for k in range(1, n_s + 1):
                rows.append(
                    (
                        q * n_t + t,
                        q,
                        k,
                        np.clip(0.5 + (y - 0.5) * 0.1 * k + rng.normal(0, 0.2), 0, 1),
                        y,
                    )
                )
    return [np.array(c) for c in zip(*rows, strict=True)]


def test_evaluate_keys_and_selection():
    tr, q, st, p, y = _records()
    order = np.random.default_rng(0).permutation(len(tr))  # any record order
    m = evaluate(tr[order], q[order], st[order], p[order], y[order], kind="mlp")
    for k in [
        "step_auroc",
        "step_auprc",
        "step_f1",
        "step_brier",
        "trace_auroc",
        "trace_auprc",
        "trace_f1",
        "trace_brier",
        "trace_auroc_wq",
        "n_wq_questions",
        "selection",
    ]:
        assert k in m
    assert m["n_traces"] == 96 and m["n_steps"] == 480
    assert m["selection_auroc"] == "trace_auroc_wq"
    assert m["selection"] == pytest.approx(0.75 * m["trace_auroc_wq"] + 0.25 * m["trace_f1"])
    assert set(m["by_step"]) == {"1", "2", "3", "4"}  # STEP_INDICES reached by >= 10 traces
    assert m["by_step"]["4"]["auroc_step"] > m["by_step"]["1"]["auroc_step"]
    m2 = evaluate(tr, q, st, p, y, kind="mlp", selection_auroc="trace_auroc")
    assert m2["selection"] == pytest.approx(0.75 * m2["trace_auroc"] + 0.25 * m2["trace_f1"])
    # too few questions with both outcomes -> pooled fallback, said so
    m3 = evaluate(tr, q, st, p, y, kind="seq", min_wq_questions=100)
    assert m3["selection_auroc"] == "trace_auroc"
    with pytest.raises(ValueError, match="selection AUROC"):
        evaluate(tr, q, st, p, y, kind="mlp", selection_auroc="roc")
