"""The STEP MLP's kind: :class:`MLPKind` (every step scored alone) and its run-time state
per trace, :class:`MLPHistory` (a running mean of step probabilities).

The kind is its three parts, one per interface of :mod:`gambit_scorer.scorer_kind`:
:class:`MLPNetwork` (the network and checkpoints), :class:`MLPTraining` (samples, loss,
validation) and :class:`MLPRuntime` (scoring and the running mean).

Registered in :mod:`gambit_scorer.kinds` as ``"mlp"``; callers get it there
(``get_kind("mlp")``), not from here, except to name :class:`MLPHistory`::

    from gambit_scorer.kinds import get_kind
    kind = get_kind("mlp")
    st, score = kind.append(model, kind.new_state(), x)   # x [k, F]: score = mean prob

Only torch and numpy here; the data methods import ``gambit_scorer.samples`` when called.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.data import Dataset

from gambit_scorer.models import StepMLP
from gambit_scorer.scorer_kind import (
    ArchitectureError,
    KindNetwork,
    KindRuntime,
    KindTraining,
    ScorerKind,
)

__all__ = ["MLPHistory", "MLPKind", "MLPNetwork", "MLPRuntime", "MLPTraining"]


@dataclass(frozen=True)
class MLPHistory:
    """Running mean of a trace's step probabilities (the STEP trace score)."""

    n_steps: int = 0
    total: float = 0.0

    @property
    def score(self) -> float | None:
        return self.total / self.n_steps if self.n_steps else None


class MLPNetwork(KindNetwork):
    """The StepMLP network: built from ``scorer.model``, told from a reference checkpoint by
    its ``net.*`` weights, rebuilt from the Linear layers' shapes."""

    model_class = StepMLP

    def build(self, input_size: int, **model_cfg) -> StepMLP:
        return StepMLP(input_size, **model_cfg)

    def recognises(self, state_dict: dict[str, Tensor], model_config: dict) -> bool:
        return model_config.get("arch") == "mlp" or any(k.startswith("net.") for k in state_dict)

    def from_state_dict(self, state_dict: dict[str, Tensor], model_config: dict) -> StepMLP:
        sd = state_dict
        idx = sorted(int(m.group(1)) for k in sd if (m := re.fullmatch(r"net\.(\d+)\.weight", k)))
        if not idx or idx != list(range(0, 2 * len(idx), 2)):
            raise ArchitectureError(
                f"MLP weights at net.{idx} do not form Linear/ReLU/.../Linear (expected net.0, net.2, ...)"
            )
        ws = [sd[f"net.{i}.weight"] for i in idx]
        if ws[-1].shape[0] != 1:
            raise ArchitectureError(f"the last MLP layer has {ws[-1].shape[0]} outputs, expected 1")
        return StepMLP(ws[0].shape[1], [w.shape[0] for w in ws[:-1]])


class MLPTraining(KindTraining):
    """Training on steps: one sample per step, each step's loss alone (only the labelled
    steps with process labels); the trace score after a step is the mean probability so far."""

    def units(self, n_steps: int | np.ndarray) -> int | np.ndarray:
        return n_steps

    def dataset(self, index: Any, states: Any, traces: np.ndarray, featurize: Any,
                max_len: int) -> Dataset:
        from gambit_scorer.samples import StepDataset

        return StepDataset(index, states, traces, featurize)

    def stream_batches(self, ds: Any, chunks: Iterable[list], rng: np.random.Generator,
                       tail: bool) -> Iterator[dict]:
        from gambit_scorer.samples import stream_step_batches

        return stream_step_batches(ds, chunks, rng, tail)

    def loss(self, logits: Tensor, batch: dict, pos_weight: Tensor,
             loss_position: str | None) -> Tensor:
        if "y_step" in batch:  # process labels: the labelled steps only
            m = batch["y_step_mask"].to(logits.dtype)
            per = F.binary_cross_entropy_with_logits(
                logits, batch["y_step"], pos_weight=pos_weight, reduction="none"
            )
            return (per * m).sum() / m.sum().clamp(min=1.0)
        return F.binary_cross_entropy_with_logits(logits, batch["y"], pos_weight=pos_weight)

    def val_records(self, batch: dict, prob: Tensor) -> tuple[Tensor, ...]:
        return (batch["trace"], batch["q"], batch["step"], prob, batch["y"])

    def trace_scores_so_far(self, trace: np.ndarray, prob: np.ndarray) -> np.ndarray:
        prob = np.asarray(prob, dtype=np.float64)
        out = np.empty_like(prob)
        starts = np.flatnonzero(np.r_[True, trace[1:] != trace[:-1]])
        ends = np.r_[starts[1:], len(trace)]
        for a, b in zip(starts, ends, strict=True):
            out[a:b] = np.cumsum(prob[a:b]) / np.arange(1, b - a + 1)
        return out


class MLPRuntime(KindRuntime):
    """Scoring steps alone: a trace's state is the running sum of its step probabilities
    (:class:`MLPHistory`); no pool (the state is two numbers)."""

    title = "MLP"

    def score_steps(self, model: StepMLP, x: Tensor) -> np.ndarray:
        return torch.sigmoid(model(x)).float().cpu().numpy()

    def score_trace(self, model: StepMLP, x: Tensor) -> np.ndarray:
        p = torch.sigmoid(model(x)).double()
        n = torch.arange(1, len(p) + 1, dtype=p.dtype, device=p.device)
        return (p.cumsum(0) / n).cpu().numpy()

    def new_state(self) -> MLPHistory:
        return MLPHistory()

    def append(self, model: StepMLP, state: MLPHistory, x: Tensor) -> tuple[MLPHistory, float]:
        if not isinstance(state, MLPHistory):
            raise TypeError("this is an MLP scorer: pass a history from its init_history()")
        p = torch.sigmoid(model(x)).double()
        h = MLPHistory(state.n_steps + len(p), state.total + float(p.sum()))
        return h, float(h.score)

    def step(self, model: StepMLP, states: Sequence[MLPHistory], x: Tensor
             ) -> tuple[list[MLPHistory], np.ndarray]:
        p = self.score_steps(model, x).astype(np.float64).reshape(-1)
        new = [
            MLPHistory(h.n_steps + 1, h.total + float(pi)) for h, pi in zip(states, p, strict=True)
        ]
        return new, np.array([h.score for h in new])


class MLPKind(MLPNetwork, MLPTraining, MLPRuntime, ScorerKind):
    """The STEP MLP: loss on every step alone; trace score = running mean of step
    probabilities. Its parts, nothing more."""

    name = "mlp"
