"""gambit_scorer.evaluate: trace-level metrics of a checkpoint on a held-out harvest."""

from __future__ import annotations

import numpy as np
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
    for k in ("trace_auroc_pooled", "trace_auroc_within_question", "mean_logprob_auroc_pooled"):
        assert 0.0 <= r[k] <= 1.0 or np.isnan(r[k])
    assert r["questions_with_both_outcomes"] <= r["questions"] == 12
