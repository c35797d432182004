"""Score a held-out harvest with a trained scorer: trace-level AUROC pooled and within question,
and the within-question AUROC of the prefix score by depth.

The trace score is what the search runtime sees at the end of a trace (``score_trace``:
the running mean of step scores for the MLP, the last position for the SeqScorer); the
baseline is the trace's mean token log-probability, from the same harvest.

``by_depth`` (:func:`gambit_scorer.metrics.auroc_by_depth`): the score after boundary k,
ranked among the traces of one question that reached k, against each label the harvest
holds: ``outcome`` (the trace's final answer), ``prefix`` (toy harvests: the prefix is still
clean), ``mc`` (Monte-Carlo labels, at the labelled boundaries); ``mean_logprob`` is the same
for the baseline score (the mean token log-probability so far) against the outcome.

    python -m gambit_scorer.evaluate --scorer checkpoints/toy-scorer-mlp/ckpt.pt --harvest harvests/toy-test
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass

import numpy as np


def evaluate_scorer(scorer_path: str, harvest: str) -> dict:
    """Trace-level metrics of ``scorer_path`` on every trace of ``harvest`` with >= 1 boundary."""
    from gambit_scorer.checkpoint import load_scorer
    from gambit_scorer.harvest_io import HarvestError, iter_traces, read_manifest, read_mc_labels
    from gambit_scorer.metrics import auroc, auroc_by_depth, within_question_auroc

    m = read_manifest(harvest)
    scorer = load_scorer(scorer_path, expected_hidden_size=m["hidden_size"])
    try:
        mc = read_mc_labels(harvest)
    except HarvestError:
        mc = None
    qs, ys, scores, base = [], [], [], []
    steps: dict[str, list] = {"q": [], "k": [], "s": [], "y": [], "prefix": [], "mc": [], "lp": []}
    has_prefix = True
    for t in iter_traces(harvest):
        if t.n_boundaries == 0:
            continue
        s = scorer.score_trace(t.hidden_states.astype(np.float32), t.conf_mean, t.conf_min)
        lens = np.diff(np.concatenate([[-1], np.asarray(t.boundary_positions)]))
        n = t.n_boundaries
        steps["q"] += [t.question_id] * n
        steps["k"].append(np.arange(1, n + 1))
        steps["s"].append(np.asarray(s, dtype=np.float64))
        steps["y"] += [int(t.correct)] * n
        steps["lp"].append(np.cumsum(np.asarray(t.conf_mean, np.float64) * lens) / np.cumsum(lens))
        has_prefix &= t.prefix_labels is not None
        steps["prefix"].append(np.asarray(t.prefix_labels if t.prefix_labels is not None else [-1] * n))
        mc_t = mc.get((t.question_id, t.trace_index)) if mc is not None else None
        steps["mc"].append(np.asarray(mc_t[0] if mc_t is not None else [-1] * n))
        qs.append(t.question_id)
        ys.append(int(t.correct))
        scores.append(float(s[-1]))
        base.append(float(np.average(t.conf_mean, weights=lens)))  # mean token log-prob up to the last boundary
    q, y, s, b = np.array(qs), np.array(ys), np.array(scores), np.array(base)
    wq, n_q = within_question_auroc(q, y, s)
    wq_b, _ = within_question_auroc(q, y, b)
    sq, sk = np.array(steps["q"]), np.concatenate(steps["k"])
    ss = np.concatenate(steps["s"])
    by_depth = {"outcome": auroc_by_depth(sq, sk, ss, np.array(steps["y"])),
                "mean_logprob": auroc_by_depth(sq, sk, np.concatenate(steps["lp"]), np.array(steps["y"]))}
    if has_prefix:
        by_depth["prefix"] = auroc_by_depth(sq, sk, ss, np.concatenate(steps["prefix"]))
    if mc is not None:
        by_depth["mc"] = auroc_by_depth(sq, sk, ss, np.concatenate(steps["mc"]))
    return {
        "scorer": scorer_path, "harvest": harvest, "kind": scorer.kind, "features": scorer.features,
        "traces": int(len(y)), "questions": int(len(set(qs))), "questions_with_both_outcomes": int(n_q),
        "accuracy": float(y.mean()),
        "trace_auroc_pooled": float(auroc(y, s)), "trace_auroc_within_question": float(wq),
        "mean_logprob_auroc_pooled": float(auroc(y, b)), "mean_logprob_auroc_within_question": float(wq_b),
        "by_depth": by_depth,
    }


@dataclass
class EvaluateConfig:
    """One held-out evaluation."""

    scorer: str
    """A checkpoint: gambit-train's ckpt.pt or a reference STEP/Gambit .pt."""
    harvest: str
    """A harvest directory of held-out questions."""
    out: str | None = None
    """Also write the JSON report here."""


def main(argv: list[str] | None = None) -> None:
    from gambit_core.cli import add_dataclass_args, input_errors

    p = argparse.ArgumentParser(prog="python -m gambit_scorer.evaluate",
                                description=__doc__.split("\n\n")[0])
    add_dataclass_args(p, EvaluateConfig, required=("scorer", "harvest"))
    cfg = EvaluateConfig(**vars(p.parse_args(argv)))
    with input_errors(p.prog):
        r = evaluate_scorer(cfg.scorer, cfg.harvest)
    if cfg.out:
        with open(cfg.out, "w") as f:
            json.dump(r, f, indent=2)
    print(json.dumps(r, indent=2))


if __name__ == "__main__":
    main()
