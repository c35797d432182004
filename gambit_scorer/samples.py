"""A scorer kind's training samples: one per step (the MLP) or one per trace (the sequence
scorer), as map-style datasets and as batches streamed from parquet chunks.

    from gambit_scorer.samples import StepDataset, TraceDataset
    ds = TraceDataset(index, states, traces, featurize, max_len)

The kinds (:mod:`gambit_scorer.kinds`) pick one; :mod:`gambit_scorer.data` loads the
harvest and builds the loaders.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from gambit_scorer.models import step_features


def _rows_of(index: Any, traces: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(state row, trace id, 1-based step index) for every step of ``traces``."""
    n = index.n_steps[traces]
    rows = (
        np.concatenate([np.arange(index.offsets[t], index.offsets[t + 1]) for t in traces])
        if len(traces)
        else np.zeros(0, np.int64)
    )
    tr = np.repeat(traces, n)
    step = rows - np.repeat(index.offsets[traces], n) + 1
    return rows.astype(np.int64), tr.astype(np.int64), step.astype(np.int64)


class _Featurizer:
    def __init__(self, features: tuple[str, ...], conf_norm: dict | None):
        self.features, self.conf_norm = features, conf_norm

    def __call__(self, states: np.ndarray, conf: np.ndarray) -> torch.Tensor:
        return step_features(
            torch.from_numpy(np.asarray(states, dtype=np.float32)),
            torch.from_numpy(conf[..., 0].copy()),
            torch.from_numpy(conf[..., 1].copy()),
            features=self.features,
            conf_norm=self.conf_norm,
        )


def _step_labels(index: Any, a: int, b: int) -> np.ndarray | None:
    """The per-boundary labels of state rows a:b (None when training on outcomes)."""
    sl = getattr(index, "step_label", None)
    return None if sl is None else sl[a:b]


def _seq_batch(items, featurize: _Featurizer, max_len: int) -> dict[str, torch.Tensor]:
    """items: (states [n, d], conf [n, 2], label, trace id, question, first step index, per-step
    labels [n] or None) -> padded batch (+ ``y_step`` [B, T] and ``y_step_mask`` with step labels)."""
    items = [
        (s[-max_len:], c[-max_len:], y, t, q, step0 + max(0, len(s) - max_len),
         None if ys is None else ys[-max_len:])
        for s, c, y, t, q, step0, ys in items
    ]
    T = max(len(s) for s, *_ in items)
    B = len(items)
    d = items[0][0].shape[1]
    states = np.zeros((B, T, d), np.float32)
    conf = np.zeros((B, T, 2), np.float32)
    mask = np.zeros((B, T), bool)
    step = np.zeros((B, T), np.int64)
    for i, (s, c, _, _, _, s0, _) in enumerate(items):
        n = len(s)
        states[i, :n], conf[i, :n], mask[i, :n] = s, c, True
        step[i, :n] = np.arange(s0, s0 + n)
    x = featurize(states, conf)
    m = torch.from_numpy(mask)
    x[~m] = 0.0
    extra = {}
    if items[0][6] is not None:
        ys = np.full((B, T), -1, np.int8)
        for i, it in enumerate(items):
            ys[i, : len(it[6])] = it[6]
        extra = {"y_step": torch.from_numpy(np.maximum(ys, 0).astype(np.float32)),
                 "y_step_mask": torch.from_numpy(ys >= 0) & m}
    return extra | {
        "x": x,
        "mask": m,
        "lengths": m.sum(1),
        "step": torch.from_numpy(step),
        "y": torch.tensor([float(it[2]) for it in items]),
        "trace": torch.tensor([it[3] for it in items], dtype=torch.long),
        "q": torch.tensor([it[4] for it in items], dtype=torch.long),
    }


def _step_batch(index: Any, featurize: _Featurizer, S, C, T, K) -> dict[str, torch.Tensor]:
    """Step samples -> a batch: states S [n, d], conf C [n, 2], trace ids T [n], 1-based steps K [n]
    (+ ``y_step`` and ``y_step_mask`` when the index has per-boundary labels)."""
    extra = {}
    if getattr(index, "step_label", None) is not None:
        ys = index.step_label[index.offsets[T] + K - 1]
        extra = {"y_step": torch.from_numpy(np.maximum(ys, 0).astype(np.float32)),
                 "y_step_mask": torch.from_numpy(ys >= 0)}
    return extra | {
        "x": featurize(S, C),
        "y": torch.from_numpy(index.label[T].astype(np.float32)),
        "trace": torch.from_numpy(T.astype(np.int64)),
        "q": torch.from_numpy(index.qidx[T]),
        "step": torch.from_numpy(K.astype(np.int64)),
    }


