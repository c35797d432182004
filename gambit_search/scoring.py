"""Scoring at run time: turn boundary hidden states into trace scores, batched.

The scorer sees exactly the features its checkpoint was trained on (``LoadedScorer.features``:
the hidden state, or hidden + the thought's mean/min sampled-token log-prob), and reads out
what training optimised. What a trace's state is and how a batch of them is scored is the
scorer kind's (``gambit_scorer.kinds``, ``LoadedScorer.scorer_kind``): this module asks it
for a fresh state (``new_state``), a branch's copy of its parent's (``fork``) and one
batched step (``step``):

* MLP (STEP): step probability sigmoid(mlp(x)); trace score = running mean of a trace's
  step probabilities.
* SeqScorer: the last position's probability over the trace's whole step history, computed
  incrementally from a per-trace attention cache. A branch starts from its parent's cache
  (states are immutable, so sharing costs nothing).

:meth:`RuntimeScorer.score` takes every boundary of one engine step, for all traces of all
questions, and runs one forward per step (the Seq scorer too: caches of different lengths
are padded and masked in ``SeqScorer.step_batch``).

    rs = RuntimeScorer(load_scorer("checkpoints/toy-scorer-seq/ckpt.pt"))
    rs.add(key=7)                      # a fresh trace
    rs.add(key=9, parent=7)            # a branch: shares 7's history
    scores = rs.score([(7, hidden, output_index)], logprobs={7: engine.sampled_logprobs(t)})
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import numpy as np

__all__ = ["RuntimeScorer", "thought_confidence"]


def thought_confidence(logprobs: np.ndarray, start: int, end: int) -> tuple[float, float]:
    """Mean and min sampled-token log-prob of output tokens ``start..end`` (inclusive: a
    thought up to and including its boundary token), NaN values left out (NaN when none)."""
    seg = np.asarray(logprobs[start : end + 1], dtype=np.float64)
    seg = seg[~np.isnan(seg)]
    if not len(seg):
        return math.nan, math.nan
    return float(seg.mean()), float(seg.min())


class RuntimeScorer:
    """Per-trace scorer states keyed by any hashable (the driver uses engine trace ids)."""

    def __init__(self, scorer: Any, threads: int | None = 1) -> None:
        """``threads``: torch intra-op threads of this process (None: leave as is). One is
        right for these tiny forwards: beside a busy engine, torch's default thread pool
        made a toy step's forward ~20x slower on 2 CPU cores (87 ms vs 4.5 ms measured)."""
        if threads is not None:
            import torch

            torch.set_num_threads(threads)
        self.scorer = scorer
        self.kind: str = scorer.kind
        self._kind = scorer.scorer_kind
        self.needs_confidence: bool = scorer.needs_confidence
        self._hist: dict[Hashable, Any] = {}
        self._thought_start: dict[Hashable, int] = {}
        self.forwards = 0
        """Batched forwards run (one per engine step with boundaries, more when a trace had
        several boundaries in one step)."""

    def add(self, key: Hashable, parent: Hashable | None = None) -> None:
        """Start ``key``'s state: fresh, or a copy of ``parent``'s (a branch)."""
        self._hist[key] = (self._kind.new_state() if parent is None
                           else self._kind.fork(self._hist[parent]))
        self._thought_start[key] = 0

    def drop(self, key: Hashable) -> None:
        """Forget ``key`` (its trace ended)."""
        self._hist.pop(key, None)
        self._thought_start.pop(key, None)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._hist

    def __len__(self) -> int:
        return len(self._hist)

    def score(self, items: Sequence[tuple[Hashable, np.ndarray, int]],
              logprobs: Mapping[Hashable, np.ndarray] | None = None) -> list[float]:
        """Append one step per item ``(key, hidden, output_index)`` and return each item's new
        trace score, in order. A key may appear several times (in increasing output index):
        its steps are applied in order. ``logprobs[key]``: the trace's sampled-token
        log-probs (needed when the scorer takes confidence features)."""
        out: list[float] = [math.nan] * len(items)
        pending = list(range(len(items)))
        while pending:  # waves: at most one step per key per forward
            seen: set[Hashable] = set()
            wave, later = [], []
            for i in pending:
                (later if items[i][0] in seen else wave).append(i)
                seen.add(items[i][0])
            self._forward([items[i] for i in wave], logprobs, out, wave)
            pending = later
        return out

    def _forward(self, items, logprobs, out, where) -> None:
        import torch

        keys = [k for k, _, _ in items]
        hidden = np.stack([np.asarray(h, dtype=np.float32) for _, h, _ in items])
        cm = cn = None
        if self.needs_confidence:
            if logprobs is None:
                raise ValueError("this scorer takes thought confidences: pass logprobs")
            vals = []
            for k, _, j in items:
                vals.append(thought_confidence(logprobs[k], self._thought_start[k], j))
            cm = np.array([v[0] for v in vals], dtype=np.float32)
            cn = np.array([v[1] for v in vals], dtype=np.float32)
        for k, _, j in items:
            self._thought_start[k] = j + 1
        self.forwards += 1
        with torch.inference_mode():
            x = self.scorer.make_features(hidden, cm, cn)
            new, scores = self._kind.step(self.scorer.model, [self._hist[k] for k in keys], x)
        for k, h, sc, i in zip(keys, new, scores, where, strict=True):
            self._hist[k] = h
            out[i] = float(sc)
