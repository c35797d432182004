"""The harvests a scorer trains on, indexed: one pass over the small columns counts, checks and
splits the traces (by question); the hidden states are read afterwards, into memory
(:func:`load_states`) or streamed by :mod:`gambit_scorer.data`.

    from gambit_scorer.harvest_index import scan_harvests, split_by_question
    ix = scan_harvests(["harvests/toy-train-2000"])
    val = split_by_question(ix.qidx, ix.label, val_fraction=0.1, seed=0)   # a mask
    ix.step_label = load_step_labels(ix, "prefix")   # per-boundary labels (data.labels), -1: none
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from gambit_scorer.harvest_io import (
    HarvestError,
    decode_states,
    iter_batches,
    list_column,
    read_manifest,
    read_mc_labels,
    shard_paths,
)

SCAN_COLUMNS = ("question_id", "trace_index", "correct", "conf_mean", "conf_min")
STATE_COLUMNS = ("question_id", "trace_index", "hidden_states")
LABEL_KINDS = ("outcome", "prefix", "mc")
"""``data.labels``: what a scorer learns to predict at a boundary (docs/SCORER.md)."""


# ----------------------------------------------------------------------------- scan + split


@dataclass
class HarvestIndex:
    """Everything about a set of harvests except the hidden states (one entry per trace)."""

    dirs: list[Path]
    manifests: list[dict]
    hidden_size: int
    questions: list[str]
    """Distinct question ids; ``qidx`` indexes this."""
    qidx: np.ndarray
    label: np.ndarray
    """bool: the trace's final answer is correct."""
    n_steps: np.ndarray
    offsets: np.ndarray
    """Trace t's steps are rows offsets[t]:offsets[t+1] of ``conf`` (and of the states)."""
    conf: np.ndarray
    """float32 [total_steps, 2]: conf_mean, conf_min."""
    key: dict[tuple[int, str, int], int] = field(repr=False)
    """(dir index, question_id, trace_index) -> trace id."""
    step_label: np.ndarray | None = field(default=None, repr=False)
    """int8 [total_steps], rows as ``conf``: a per-boundary label (1/0, -1: this boundary has
    none) when training on process labels (:func:`load_step_labels`); None: the trace's outcome."""

    @property
    def n_traces(self) -> int:
        return len(self.label)

    @property
    def state_bytes(self) -> int:
        return int(self.offsets[-1]) * self.hidden_size * 2


def resolve_harvest_dirs(spec: str | Path | Sequence[str | Path] | None) -> list[Path]:
    if spec is None or spec == "" or (isinstance(spec, str) and spec == "???"):
        raise HarvestError(
            "no harvest given: pass data.harvest=<harvest dir> (or a list: data.harvest=[dir1,dir2])"
        )
    if isinstance(spec, (str, Path)):
        return [Path(spec)]
    return [Path(s) for s in spec]


