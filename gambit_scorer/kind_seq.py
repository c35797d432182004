"""The sequence scorer's kind: :class:`SeqKind` (the history-aware SeqScorer) and its
run-time state per trace, :class:`SeqHistory` (an attention cache).

The kind is its three parts, one per interface of :mod:`gambit_scorer.scorer_kind`:
:class:`SeqNetwork` (the network and checkpoints), :class:`SeqTraining` (samples, loss,
validation) and :class:`SeqRuntime` (scoring and the per-trace cache).

Registered in :mod:`gambit_scorer.kinds` as ``"seq"``; callers get it there
(``get_kind("seq")``), not from here, except to name :class:`SeqHistory`::

    from gambit_scorer.kinds import get_kind
    kind = get_kind("seq")
    st = kind.new_state()                       # SeqHistory()
    st, score = kind.append(model, st, x)       # x [k, F]: k more steps of one trace

Only torch and numpy here; the data methods import ``gambit_scorer.samples`` when called.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.data import Dataset

from gambit_scorer.models import KVCache, SeqScorer
from gambit_scorer.scorer_kind import (
    LOSS_POSITIONS,
    ArchitectureError,
    KindNetwork,
    KindRuntime,
    KindTraining,
    ScorerKind,
    int_or_none,
)

if TYPE_CHECKING:
    from gambit_scorer.seq_pool import SeqPool

__all__ = ["SeqHistory", "SeqKind", "SeqNetwork", "SeqRuntime", "SeqTraining"]


@dataclass(frozen=True)
class SeqHistory:
    """A trace's attention cache (per layer keys/values); ``score`` = last position's probability."""

    n_steps: int = 0
    cache: tuple[KVCache, ...] | None = None
    score: float | None = None


def _trim(cache: Sequence[KVCache], max_len: int) -> Sequence[KVCache]:
    """A sliding window: the last ``max_len`` steps of a per-layer cache."""
    if cache[0][0].shape[2] > max_len:
        return [(k[:, :, -max_len:], v[:, :, -max_len:]) for k, v in cache]
    return cache


class SeqNetwork(KindNetwork):
    """The SeqScorer network: built from ``scorer.model``, told from a reference checkpoint by
    its ``input_proj.*`` weights, rebuilt from the weights' shapes and ``model_config``."""

    model_class = SeqScorer

    def build(self, input_size: int, **model_cfg) -> SeqScorer:
        return SeqScorer(input_size, **model_cfg)

    def recognises(self, state_dict: dict[str, Tensor], model_config: dict) -> bool:
        return model_config.get("type") == "sequence_transformer" or any(
            k.startswith("input_proj.") for k in state_dict
        )

    def from_state_dict(self, state_dict: dict[str, Tensor], model_config: dict) -> SeqScorer:
        sd, mc = state_dict, model_config
        try:
            w_in = sd["input_proj.1.weight"]
            n_layers = 1 + max(
                int(m.group(1)) for k in sd if (m := re.match(r"layers\.(\d+)\.", k))
            )
            dim_ff = sd["layers.0.ffn.gate.weight"].shape[0]
        except (KeyError, ValueError) as e:
            raise ArchitectureError(f"not a sequence scorer state dict (missing {e})") from e
        d_model, input_size = w_in.shape
        inferred = {"d_model": d_model, "num_layers": n_layers, "dim_feedforward": dim_ff}
        for k, v in inferred.items():
            if k in mc and int_or_none(mc[k]) != int(v):
                raise ArchitectureError(
                    f"model_config says {k}={mc[k]!r} but the weights have {k}={v}"
                )
        if "nhead" not in mc:
            # the fused qkv Linear(d_model, 3*d_model) looks the same for any head count
            raise ArchitectureError(
                "model_config has no 'nhead' (the head count cannot be inferred from the "
                "weights); add it to the checkpoint's model_config (e.g. ckpt['model_config']['nhead'] = 4 "
                "for a reference scorer trained with 4 heads) and save it again"
            )
        nhead = int_or_none(mc["nhead"])
        if nhead is None or nhead < 1:
            raise ArchitectureError(
                f"model_config has nhead={mc['nhead']!r}, expected a positive integer"
            )
        if d_model % nhead:
            raise ArchitectureError(f"d_model={d_model} is not divisible by nhead={nhead}")
        try:
            return SeqScorer(
                input_size,
                d_model=d_model,
                nhead=nhead,
                num_layers=n_layers,
                dim_feedforward=dim_ff,
                max_len=int(mc.get("max_len", 4096)),
                rope_base=float(mc.get("rope_base", 10000.0)),
                dropout=0.0,
                attn_out_bias="layers.0.attn.out_proj.bias" in sd,
                ffn_bias="layers.0.ffn.gate.bias" in sd,
            )
        # e.g. an odd head size for RoPE, a non-numeric max_len
        except (TypeError, ValueError) as e:
            raise ArchitectureError(
                f"cannot build the sequence scorer its model_config describes: {e}"
            ) from e


