"""Training data for scorers: a Lightning DataModule over one or more harvest directories.

- Split by *question* (no question on both sides), stratified by the trace label
  (scikit-learn ``StratifiedGroupKFold``): one fold of round(1 / val_fraction) is validation.
- Samples are the scorer kind's (``scorer_kind.ScorerKind.dataset`` / ``stream_batches`` pick the
  classes and functions here):
  MLP samples: one per boundary state, labelled with the trace's correctness.
  Seq samples: one per trace, its boundary states in order (the last ``max_len``), right-padded
  to the batch's longest with a boolean ``mask``.
- Labels (``labels``): ``outcome`` (every sample is labelled with its trace's final
  correctness, the reference) or per-boundary process labels, ``prefix`` (toy harvests'
  exact "still clean" labels) or ``mc`` (Monte-Carlo labels, ``gambit-harvest --mc-labels``):
  batches then also carry ``y_step`` and ``y_step_mask`` (the boundaries that have a
  label), which the kinds' losses train on (Seq: every labelled position). ``y`` stays the
  outcome: the split's stratification and the validation metrics use it either way.
- Features per step: ``models.step_features`` (hidden state, optionally + standardised
  confidence); ``conf_norm`` and ``pos_weight`` (negatives / positives over the loss's
  units: steps for the MLP, traces for Seq) come from the training split.
- Small harvests are loaded into memory (float16 states); large ones (``streaming: auto``
  and more than ``max_in_memory_gb`` of states, or ``streaming: true``) are streamed from
  parquet a record batch at a time, with a chunk shuffle of ``shuffle_buffer`` samples.
- DDP: training data is split across ranks (a DistributedSampler in memory; trace shards
  when streaming, every rank yielding the same number of batches); every rank validates on
  the whole validation split, so all ranks compute the same metrics without a gather.
  Use it with ``Trainer(use_distributed_sampler=False)`` (``train.py`` does).

A first pass reads only the small columns (question_id, trace_index, correct, conf_*) to
count, check and split; hidden states are read afterwards, once (memory) or each epoch (stream).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence

import lightning as L
import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset

from gambit_scorer.harvest_index import (
    STATE_COLUMNS,
    HarvestIndex,
    _checked_states,
    load_states,
    load_step_labels,
    resolve_harvest_dirs,
    scan_harvests,
    split_by_question,
)
from gambit_scorer.harvest_io import (
    HarvestError,
    shard_paths,
)
from gambit_scorer.kinds import get_kind
from gambit_scorer.models import feature_size, resolve_features
from gambit_scorer.samples import _Featurizer, _identity, _rows_of
from gambit_scorer.scorer_kind import ScorerKind

# ----------------------------------------------------------------------------- samples


class StreamingDataset(IterableDataset):
    """Samples streamed from parquet, already batched (by the kind's ``stream_batches``).
    Trace t belongs to shard t % n_shards (shards = ranks x workers); each shard yields at
    most ``n_batches`` batches (equal across ranks, so DDP steps stay in lockstep)."""

    def __init__(
        self,
        index: HarvestIndex,
        traces: np.ndarray,
        kind: str | ScorerKind,
        featurize: _Featurizer,
        batch_size: int,
        *,
        shuffle: bool,
        shuffle_buffer: int,
        seed: int,
        rank: int = 0,
        world_size: int = 1,
        n_batches: int | None = None,
        read_batch_size: int = 256,
        max_len: int = 4096,
    ):
        self.scorer_kind = get_kind(kind)
        self.index, self.kind = index, self.scorer_kind.name
        self.featurize, self.batch_size = featurize, batch_size
        self.member = np.zeros(index.n_traces, bool)
        self.member[np.asarray(traces, dtype=np.int64)] = True
        self.shuffle, self.buffer, self.seed = shuffle, shuffle_buffer, seed
        self.rank, self.world_size, self.n_batches = rank, world_size, n_batches
        self.read_batch_size, self.max_len = read_batch_size, max_len
        self.epoch = 0
        self.n_units = int(self.scorer_kind.units(index.n_steps[self.member]).sum())

    def __len__(self) -> int:
        """Batches per epoch over all workers (lets the progress bar and LR schedule know)."""
        if self.n_batches is not None:
            return self.n_batches
        return -(-self.n_units // self.batch_size)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _traces(self, shard: int, n_shards: int, rng) -> Iterator[tuple[int, np.ndarray]]:
        ix = self.index
        for di, d in enumerate(ix.dirs):
            files = shard_paths(d)
            if self.shuffle:
                files = [files[i] for i in rng.permutation(len(files))]
            for f in files:
                import pyarrow.parquet as pq

                pf = pq.ParquetFile(f)
                for batch in pf.iter_batches(
                    batch_size=self.read_batch_size, columns=list(STATE_COLUMNS)
                ):
                    qids = batch.column("question_id").to_pylist()
                    tix = batch.column("trace_index").to_pylist()
                    blobs = batch.column("hidden_states")
                    for i, (q, t) in enumerate(zip(qids, tix, strict=True)):
                        tid = ix.key[(di, q, int(t))]
                        if not self.member[tid] or tid % n_shards != shard or ix.n_steps[tid] == 0:
                            continue
                        yield tid, _checked_states(ix, tid, blobs[i].as_py())

    def _samples(self, shard, n_shards, rng):
        """Chunks of (trace id, states) holding about ``shuffle_buffer`` of the kind's samples."""
        pending, size = [], 0
        for tid, states in self._traces(shard, n_shards, rng):
            pending.append((tid, states))
            size += self.scorer_kind.units(len(states))
            if size >= self.buffer:
                yield pending
                pending, size = [], 0
        if pending:
            yield pending

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        n_workers, worker = (info.num_workers, info.id) if info else (1, 0)
        shard, n_shards = self.rank * n_workers + worker, self.world_size * n_workers
        rng = np.random.default_rng([self.seed, self.epoch, shard])
        limit = (
            None
            if self.n_batches is None
            else self.n_batches // n_workers + (worker < self.n_batches % n_workers)
        )
        batches = self.scorer_kind.stream_batches(
            self, self._samples(shard, n_shards, rng), rng, tail=limit is None
        )
        yield from itertools.islice(batches, limit)


# ----------------------------------------------------------------------------- DataModule


class HarvestDataModule(L.LightningDataModule):
    """Harvest -> train/val loaders for scorer ``kind`` ('mlp': steps, 'seq': traces)."""

    def __init__(
        self,
        harvest: str | Sequence[str],
        kind: str | ScorerKind = "mlp",
        features: str | Sequence[str] = "hidden",
        batch_size: int = 128,
        eval_batch_size: int | None = None,
        val_fraction: float = 0.2,
        seed: int = 0,
        num_workers: int = 0,
        streaming: bool | str = "auto",
        max_in_memory_gb: float = 4.0,
        shuffle_buffer: int = 8192,
        read_batch_size: int = 256,
        max_len: int = 4096,
        labels: str = "outcome",
    ):
        super().__init__()
        self.labels = str(labels)
        self.scorer_kind = get_kind(kind)
        self.dirs = resolve_harvest_dirs(harvest)
        self.kind, self.features = self.scorer_kind.name, resolve_features(features)
        self.batch_size, self.eval_batch_size = (
            int(batch_size),
            int(eval_batch_size or (4 * batch_size)),
        )
        self.val_fraction, self.seed, self.num_workers = (
            float(val_fraction),
            int(seed),
            int(num_workers),
        )
        if streaming not in (True, False, "auto"):
            raise ValueError(f"data.streaming must be true, false or auto, got {streaming!r}")
        self.streaming_opt, self.max_in_memory_gb = streaming, float(max_in_memory_gb)
        self.shuffle_buffer, self.read_batch_size, self.max_len = (
            int(shuffle_buffer),
            int(read_batch_size),
            int(max_len),
        )
        self.index: HarvestIndex | None = None

    # -- setup (idempotent; every DDP process runs it) --
    def setup(self, stage: str | None = None) -> None:
        if self.index is not None:
            return
        ix = scan_harvests(self.dirs, read_batch_size=max(self.read_batch_size, 1024))
        ix.step_label = load_step_labels(ix, self.labels, max(self.read_batch_size, 1024))
        val = split_by_question(ix.qidx, ix.label, self.val_fraction, self.seed)
        has = ix.n_steps > 0
        self.train_traces = np.flatnonzero(~val & has)
        self.val_traces = np.flatnonzero(val & has)
        rows, _, _ = _rows_of(ix, self.train_traces)
        c = ix.conf[rows]
        c = np.clip(np.nan_to_num(c, nan=0.0, neginf=-100.0), -100.0, None)
        std = c.std(0)
        self.conf_norm = {
            "mean": c.mean(0).tolist(),
            "std": np.where(std > 1e-6, std, 1.0).tolist(),
        }
        if ix.step_label is None:
            y_tr = ix.label[self.train_traces]
            units = self.scorer_kind.units(ix.n_steps[self.train_traces])
            n_pos, n_all = int((y_tr * units).sum()), int(units.sum())
        else:  # over the labelled boundaries the loss sees
            ys = ix.step_label[rows]
            n_pos, n_all = int((ys == 1).sum()), int((ys >= 0).sum())
        self.pos_weight = (n_all - n_pos) / max(n_pos, 1)
        self.streaming = self.streaming_opt is True or (
            self.streaming_opt == "auto" and ix.state_bytes > self.max_in_memory_gb * 2**30
        )
        self.states = None if self.streaming else load_states(ix, self.read_batch_size)
        self.featurize = _Featurizer(
            self.features, self.conf_norm if len(self.features) > 1 else None
        )
        self.index = ix

    # -- facts the model and the checkpoint need --
    @property
    def hidden_size(self) -> int:
        return self._need().hidden_size

    @property
    def input_size(self) -> int:
        return feature_size(self.features, self.hidden_size)

    @property
    def manifest(self) -> dict:
        return self._need().manifests[0]

    def _need(self) -> HarvestIndex:
        if self.index is None:
            self.setup()
        return self.index

    def summary(self) -> dict:
        ix = self._need()
        tr, va = self.train_traces, self.val_traces
        return {
            "harvest": [str(d) for d in ix.dirs],
            "hidden_size": ix.hidden_size,
            "features": list(self.features),
            "labels": self.labels,
            "streaming": bool(self.streaming),
            "n_questions": {
                "train": len(np.unique(ix.qidx[tr])),
                "val": len(np.unique(ix.qidx[va])),
            },
            "n_traces": {"train": len(tr), "val": len(va)},
            "n_steps": {"train": int(ix.n_steps[tr].sum()), "val": int(ix.n_steps[va].sum())},
            "pos_rate_traces": {
                "train": float(ix.label[tr].mean()),
                "val": float(ix.label[va].mean()),
            },
            "n_traces_without_boundary": int((ix.n_steps == 0).sum()),
            "pos_weight": self.pos_weight,
            **({} if ix.step_label is None else {"pos_rate_steps": {
                "train": float((ix.step_label[_rows_of(ix, tr)[0]] == 1).mean()),
                "val": float((ix.step_label[_rows_of(ix, va)[0]] == 1).mean()),
            }}),
        }

    def set_epoch(self, epoch: int) -> None:
        for ds in (getattr(self, "_train_ds", None),):
            if isinstance(ds, StreamingDataset):
                ds.set_epoch(epoch)

    def _dist(self) -> tuple[int, int]:
        t = getattr(self, "trainer", None)
        return (t.global_rank, t.world_size) if t is not None else (0, 1)

    def _units(self, traces: np.ndarray) -> np.ndarray:
        return self.scorer_kind.units(self.index.n_steps[traces])

    def train_dataloader(self) -> DataLoader:
        ix = self._need()
        rank, world = self._dist()
        g = torch.Generator().manual_seed(self.seed)
        if self.streaming:
            n_shards = world * max(1, self.num_workers)
            per_shard = np.bincount(
                self.train_traces % n_shards,
                weights=self._units(self.train_traces),
                minlength=n_shards,
            )
            n_batches = int(per_shard.min() // self.batch_size) * max(1, self.num_workers)
            if n_batches == 0:
                raise HarvestError(
                    f"too little training data to stream {self.batch_size}-sample batches to {n_shards} "
                    "shards (ranks x workers): lower the batch size or data.num_workers, or use data.streaming=false"
                )
            self._train_ds = self._streaming(
                ix, self.train_traces, self.batch_size, shuffle=True, rank=rank,
                world_size=world, n_batches=n_batches,
            )
            return DataLoader(self._train_ds, batch_size=None, num_workers=self.num_workers)
        ds = self.scorer_kind.dataset(
            ix, self.states, self.train_traces, self.featurize, self.max_len
        )
        if world > 1:
            from torch.utils.data.distributed import DistributedSampler

            sampler = DistributedSampler(
                ds, num_replicas=world, rank=rank, shuffle=True, seed=self.seed
            )
        else:
            sampler = torch.utils.data.RandomSampler(ds, generator=g)
        self._train_ds = ds
        return self._in_memory_loader(ds, self.batch_size, sampler=sampler)

    def val_dataloader(self) -> DataLoader:
        ix = self._need()
        if self.streaming:
            ds = self._streaming(ix, self.val_traces, self.eval_batch_size, shuffle=False)
            return DataLoader(ds, batch_size=None, num_workers=min(self.num_workers, 1))
        ds = self.scorer_kind.dataset(ix, self.states, self.val_traces, self.featurize, self.max_len)
        return self._in_memory_loader(ds, self.eval_batch_size, shuffle=False)

    def _streaming(self, ix, traces: np.ndarray, batch_size: int, **kw) -> StreamingDataset:
        """A :class:`StreamingDataset` of ``traces`` with this module's kind, features, seed
        and read settings; ``kw``: its shuffle and sharding arguments."""
        return StreamingDataset(
            ix,
            traces,
            self.scorer_kind,
            self.featurize,
            batch_size,
            shuffle_buffer=self.shuffle_buffer,
            seed=self.seed,
            read_batch_size=self.read_batch_size,
            max_len=self.max_len,
            **kw,
        )

    def _in_memory_loader(self, ds, batch_size: int, **kw) -> DataLoader:
        """The loader of an in-memory dataset (whole batches through its ``__getitems__``);
        ``kw``: its sampler or ``shuffle``."""
        return DataLoader(
            ds,
            batch_size=batch_size,
            collate_fn=_identity,
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
            **kw,
        )
