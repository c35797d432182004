"""Validation metrics for scorers (scikit-learn), including the ones the search uses.

Input: one record per (trace, step) with the scorer's probability at that step, the
trace's label and its question. The *trace score so far* is what the search ranks by:
the running mean of step probabilities for the MLP, the current position's output for the
sequence scorer. Reported:

- ``step_*``: AUROC / AUPRC / F1 / Brier over all step records (the MLP's training
  samples; for the sequence scorer, every position against the trace label).
- ``trace_*``: the same on the final trace score (one per trace), pooled over questions.
- ``trace_auroc_wq``: within-question AUROC of the final trace score: traces of one
  question ranked against each other, averaged over questions with both outcomes
  (``n_wq_questions``). Pooled AUROC also rewards telling easy from hard questions, which
  does not help a search that only compares traces of one question.
- ``by_step``: per step index k, AUROC of the step probability and of the trace score so
  far (pooled and within question) over traces that reached step k.
- ``selection`` = 0.75 * AUROC + 0.25 * F1 with AUROC = ``trace_auroc_wq`` (falls back to
  pooled ``trace_auroc`` when fewer than ``min_wq_questions`` questions have both outcomes)
  and F1 = ``trace_f1`` at threshold 0.5.

- :func:`auroc_by_depth` (held-out reports, ``gambit_scorer.evaluate``): within-question
  AUROC of the prefix score at each depth (boundary index), traces of one question at one
  depth ranked against each other, averaged over the (question, depth) groups of a depth
  bucket; against the trace's outcome or a per-boundary process label.

AUPRC, F1 and Brier come from scikit-learn; pooled AUROC too. The many small AUROCs
(per question, per step index) use :func:`auroc`, the same statistic from ranks (tested
equal to ``roc_auc_score``), because sklearn's per-call input validation dominated.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from gambit_scorer.scorer_kind import ScorerKind

SELECTION_AUROC_KEYS = ("trace_auroc_wq", "trace_auroc", "step_auroc")
STEP_INDICES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)


def binary_metrics(y: np.ndarray, p: np.ndarray, threshold: float = 0.5) -> dict[str, float]:
    """AUROC, AUPRC (average precision), F1 at ``threshold`` and Brier score. NaN where undefined."""
    from sklearn.metrics import average_precision_score, brier_score_loss, f1_score, roc_auc_score

    y = np.asarray(y).astype(int)
    p = np.asarray(p, dtype=np.float64)
    if len(y) == 0:
        return {"auroc": math.nan, "auprc": math.nan, "f1": math.nan, "brier": math.nan}
    both = 0 < y.sum() < len(y)
    return {
        "auroc": float(roc_auc_score(y, p)) if both else math.nan,
        "auprc": float(average_precision_score(y, p)) if both else math.nan,
        "f1": float(f1_score(y, p >= threshold, zero_division=0.0)),
        "brier": float(brier_score_loss(y, p, pos_label=1))
        if both
        else float(np.mean((p - y) ** 2)),
    }


def auroc(y: np.ndarray, s: np.ndarray) -> float:
    """ROC AUC (ties count half), NaN with one class. Equal to sklearn's ``roc_auc_score``
    (tested), computed from ranks so the many small per-question calls stay cheap."""
    y = np.asarray(y).astype(bool)
    s = np.asarray(s, dtype=np.float64)
    n1 = int(y.sum())
    n0 = len(y) - n1
    if n1 == 0 or n0 == 0:
        return math.nan
    ranks = np.empty(len(s))
    ranks[np.argsort(s, kind="mergesort")] = np.arange(1, len(s) + 1)
    _, inv, counts = np.unique(s, return_inverse=True, return_counts=True)
    ranks = (np.bincount(inv, weights=ranks) / counts)[inv]  # average ranks of ties
    return float((ranks[y].sum() - n1 * (n1 + 1) / 2) / (n1 * n0))


def within_question_auroc(question: np.ndarray, y: np.ndarray, s: np.ndarray) -> tuple[float, int]:
    """Mean over questions with both outcomes of the AUROC among that question's traces -> (mean, n)."""
    question, y, s = (
        np.asarray(question),
        np.asarray(y).astype(int),
        np.asarray(s, dtype=np.float64),
    )
    vals = []
    order = np.argsort(question, kind="stable")
    qs, starts = np.unique(question[order], return_index=True)
    bounds = list(starts[1:]) + [len(order)]
    for a, b in zip(starts, bounds, strict=True):
        idx = order[a:b]
        if 0 < y[idx].sum() < len(idx):
            vals.append(auroc(y[idx], s[idx]))
    return (float(np.mean(vals)) if vals else math.nan), len(vals)


DEPTH_BUCKETS: tuple[tuple[int, int | None], ...] = (
    (1, 2), (3, 4), (5, 6), (7, 8), (9, 12), (13, 16), (17, None))
"""Boundary-index buckets (1-based, inclusive; None: no upper end) of :func:`auroc_by_depth`."""


def bucket_name(lo: int, hi: int | None) -> str:
    return f"{lo}+" if hi is None else (str(lo) if lo == hi else f"{lo}-{hi}")


