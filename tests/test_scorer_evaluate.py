"""gambit_scorer.evaluate: trace-level metrics of a checkpoint on a held-out harvest."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gambit_scorer.checkpoint import save_checkpoint
from gambit_scorer.evaluate import evaluate_scorer
from gambit_scorer.models import StepMLP
from tests.scorer_synth import make_harvest


def test_evaluate_scorer_reports_pooled_and_within_question(tmp_path):
    h = make_harvest(tmp_path / "h", hidden_size=16, n_questions=12, traces_per_question=6)
    model = StepMLP(16)
    torch.manual_seed(0)
    ckpt = tmp_path / "ckpt.pt"
    save_checkpoint(ckpt, model, features=["hidden"], hidden_size=16)
    r = evaluate_scorer(str(ckpt), str(h))
    assert r["traces"] > 0 and r["kind"] == "mlp"
    assert r["questions_with_both_outcomes"] <= r["questions"] == 12
    # recomputed independently: the checkpoint's last trace score per trace, sklearn's AUROC
    from sklearn.metrics import roc_auc_score

    from gambit_scorer.checkpoint import load_scorer
    from gambit_scorer.harvest_io import iter_traces

    sc = load_scorer(str(ckpt))
    rows = [(t.question_id, int(t.correct),
             float(sc.score_trace(t.hidden_states.astype(np.float32), t.conf_mean,
                                  t.conf_min)[-1]))
            for t in iter_traces(str(h)) if t.n_boundaries > 0]
    y = np.array([x[1] for x in rows])
    s = np.array([x[2] for x in rows])
    assert r["traces"] == len(rows) and r["accuracy"] == pytest.approx(y.mean())
    assert r["trace_auroc_pooled"] == pytest.approx(roc_auc_score(y, s))
    per_q = []
    for q in sorted({x[0] for x in rows}):
        yq = [x[1] for x in rows if x[0] == q]
        if 0 < sum(yq) < len(yq):
            per_q.append(roc_auc_score(yq, [x[2] for x in rows if x[0] == q]))
    assert per_q, "the synthetic harvest must hold questions with both outcomes"
    assert r["questions_with_both_outcomes"] == len(per_q)
    assert r["trace_auroc_within_question"] == pytest.approx(np.mean(per_q))