class SeqTraining(KindTraining):
    """Training on traces: one sample per trace with a boundary (a padded trace), the loss at
    its last position or every position (``scorer.loss_position``), or at every labelled
    position with process labels; the trace score after a step is that position's output."""

    loss_positions = LOSS_POSITIONS

    def units(self, n_steps: int | np.ndarray) -> int | np.ndarray:
        return np.minimum(n_steps, 1)

    def dataset(self, index: Any, states: Any, traces: np.ndarray, featurize: Any,
                max_len: int) -> Dataset:
        from gambit_scorer.samples import TraceDataset

        return TraceDataset(index, states, traces, featurize, max_len)

    def stream_batches(self, ds: Any, chunks: Iterable[list], rng: np.random.Generator,
                       tail: bool) -> Iterator[dict]:
        from gambit_scorer.samples import stream_trace_batches

        return stream_trace_batches(ds, chunks, rng, tail)

    def loss(self, logits: Tensor, batch: dict, pos_weight: Tensor,
             loss_position: str | None) -> Tensor:
        if "y_step" in batch:  # process labels: every labelled position, per-trace mean
            m = batch["y_step_mask"].to(logits.dtype)
            per = F.binary_cross_entropy_with_logits(
                logits, batch["y_step"], pos_weight=pos_weight, reduction="none"
            )
            n = m.sum(1)
            has = n > 0
            return ((per * m).sum(1)[has] / n[has]).mean() if bool(has.any()) else (logits * 0).sum()
        y = batch["y"]
        if loss_position == "last":
            last = logits[torch.arange(len(y), device=logits.device), batch["lengths"] - 1]
            return F.binary_cross_entropy_with_logits(last, y, pos_weight=pos_weight)
        mask = batch["mask"].to(logits.dtype)
        per = F.binary_cross_entropy_with_logits(
            logits, y[:, None].expand_as(logits), pos_weight=pos_weight, reduction="none"
        )
        return ((per * mask).sum(1) / mask.sum(1)).mean()

    def val_records(self, batch: dict, prob: Tensor) -> tuple[Tensor, ...]:
        m = batch["mask"]
        n = m.sum(1)
        return (
            batch["trace"].repeat_interleave(n),
            batch["q"].repeat_interleave(n),
            batch["step"][m],
            prob[m],
            batch["y"].repeat_interleave(n),
        )

    def trace_scores_so_far(self, trace: np.ndarray, prob: np.ndarray) -> np.ndarray:
        return np.asarray(prob, dtype=np.float64)


class SeqRuntime(KindRuntime):
    """Scoring with history: a trace's state is its attention cache (:class:`SeqHistory`, a
    sliding window of ``model.max_len`` steps), kept per trace or in a :class:`SeqPool`."""

    title = "sequence"

    def score_trace(self, model: SeqScorer, x: Tensor) -> np.ndarray:
        return torch.sigmoid(model(x.unsqueeze(0))[0]).float().cpu().numpy()

    def new_state(self) -> SeqHistory:
        return SeqHistory()

    def pool(self, model: SeqScorer) -> SeqPool:
        from gambit_scorer.seq_pool import SeqPool

        return SeqPool(model)

    def prefix(self, state: SeqHistory, k: int, score: float | None) -> SeqHistory | None:
        # causal attention: the cache of the first k steps is the first k cache entries,
        # exact while the sliding window has not cut anything
        if state.cache is None or k == 0:
            return SeqHistory()
        if state.n_steps > state.cache[0][0].shape[2]:
            return None  # the window dropped early steps: not recoverable
        return SeqHistory(k, tuple((kk[:, :, :k], v[:, :, :k]) for kk, v in state.cache), score)

    def append(self, model: SeqScorer, state: SeqHistory, x: Tensor) -> tuple[SeqHistory, float]:
        if not isinstance(state, SeqHistory):
            raise TypeError("this is a sequence scorer: pass a history from its init_history()")
        logits, cache = model.forward_with_cache(
            x.unsqueeze(0),
            None if state.cache is None else list(state.cache),
            start=state.n_steps,
        )
        cache = _trim(cache, model.max_len)
        score = float(torch.sigmoid(logits[0, -1]))
        return SeqHistory(state.n_steps + x.shape[0], tuple(cache), score), score

    def step(self, model: SeqScorer, states: Sequence[SeqHistory], x: Tensor
             ) -> tuple[list[SeqHistory], np.ndarray]:
        logits, caches = model.step_batch(x, [h.cache for h in states], [h.n_steps for h in states])
        probs = torch.sigmoid(logits).float().cpu().numpy()
        new = [
            SeqHistory(h.n_steps + 1, tuple(_trim(c, model.max_len)), float(p))
            for h, c, p in zip(states, caches, probs, strict=True)
        ]
        return new, probs.astype(np.float64)


class SeqKind(SeqNetwork, SeqTraining, SeqRuntime, ScorerKind):
    """The history-aware SeqScorer: loss on traces; trace score = the latest position's output,
    from a per-trace attention cache at run time. Its parts, nothing more."""

    name = "seq"