def auroc_by_depth(
    question: np.ndarray,
    depth: np.ndarray,
    score: np.ndarray,
    label: np.ndarray,
    buckets: tuple[tuple[int, int | None], ...] = DEPTH_BUCKETS,
) -> dict[str, dict]:
    """Per depth bucket: the mean over (question, depth) groups with both labels of the AUROC
    of ``score`` against ``label`` among that group's records (one per trace that reached
    that depth), with the number of such groups and of records. Records with ``label < 0``
    (a boundary without a process label) are left out. Buckets without a group: absent."""
    question, depth = np.asarray(question), np.asarray(depth, dtype=np.int64)
    score, label = np.asarray(score, dtype=np.float64), np.asarray(label).astype(int)
    keep = label >= 0
    question, depth, score, label = question[keep], depth[keep], score[keep], label[keep]
    _, qi = np.unique(question, return_inverse=True)
    group = qi.astype(np.int64) * (int(depth.max(initial=0)) + 1) + depth
    out = {}
    for lo, hi in buckets:
        at = (depth >= lo) & (depth <= (hi if hi is not None else np.iinfo(np.int64).max))
        if not at.any():
            continue
        wq, n = within_question_auroc(group[at], label[at], score[at])
        if n:
            out[bucket_name(lo, hi)] = {"auroc_wq": wq, "n_groups": n, "n": int(at.sum()),
                                        "pos_rate": float(label[at].mean())}
    return out


def trace_scores_so_far(
    trace: np.ndarray, step: np.ndarray, prob: np.ndarray, kind: str | ScorerKind
) -> np.ndarray:
    """Per record, the trace score after that step (records must be sorted by trace, then step);
    ``kind``: a scorer kind or its name (``scorer_kind.ScorerKind.trace_scores_so_far``)."""
    from gambit_scorer.kinds import get_kind  # torch; this module needs only numpy otherwise

    return get_kind(kind).trace_scores_so_far(np.asarray(trace), prob)


def evaluate(
    trace: np.ndarray,
    question: np.ndarray,
    step: np.ndarray,
    prob: np.ndarray,
    label: np.ndarray,
    kind: str | ScorerKind,
    *,
    selection_auroc: str = "trace_auroc_wq",
    min_wq_questions: int = 3,
    weights: tuple[float, float] = (0.75, 0.25),
    step_indices: tuple[int, ...] = STEP_INDICES,
    min_traces_per_step: int = 10,
) -> dict:
    """All validation metrics from step records (trace id, question id, 1-based step index, prob, label);
    ``kind``: the scorer kind (or its name), which defines the trace score so far."""
    if selection_auroc not in SELECTION_AUROC_KEYS:
        raise ValueError(
            f"selection AUROC {selection_auroc!r}: choose one of {SELECTION_AUROC_KEYS}"
        )
    trace, question, step = np.asarray(trace), np.asarray(question), np.asarray(step)
    prob, label = np.asarray(prob, dtype=np.float64), np.asarray(label).astype(int)
    order = np.lexsort((step, trace))
    trace, question, step, prob, label = (
        trace[order],
        question[order],
        step[order],
        prob[order],
        label[order],
    )
    so_far = trace_scores_so_far(trace, step, prob, kind)

    out: dict = {f"step_{k}": v for k, v in binary_metrics(label, prob).items()}
    last = np.r_[trace[1:] != trace[:-1], True] if len(trace) else np.zeros(0, bool)
    t_y, t_s, t_q = label[last], so_far[last], question[last]
    out.update({f"trace_{k}": v for k, v in binary_metrics(t_y, t_s).items()})
    out["trace_auroc_wq"], out["n_wq_questions"] = within_question_auroc(t_q, t_y, t_s)
    out["n_traces"], out["n_steps"], out["n_questions"] = (
        int(last.sum()),
        len(trace),
        len(np.unique(question)),
    )
    out["pos_rate"] = float(t_y.mean()) if len(t_y) else math.nan

    by_step = {}
    for k in step_indices:
        at = step == k
        if at.sum() < min_traces_per_step or not 0 < label[at].sum() < at.sum():
            continue
        wq, n_wq = within_question_auroc(question[at], label[at], so_far[at])
        by_step[str(k)] = {
            "n": int(at.sum()),
            "auroc_step": auroc(label[at], prob[at]),
            "auroc_so_far": auroc(label[at], so_far[at]),
            "auroc_so_far_wq": wq,
            "n_wq_questions": n_wq,
        }
    out["by_step"] = by_step

    a = out[selection_auroc]
    used = selection_auroc
    if selection_auroc == "trace_auroc_wq" and (
        out["n_wq_questions"] < min_wq_questions or math.isnan(a)
    ):
        a, used = out["trace_auroc"], "trace_auroc"
    if math.isnan(a):
        a = 0.5
    f1 = out["trace_f1"] if not math.isnan(out["trace_f1"]) else 0.0
    out["selection"] = float(weights[0] * a + weights[1] * f1)
    out["selection_auroc"] = used
    return out


def scalar_metrics(m: dict) -> dict[str, float]:
    """The numeric top-level entries (for loggers), a few by-step AUROCs flattened in."""
    out = {
        k: float(v) for k, v in m.items() if isinstance(v, (int, float)) and not isinstance(v, bool)
    }
    for k, row in m.get("by_step", {}).items():
        if k in ("1", "4", "16", "64"):
            out[f"auroc_so_far_step{k}"] = row["auroc_so_far"]
    return out
