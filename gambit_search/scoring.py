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

:class:`ScoreBook` is the same scoring where the hidden states are (inside the vLLM worker,
on the model's device; in the fake engine), keyed by trace with each scored boundary's
position, so that a branch or a revived trace starts from exactly the prefix its request's
prompt holds, whatever the engine computed for its source since::

    book = ScoreBook(load_scorer(path, device="cuda"))
    book.start(9, 1, src=7, cut=41)    # trace 9's request 1: 7's state over positions < 41
    scores = book.score(traces, positions, hidden)    # NaN for a row already scored
    book.forget([7, 9])
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import numpy as np

__all__ = ["RuntimeScorer", "ScoreBook", "thought_confidence"]


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
        made a toy step's forward over an order of magnitude slower on 2 CPU cores."""
        if threads is not None:
            import torch

            torch.set_num_threads(threads)
        self.scorer = scorer
        self.kind: str = scorer.kind
        self._kind = scorer.scorer_kind
        self.needs_confidence: bool = scorer.needs_confidence
        self._pool = self._kind.pool(scorer.model)
        """The kind's batched cache store (a SeqScorer's :class:`~gambit_scorer.seq_pool.SeqPool`),
        or None: states are immutable values in ``_hist``, stepped by ``kind.step``."""
        self._hist: dict[Hashable, Any] = {}
        self._thought_start: dict[Hashable, int] = {}
        self.forwards = 0
        """Batched forwards run (one per engine step with boundaries, more when a trace had
        several boundaries in one step)."""

    def add(self, key: Hashable, parent: Hashable | None = None) -> None:
        """Start ``key``'s state: fresh, or a copy of ``parent``'s (a branch)."""
        if self._pool is not None:
            self._pool.add(key, src=parent)
        else:
            self._hist[key] = (self._kind.new_state() if parent is None
                               else self._kind.fork(self._hist[parent]))
        self._thought_start[key] = 0

    def drop(self, key: Hashable) -> None:
        """Forget ``key`` (its trace ended)."""
        if self._pool is not None:
            self._pool.drop(key)
        self._hist.pop(key, None)
        self._thought_start.pop(key, None)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._thought_start

    def __len__(self) -> int:
        return len(self._thought_start)

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
        hs = [h for _, h, _ in items]
        if isinstance(hs[0], torch.Tensor):  # rows on the engine's device (a ScoreBook's)
            hidden = torch.stack(hs).float()
        else:
            hidden = np.stack([np.asarray(h, dtype=np.float32) for h in hs])
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
            if self._pool is not None:
                scores = self._pool.step(keys, x)
            else:
                new, scores = self._kind.step(self.scorer.model, [self._hist[k] for k in keys], x)
                for k, h in zip(keys, new, strict=True):
                    self._hist[k] = h
        for sc, i in zip(scores, where, strict=True):
            out[i] = float(sc)


class ScoreBook:
    """Per-trace scorer states by trace id, for scoring inside an engine (see the module
    docstring). Only scorers on the hidden state alone: the thought confidences need the
    sampled tokens' log-probs, which the driver has and the worker does not."""

    def __init__(self, scorer: Any) -> None:
        if scorer.needs_confidence:
            raise ValueError("a scorer with confidence features scores in the driver, not in "
                             "the engine")
        self._rs = RuntimeScorer(scorer, threads=None)
        self._kind = scorer.scorer_kind
        # whether a state can be cut back to a prefix (else one state per step is kept)
        self._pooled = self._rs._pool is not None
        self._cuttable = (self._pooled
                          or self._kind.prefix(self._kind.new_state(), 0, None) is not None)
        self._pos: dict[int, list[int]] = {}  # trace -> positions of its scored boundaries
        self._scores: dict[int, list[float]] = {}  # trace -> its score after each (not pooled)
        self._snaps: dict[int, list[Any]] = {}  # trace -> its state after each (not cuttable)
        self._req: dict[int, int] = {}  # trace -> the incarnation its state is for
        self.rows_scored = 0
        """Boundary rows scored so far."""

    def __len__(self) -> int:
        return len(self._pos)

    def current(self, trace: int) -> int | None:
        """The incarnation ``trace``'s state was last started for (None: unknown trace)."""
        return self._req.get(trace)

    def start(self, trace: int, incarnation: int, src: int | None = None,
              cut: int | None = None) -> None:
        """A request of ``trace`` begins: fresh (no ``src``), or from ``src``'s state over its
        boundaries at positions < ``cut`` (a branch: ``src`` is the parent; a revive: ``src``
        is ``trace`` itself, cut to the tokens the driver kept). An unknown ``src`` (already
        forgotten) starts fresh."""
        self._req[trace] = incarnation
        rs, kind = self._rs, self._kind
        if self._pooled:
            if src is None or src not in self._pos:
                rs._pool.add(trace)
                self._pos[trace] = []
            else:  # the pool cuts states itself: no per-boundary scores or snapshots kept
                k = len(self._pos[src]) if cut is None else bisect_left(self._pos[src], cut)
                rs._pool.add(trace, src=src, k=k)
                self._pos[trace] = self._pos[src][:k]
            rs._thought_start[trace] = 0
            return
        if src is None or src not in self._pos:
            state, pos, scores, snaps = kind.new_state(), [], [], []
        else:
            pos, scores = self._pos[src], self._scores[src]
            k = len(pos) if cut is None else bisect_left(pos, cut)
            state = rs._hist[src]
            if k < len(pos):
                cut_state = kind.prefix(state, k, scores[k - 1] if k else None)
                if cut_state is None:
                    cut_state = self._snaps[src][k - 1] if k else kind.new_state()
                state = cut_state
            pos, scores = pos[:k], scores[:k]
            snaps = self._snaps.get(src, [])[:k]
        rs._hist[trace] = kind.fork(state)
        rs._thought_start[trace] = 0
        self._pos[trace], self._scores[trace] = pos, scores
        if not self._cuttable:
            self._snaps[trace] = snaps

    @property
    def pooled(self) -> bool:
        """Whether the states live in the kind's pool (then :meth:`score` can answer with a
        tensor on the scorer's device, not waited for: ``on_device=True``)."""
        return self._pooled

    def score(self, traces: Sequence[int], positions: Sequence[int],
              hidden: Any, on_device: bool = False) -> Any:
        """Score one step's boundary rows (row i: ``traces[i]`` at ``positions[i]``, state
        ``hidden[i]``; positions increasing per trace) in one batched forward per wave. Each
        row's new trace score, NaN for a row at or before the trace's last scored position
        (a recomputed prefill row). A trace never started starts fresh. ``on_device`` (a
        pooled kind only): a float32 tensor on the scorer's device, whose values the caller
        reads when it likes (no wait here); else float64 numpy."""
        if on_device and not self._pooled:
            raise ValueError("on_device scores need a pooled scorer kind")
        out = np.full(len(traces), np.nan)
        items, where = [], []
        last: dict[int, int] = {}
        for i, (t, p) in enumerate(zip(traces, positions, strict=True)):
            if t not in self._pos:
                self.start(t, 0)
            prev = last.get(t)
            if prev is None:
                prev = self._pos[t][-1] if self._pos[t] else -1
            if p <= prev:
                continue
            last[t] = p
            items.append((t, hidden[i], p))
            where.append(i)
        if on_device:
            return self._score_on_device(items, where, len(traces))
        if not items:
            return out
        pending = list(range(len(items)))
        while pending:  # waves: one step per trace per forward, so each step's state is known
            seen: set[int] = set()
            wave, later = [], []
            for k in pending:
                (later if items[k][0] in seen else wave).append(k)
                seen.add(items[k][0])
            scores = self._rs.score([items[k] for k in wave])
            for k, sc in zip(wave, scores, strict=True):
                t, _, p = items[k]
                out[where[k]] = sc
                self._pos[t].append(p)
                if not self._pooled:  # what kind.prefix needs to cut a state back
                    self._scores[t].append(sc)
                if not self._cuttable:
                    self._snaps[t].append(self._rs._hist[t])
            pending = later
        self.rows_scored += len(items)
        return out

    def _score_on_device(self, items: list, where: list[int], n: int) -> Any:
        """:meth:`score` of a pooled kind, answered on the scorer's device."""
        import torch

        rs = self._rs
        dev = rs.scorer.device
        out = torch.full((n,), float("nan"), device=dev)
        pending = list(range(len(items)))
        with torch.inference_mode():
            while pending:  # waves, as in score
                seen: set[int] = set()
                wave, later = [], []
                for k in pending:
                    (later if items[k][0] in seen else wave).append(k)
                    seen.add(items[k][0])
                keys = [items[k][0] for k in wave]
                hidden = torch.stack([torch.as_tensor(items[k][1]) for k in wave]).float()
                probs = rs._pool.step(keys, rs.scorer.make_features(hidden), to_host=False)
                out[torch.as_tensor([where[k] for k in wave], device=dev)] = probs
                for k in wave:
                    self._pos[items[k][0]].append(items[k][2])
                rs.forwards += 1
                pending = later
        self.rows_scored += len(items)
        return out

    def forget(self, traces: Sequence[int]) -> None:
        """Drop ``traces``' states (they ended for good: no branch or revive will follow)."""
        for t in traces:
            self._rs.drop(t)
            self._pos.pop(t, None)
            self._scores.pop(t, None)
            self._snaps.pop(t, None)
            self._req.pop(t, None)
