"""The scorer-kind interface: :class:`ScorerKind`, and what every kind shares.

A kind is three interfaces in one: its network and checkpoints (:class:`KindNetwork`), its
training (:class:`KindTraining`) and its run time (:class:`KindRuntime`).

A kind (:mod:`gambit_scorer.kind_seq`, :mod:`gambit_scorer.kind_mlp`) writes one part per
interface (``SeqNetwork(KindNetwork)``, ``SeqTraining(KindTraining)``,
``SeqRuntime(KindRuntime)``) and combines them with :class:`ScorerKind`
(``class SeqKind(SeqNetwork, SeqTraining, SeqRuntime, ScorerKind)``);
:mod:`gambit_scorer.kinds` registers the kinds and says what a kind is for. Callers get a
kind by name there (``get_kind("seq")``) and import this module only to write a kind or to
name the types::

    from gambit_scorer.scorer_kind import ArchitectureError, ScorerKind

Only torch and numpy here (the search runtime imports this through ``checkpoint.py``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, ClassVar

import numpy as np
from torch import Tensor, nn

__all__ = ["LOSS_POSITIONS", "ArchitectureError", "KindNetwork", "KindRuntime", "KindTraining",
           "ScorerKind", "int_or_none"]

LOSS_POSITIONS = ("last", "every")
"""Where a sequence scorer's loss is taken (``scorer.loss_position``)."""


class ArchitectureError(ValueError):
    """Weights (and ``model_config``) that do not describe a network of the kind; the
    checkpoint loader reports it as a ``ScorerLoadError`` naming the file."""


def int_or_none(x: Any) -> int | None:
    """``x`` as an int when it is an integer value (3, 3.0, "3"), else None."""
    try:
        f = float(x)
    except (TypeError, ValueError):
        return None
    return int(f) if f.is_integer() else None


# ----------------------------------------------------------------------------- the interface


class KindNetwork(ABC):
    """A kind's network and checkpoints: what :mod:`gambit_scorer.checkpoint` needs to build
    a scorer and to read one back."""

    model_class: ClassVar[type[nn.Module]]

    @abstractmethod
    def build(self, input_size: int, **model_cfg) -> nn.Module:
        """A fresh network taking ``input_size`` features per step (``scorer.model`` keys)."""

    @abstractmethod
    def recognises(self, state_dict: dict[str, Tensor], model_config: dict) -> bool:
        """Whether a checkpoint without our metadata (a reference one) holds this kind."""

    @abstractmethod
    def from_state_dict(self, state_dict: dict[str, Tensor], model_config: dict) -> nn.Module:
        """An untrained network whose parameters have the shapes in ``state_dict``, checked
        against ``model_config``; :class:`ArchitectureError` when they do not fit."""


class KindTraining(ABC):
    """A kind's training: its samples, batches, loss and validation records (what
    :mod:`gambit_scorer.data`, :mod:`gambit_scorer.lit` and :mod:`gambit_scorer.metrics`
    call)."""

    loss_positions: ClassVar[tuple[str, ...]] = ()
    """Accepted ``scorer.loss_position`` values; empty: the kind has no such choice."""

    def resolve_loss_position(self, value: str | None) -> str | None:
        """The run's ``loss_position`` from ``scorer.loss_position`` (None for a kind without one)."""
        if not self.loss_positions:
            return None
        if value not in self.loss_positions:
            raise ValueError(
                f"scorer.loss_position={value!r}: choose {' or '.join(self.loss_positions)}"
            )
        return value

    @abstractmethod
    def units(self, n_steps):
        """Loss samples per trace of ``n_steps`` steps (an int or an array of them)."""

    @abstractmethod
    def dataset(self, index, states, traces, featurize, max_len: int):
        """In-memory training/validation samples of ``traces`` (a map-style Dataset whose
        ``__getitems__`` returns a whole batch)."""

    @abstractmethod
    def stream_batches(self, ds, chunks: Iterable[list], rng, tail: bool) -> Iterator[dict]:
        """Batches of ``ds.batch_size`` from chunks of ``(trace id, states)`` read by a
        ``StreamingDataset``; ``tail``: also the last partial batch."""

    @abstractmethod
    def loss(self, logits: Tensor, batch: dict, pos_weight: Tensor, loss_position: str) -> Tensor:
        """The training loss of one batch."""

    @abstractmethod
    def val_records(self, batch: dict, prob: Tensor) -> tuple[Tensor, ...]:
        """(trace, question, step, probability, label), one entry per scored step."""

    @abstractmethod
    def trace_scores_so_far(self, trace: np.ndarray, prob: np.ndarray) -> np.ndarray:
        """Per validation record (sorted by trace, then step), the trace score after it."""


class KindRuntime(ABC):
    """A kind at run time: scoring traces and the per-trace state a search keeps (eval mode;
    callers hold ``torch.inference_mode``)."""

    title: ClassVar[str]
    """What messages call it ("MLP", "sequence")."""

    def score_steps(self, model: nn.Module, x: Tensor) -> np.ndarray:
        """Per-step probabilities of independent steps (only kinds that score steps alone)."""
        raise TypeError(
            f"score_steps is for MLP scorers; a {self.title} scorer scores histories: "
            "use append()/score_trace()"
        )

    @abstractmethod
    def score_trace(self, model: nn.Module, x: Tensor) -> np.ndarray:
        """One trace's features [n, F] -> the trace score after each step [n]."""

    @abstractmethod
    def new_state(self) -> Any:
        """The run-time state of a new trace (an immutable value)."""

    def fork(self, state: Any) -> Any:
        """A branch's copy of its parent's state. States are immutable values (``append`` and
        ``step`` return new ones and never change their arguments), so this is the same object."""
        return state

    def prefix(self, state: Any, k: int, score: float | None) -> Any | None:
        """The state after only the first ``k`` of ``state``'s steps, whose trace score was
        ``score``, derived from ``state`` itself; None when this kind's state cannot be cut
        (then a caller that needs prefixes keeps one state per step: they are small)."""
        return None

    def pool(self, model: nn.Module) -> Any | None:
        """A store of every trace's state in preallocated tensors, whose batched step costs
        the same ops for any number of traces (``add``/``drop``/``step``, as
        :class:`~gambit_scorer.seq_pool.SeqPool`), or None: run time keeps immutable states
        and calls :meth:`step`."""
        return None

    @abstractmethod
    def append(self, model: nn.Module, state: Any, x: Tensor) -> tuple[Any, float]:
        """Add steps x [k, F] to one trace's state -> (new state, trace score)."""

    @abstractmethod
    def step(self, model: nn.Module, states: Sequence[Any], x: Tensor) -> tuple[list, np.ndarray]:
        """One new step x[i] [B, F] for each trace state, in one forward -> (new states,
        trace scores [B] float64)."""


class ScorerKind(KindNetwork, KindTraining, KindRuntime):
    """One kind of scorer (see :mod:`gambit_scorer.kinds`): its network and checkpoints
    (:class:`KindNetwork`), its training (:class:`KindTraining`) and its run time
    (:class:`KindRuntime`). A kind subclasses one part per interface, each complete on its
    own (``model_class`` in the network part, ``title`` in the run-time part), then this
    class, and sets ``name``."""

    name: ClassVar[str]
    """Registry key: Hydra's ``scorer.name``, the checkpoint's ``gambit.arch``."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"