def scan_harvests(dirs: Sequence[str | Path], read_batch_size: int = 1024) -> HarvestIndex:
    """Read manifests and the small columns; check the data is usable for training."""
    dirs = [Path(d) for d in dirs]
    manifests = [read_manifest(d) for d in dirs]
    sizes = {int(m["hidden_size"]) for m in manifests}
    if len(sizes) > 1:
        desc = ", ".join(
            f"{d} -> {m['hidden_size']} ({m.get('model')})"
            for d, m in zip(dirs, manifests, strict=True)
        )
        raise HarvestError(
            f"mixed hidden sizes across harvests ({desc}): a scorer reads one policy model's hidden states; "
            "pass only harvests of one model in data.harvest"
        )
    hidden_size = sizes.pop()
    if len({m.get("model_hash") for m in manifests}) > 1:
        warnings.warn(
            f"harvests {[str(d) for d in dirs]} come from different policy models (model_hash differs): "
            "a scorer is meant for the model whose hidden states it reads",
            stacklevel=2,
        )
    qid_to_idx: dict[str, int] = {}
    qidx, label, n_steps, confs = [], [], [], []
    key: dict[tuple[int, str, int], int] = {}
    for di, d in enumerate(dirs):
        if not shard_paths(d):
            raise HarvestError(
                f"harvest {str(d)!r} has no data/shard-*.parquet files: the harvest is empty or unfinished"
            )
        for batch in iter_batches(d, SCAN_COLUMNS, read_batch_size):
            qids = batch.column("question_id").to_pylist()
            tix = batch.column("trace_index").to_pylist()
            cor = batch.column("correct").to_pylist()
            cmean = list_column(batch.column("conf_mean"), np.float32)
            cmin = list_column(batch.column("conf_min"), np.float32)
            for q, t, c, a, b in zip(qids, tix, cor, cmean, cmin, strict=True):
                if len(a) != len(b):
                    raise HarvestError(
                        f"{d}: trace {q}/{t} has {len(a)} conf_mean but {len(b)} conf_min values"
                    )
                k = (di, q, int(t))
                if k in key:
                    raise HarvestError(
                        f"{d}: trace (question_id={q!r}, trace_index={t}) appears twice"
                    )
                key[k] = len(label)
                qidx.append(qid_to_idx.setdefault(q, len(qid_to_idx)))
                label.append(bool(c))
                n_steps.append(len(a))
                confs.append(np.stack([a, b], axis=1) if len(a) else np.zeros((0, 2), np.float32))
    names = ", ".join(map(str, dirs))
    if not label:
        raise HarvestError(
            f"harvest {names} holds no traces: run the harvest (or point data.harvest at a finished one)"
        )
    n_steps_a = np.asarray(n_steps, dtype=np.int64)
    label_a = np.asarray(label, dtype=bool)
    has = n_steps_a > 0
    if not has.any():
        raise HarvestError(
            f"no trace in {names} has a thought boundary: check the manifest's boundary_token_ids "
            "(the policy model must emit them, or harvest with fixed-interval boundaries)"
        )
    n_pos = int(label_a[has].sum())
    if n_pos in (0, int(has.sum())):
        which = "correct" if n_pos else "incorrect"
        raise HarvestError(
            f"all {int(has.sum())} traces in {names} are {which}: a scorer needs both outcomes; harvest "
            "more or harder/easier questions, or more samples per question (higher temperature)"
        )
    offsets = np.zeros(len(label) + 1, dtype=np.int64)
    np.cumsum(n_steps_a, out=offsets[1:])
    return HarvestIndex(
        dirs=dirs,
        manifests=manifests,
        hidden_size=hidden_size,
        questions=list(qid_to_idx),
        qidx=np.asarray(qidx, dtype=np.int64),
        label=label_a,
        n_steps=n_steps_a,
        offsets=offsets,
        conf=np.concatenate(confs, axis=0).astype(np.float32),
        key=key,
    )


def split_by_question(
    qidx: np.ndarray, label: np.ndarray, val_fraction: float, seed: int
) -> np.ndarray:
    """Boolean mask of validation traces: whole questions, stratified by trace label."""
    from sklearn.model_selection import StratifiedGroupKFold

    if not 0 < val_fraction < 1:
        raise ValueError(f"data.val_fraction must be in (0, 1), got {val_fraction}")
    n_q = len(np.unique(qidx))
    if n_q < 2:
        raise HarvestError(
            f"the harvest has {n_q} question: splitting by question needs at least 2 (harvest more questions)"
        )
    k = min(max(2, round(1 / val_fraction)), n_q)
    cv = StratifiedGroupKFold(n_splits=k, shuffle=True, random_state=seed)
    y = label.astype(int)
    for _, val_idx in cv.split(np.zeros(len(y)), y, groups=qidx):
        val = np.zeros(len(y), dtype=bool)
        val[val_idx] = True
        if 0 < y[val].sum() < val.sum() and 0 < y[~val].sum() < (~val).sum():
            return val
    raise HarvestError(
        "no split by question leaves both outcomes on both sides: too few questions with correct "
        "(or incorrect) traces; harvest more questions"
    )