def _identity(batch):
    return batch


class StepDataset(Dataset):
    """MLP samples in memory: one per boundary state. Fetches whole batches (``__getitems__``)."""

    def __init__(
        self, index: Any, states: np.ndarray, traces: np.ndarray, featurize: _Featurizer
    ):
        self.index, self.states, self.featurize = index, states, featurize
        self.rows, self.trace, self.step = _rows_of(index, traces)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitems__(self, idx: list[int]) -> dict[str, torch.Tensor]:
        idx = np.asarray(idx)
        rows = self.rows[idx]
        ix = self.index
        S, C = self.states[rows], ix.conf[rows]
        return _step_batch(ix, self.featurize, S, C, self.trace[idx], self.step[idx])

    def __getitem__(self, i: int):
        return self.__getitems__([i])


class TraceDataset(Dataset):
    """Seq samples in memory: one per trace, padded per batch."""

    def __init__(self, index, states, traces, featurize, max_len):
        self.index, self.states, self.featurize, self.max_len = index, states, featurize, max_len
        self.traces = np.asarray(traces, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.traces)

    def __getitems__(self, idx: list[int]) -> dict[str, torch.Tensor]:
        ix = self.index
        items = []
        for t in self.traces[np.asarray(idx)]:
            a, b = ix.offsets[t], ix.offsets[t + 1]
            items.append((self.states[a:b], ix.conf[a:b], ix.label[t], int(t), int(ix.qidx[t]), 1,
                          _step_labels(ix, a, b)))
        return _seq_batch(items, self.featurize, self.max_len)

    def __getitem__(self, i: int):
        return self.__getitems__([i])


def stream_step_batches(ds: Any, chunks: Iterable[list], rng, tail: bool):
    """MLP batches from chunks of streamed traces: a chunk's steps (and the previous chunk's
    remainder) shuffled, cut into batches; ``tail``: also the last partial batch."""
    ix, bs = ds.index, ds.batch_size
    carry: tuple | list = []
    for chunk in chunks:
        parts = []
        for tid, states in chunk:
            a, b = ix.offsets[tid], ix.offsets[tid + 1]
            n = b - a
            parts.append((states, ix.conf[a:b], np.full(n, tid), np.arange(1, n + 1)))
        if carry:
            parts.insert(0, carry)
        S, C, T, K = (np.concatenate([p[j] for p in parts]) for j in range(4))
        order = rng.permutation(len(S)) if ds.shuffle else np.arange(len(S))
        n_full = len(S) // bs
        for i in range(n_full):
            sel = order[i * bs : (i + 1) * bs]
            yield _step_batch(ix, ds.featurize, S[sel], C[sel], T[sel], K[sel])
        rest = order[n_full * bs :]
        carry = (S[rest], C[rest], T[rest], K[rest]) if len(rest) else []
    if carry and tail:
        yield _step_batch(ix, ds.featurize, *carry)


def stream_trace_batches(ds: Any, chunks: Iterable[list], rng, tail: bool):
    """Seq batches from chunks of streamed traces: a chunk's traces (and the previous chunk's
    remainder) shuffled, cut into padded batches; ``tail``: also the last partial batch."""
    ix, bs = ds.index, ds.batch_size
    carry: list = []
    for chunk in chunks:
        items = [
            (s, ix.conf[ix.offsets[t] : ix.offsets[t + 1]], ix.label[t], t, int(ix.qidx[t]), 1,
             _step_labels(ix, ix.offsets[t], ix.offsets[t + 1]))
            for t, s in chunk
        ]
        items = carry + items
        if ds.shuffle:
            items = [items[i] for i in rng.permutation(len(items))]
        n_full = len(items) // bs
        for i in range(n_full):
            yield _seq_batch(items[i * bs : (i + 1) * bs], ds.featurize, ds.max_len)
        carry = items[n_full * bs :]
    if carry and tail:
        yield _seq_batch(carry, ds.featurize, ds.max_len)