def _checked_states(ix: HarvestIndex, tid: int, blob: bytes) -> np.ndarray:
    states = decode_states(blob, ix.hidden_size)
    if len(states) != ix.n_steps[tid]:
        raise HarvestError(
            f"trace {tid} ({ix.questions[ix.qidx[tid]]}) has {len(states)} hidden-state rows of size "
            f"{ix.hidden_size} but {ix.n_steps[tid]} boundaries: its states were written with another "
            "hidden size than the manifest's, or the shard is corrupt; re-run the harvest"
        )
    return states


def load_states(index: HarvestIndex, read_batch_size: int = 256) -> np.ndarray:
    """All boundary states in memory: float16 [total_steps, hidden_size], rows by ``index.offsets``."""
    out = np.zeros((int(index.offsets[-1]), index.hidden_size), np.float16)
    for di, d in enumerate(index.dirs):
        for batch in iter_batches(d, STATE_COLUMNS, read_batch_size):
            qids = batch.column("question_id").to_pylist()
            tix = batch.column("trace_index").to_pylist()
            blobs = batch.column("hidden_states")
            for i, (q, t) in enumerate(zip(qids, tix, strict=True)):
                tid = index.key[(di, q, int(t))]
                if index.n_steps[tid]:
                    out[index.offsets[tid] : index.offsets[tid + 1]] = _checked_states(
                        index, tid, blobs[i].as_py()
                    )
    return out


def load_step_labels(index: HarvestIndex, labels: str, read_batch_size: int = 1024) -> np.ndarray | None:
    """Per-boundary labels of every trace of ``index`` (int8, rows by ``index.offsets``; -1 where
    a boundary has none), or None for ``labels='outcome'``. ``prefix``: the ``prefix_labels``
    column (toy harvests); ``mc``: the harvest's ``mc/`` shards. A harvest that lacks them:
    :class:`HarvestError` saying how to get them."""
    if labels not in LABEL_KINDS:
        raise HarvestError(f"data.labels={labels!r}: choose one of {'|'.join(LABEL_KINDS)}")
    if labels == "outcome":
        return None
    out = np.full(int(index.offsets[-1]), -1, np.int8)
    for di, d in enumerate(index.dirs):
        missing, seen = 0, 0
        mc = read_mc_labels(d) if labels == "mc" else None
        for batch in iter_batches(d, ("question_id", "trace_index", "prefix_labels"), read_batch_size):
            qids = batch.column("question_id").to_pylist()
            tix = batch.column("trace_index").to_pylist()
            pref = batch.column("prefix_labels").to_pylist()
            for q, t, p in zip(qids, tix, pref, strict=True):
                seen += 1
                tid = index.key[(di, q, int(t))]
                lab = p if mc is None else (mc[(q, int(t))][0] if (q, int(t)) in mc else None)
                if lab is None:
                    missing += 1
                    continue
                a, b = index.offsets[tid], index.offsets[tid + 1]
                if len(lab) != b - a:
                    raise HarvestError(f"{d}: trace {q}/{t} has {len(lab)} {labels} labels for {b - a} boundaries: "
                                       "re-run the harvest")
                out[a:b] = lab
        if missing:
            how = ("gambit-harvest writes prefix labels for toy questions only; re-harvest them with a current "
                   "gambit-harvest" if labels == "prefix" else "rerun gambit-harvest on it with --mc-labels K")
            raise HarvestError(f"harvest {str(d)!r} has no {labels} labels for {missing} of its {seen} traces: {how}")
    have = out[out >= 0]
    if not (have == 0).any() or not (have == 1).any():
        raise HarvestError(f"every {labels} label in {', '.join(map(str, index.dirs))} is "
                           f"{int(have[0]) if len(have) else 'missing'}: a scorer needs both classes")
    return out
