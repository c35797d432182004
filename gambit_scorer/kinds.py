"""Scorer kinds: one class per kind of scorer, behind a small registry.

A *kind* is everything that differs between the STEP MLP and the SeqScorer, in one place:

- its network: :meth:`~ScorerKind.build` (from Hydra's ``scorer.model``), ``model_class``,
  and, for checkpoints, :meth:`~ScorerKind.recognises` / :meth:`~ScorerKind.from_state_dict`
  (tell a reference checkpoint's kind, rebuild the network from the weights' shapes);
- its training data and loss: :meth:`~ScorerKind.units` (loss samples per trace: steps or
  the trace), :meth:`~ScorerKind.dataset` / :meth:`~ScorerKind.stream_batches` (step samples
  or padded traces, in ``data.py``), :meth:`~ScorerKind.loss`, :meth:`~ScorerKind.val_records`,
  :meth:`~ScorerKind.resolve_loss_position`;
- its trace score: :meth:`~ScorerKind.trace_scores_so_far` (validation records) and
  :meth:`~ScorerKind.score_trace` (one trace's states);
- its run-time state per trace: :meth:`~ScorerKind.new_state`, :meth:`~ScorerKind.fork`
  (a branch's copy of its parent's), :meth:`~ScorerKind.append` (steps of one trace) and
  :meth:`~ScorerKind.step` (one new step for each of a batch of traces, one forward).

Kinds are stateless singletons; the methods that run a network take it as an argument.
Kind names are the Hydra ``scorer=`` choices and the checkpoint's ``gambit.arch``.

    from gambit_scorer.kinds import get_kind
    kind = get_kind("seq")
    model = kind.build(input_size, d_model=64, nhead=4)
    st = kind.new_state(); child = kind.fork(st)
    states, scores = kind.step(model, [st, child], x)   # x [2, input_size] -> trace scores [2]

Adding a kind: subclass :class:`ScorerKind`, decorate it with :func:`register`, add
``conf/scorer/<name>.yaml`` (``name: <name>``, ``model: {...}`` for :meth:`build`).

Only torch and numpy here (the search runtime imports this through ``checkpoint.py``);
the data methods import ``gambit_scorer.data`` (Lightning) when called.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gambit_scorer.models import KVCache, SeqScorer, StepMLP

__all__ = [
    "LOSS_POSITIONS",
    "ArchitectureError",
    "MLPHistory",
    "MLPKind",
    "ScorerKind",
    "SeqHistory",
    "SeqKind",
    "detect_kind",
    "get_kind",
    "kind_names",
    "kind_of_model",
    "register",
]

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


# ----------------------------------------------------------------------------- run-time states


@dataclass(frozen=True)
class MLPHistory:
    """Running mean of a trace's step probabilities (the STEP trace score)."""

    n_steps: int = 0
    total: float = 0.0

    @property
    def score(self) -> float | None:
        return self.total / self.n_steps if self.n_steps else None


@dataclass(frozen=True)
class SeqHistory:
    """A trace's attention cache (per layer keys/values); ``score`` = last position's probability."""

    n_steps: int = 0
    cache: tuple[KVCache, ...] | None = None
    score: float | None = None


# ----------------------------------------------------------------------------- the interface


class ScorerKind(ABC):
    """One kind of scorer (see the module docstring). Subclasses set ``name`` and
    ``model_class`` and implement the abstract methods."""

    name: ClassVar[str]
    """Registry key: Hydra's ``scorer.name``, the checkpoint's ``gambit.arch``."""
    title: ClassVar[str]
    """What messages call it ("MLP", "sequence")."""
    model_class: ClassVar[type[nn.Module]]
    loss_positions: ClassVar[tuple[str, ...]] = ()
    """Accepted ``scorer.loss_position`` values; empty: the kind has no such choice."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    # -- network
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

    # -- training
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

    # -- scoring (eval mode; callers hold torch.inference_mode)
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


# ----------------------------------------------------------------------------- registry

_KINDS: dict[str, ScorerKind] = {}


def register(cls: type[ScorerKind]) -> type[ScorerKind]:
    """Class decorator: add a kind to the registry. Registration order is the order
    :func:`detect_kind` tries kinds in (register the more specific test first)."""
    if cls.name in _KINDS:
        raise ValueError(f"scorer kind {cls.name!r} is registered twice")
    _KINDS[cls.name] = cls()
    return cls


def kind_names() -> tuple[str, ...]:
    """The registered kinds' names, sorted."""
    return tuple(sorted(_KINDS))


def get_kind(name: str | ScorerKind) -> ScorerKind:
    """The kind called ``name`` (a kind is returned as is); ValueError naming the known ones."""
    if isinstance(name, ScorerKind):
        return name
    if isinstance(name, str) and name in _KINDS:
        return _KINDS[name]
    names = kind_names()
    raise ValueError(
        f"unknown scorer kind {name!r}: the known kinds are {', '.join(names)} "
        f"(choose {' or '.join(f'scorer={n}' for n in names)})"
    )


def kind_of_model(model: nn.Module) -> ScorerKind:
    """The kind whose network ``model`` is; TypeError for another module."""
    for kind in _KINDS.values():
        if isinstance(model, kind.model_class):
            return kind
    classes = " or ".join(_KINDS[n].model_class.__name__ for n in kind_names())
    raise TypeError(f"expected a {classes}, got {type(model).__name__}")


def detect_kind(state_dict: dict[str, Tensor], model_config: dict) -> ScorerKind | None:
    """The first registered kind that :meth:`~ScorerKind.recognises` a checkpoint, or None."""
    return next((k for k in _KINDS.values() if k.recognises(state_dict, model_config)), None)


# ----------------------------------------------------------------------------- Seq


def _trim(cache: Sequence[KVCache], max_len: int) -> Sequence[KVCache]:
    """A sliding window: the last ``max_len`` steps of a per-layer cache."""
    if cache[0][0].shape[2] > max_len:
        return [(k[:, :, -max_len:], v[:, :, -max_len:]) for k, v in cache]
    return cache


@register  # before MLP: its test (input_proj.*) is the more specific one
class SeqKind(ScorerKind):
    """The history-aware SeqScorer: loss on traces; trace score = the latest position's output,
    from a per-trace attention cache at run time."""

    name = "seq"
    title = "sequence"
    model_class = SeqScorer
    loss_positions = LOSS_POSITIONS

    def build(self, input_size: int, **model_cfg) -> SeqScorer:
        return SeqScorer(input_size, **model_cfg)

    def recognises(self, state_dict, model_config) -> bool:
        return model_config.get("type") == "sequence_transformer" or any(
            k.startswith("input_proj.") for k in state_dict
        )

    def from_state_dict(self, state_dict, model_config) -> SeqScorer:
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

    # -- training: one sample per trace with a boundary
    def units(self, n_steps):
        return np.minimum(n_steps, 1)

    def dataset(self, index, states, traces, featurize, max_len):
        from gambit_scorer.samples import TraceDataset

        return TraceDataset(index, states, traces, featurize, max_len)

    def stream_batches(self, ds, chunks, rng, tail):
        from gambit_scorer.samples import stream_trace_batches

        return stream_trace_batches(ds, chunks, rng, tail)

    def loss(self, logits, batch, pos_weight, loss_position):
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

    def val_records(self, batch, prob):
        m = batch["mask"]
        n = m.sum(1)
        return (
            batch["trace"].repeat_interleave(n),
            batch["q"].repeat_interleave(n),
            batch["step"][m],
            prob[m],
            batch["y"].repeat_interleave(n),
        )

    def trace_scores_so_far(self, trace, prob):
        return np.asarray(prob, dtype=np.float64)

    # -- scoring
    def score_trace(self, model, x):
        return torch.sigmoid(model(x.unsqueeze(0))[0]).float().cpu().numpy()

    def new_state(self) -> SeqHistory:
        return SeqHistory()

    def pool(self, model):
        from gambit_scorer.seq_pool import SeqPool

        return SeqPool(model)

    def prefix(self, state, k, score):
        # causal attention: the cache of the first k steps is the first k cache entries,
        # exact while the sliding window has not cut anything
        if state.cache is None or k == 0:
            return SeqHistory()
        if state.n_steps > state.cache[0][0].shape[2]:
            return None  # the window dropped early steps: not recoverable
        return SeqHistory(k, tuple((kk[:, :, :k], v[:, :, :k]) for kk, v in state.cache), score)

    def append(self, model, state, x):
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

    def step(self, model, states, x):
        logits, caches = model.step_batch(x, [h.cache for h in states], [h.n_steps for h in states])
        probs = torch.sigmoid(logits).float().cpu().numpy()
        new = [
            SeqHistory(h.n_steps + 1, tuple(_trim(c, model.max_len)), float(p))
            for h, c, p in zip(states, caches, probs, strict=True)
        ]
        return new, probs.astype(np.float64)


# ----------------------------------------------------------------------------- MLP


@register
class MLPKind(ScorerKind):
    """The STEP MLP: loss on every step alone; trace score = running mean of step probabilities."""

    name = "mlp"
    title = "MLP"
    model_class = StepMLP

    def build(self, input_size: int, **model_cfg) -> StepMLP:
        return StepMLP(input_size, **model_cfg)

    def recognises(self, state_dict, model_config) -> bool:
        return model_config.get("arch") == "mlp" or any(k.startswith("net.") for k in state_dict)

    def from_state_dict(self, state_dict, model_config) -> StepMLP:
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

    # -- training: one sample per step
    def units(self, n_steps):
        return n_steps

    def dataset(self, index, states, traces, featurize, max_len):
        from gambit_scorer.samples import StepDataset

        return StepDataset(index, states, traces, featurize)

    def stream_batches(self, ds, chunks, rng, tail):
        from gambit_scorer.samples import stream_step_batches

        return stream_step_batches(ds, chunks, rng, tail)

    def loss(self, logits, batch, pos_weight, loss_position):
        if "y_step" in batch:  # process labels: the labelled steps only
            m = batch["y_step_mask"].to(logits.dtype)
            per = F.binary_cross_entropy_with_logits(
                logits, batch["y_step"], pos_weight=pos_weight, reduction="none"
            )
            return (per * m).sum() / m.sum().clamp(min=1.0)
        return F.binary_cross_entropy_with_logits(logits, batch["y"], pos_weight=pos_weight)

    def val_records(self, batch, prob):
        return (batch["trace"], batch["q"], batch["step"], prob, batch["y"])

    def trace_scores_so_far(self, trace, prob):
        prob = np.asarray(prob, dtype=np.float64)
        out = np.empty_like(prob)
        starts = np.flatnonzero(np.r_[True, trace[1:] != trace[:-1]])
        ends = np.r_[starts[1:], len(trace)]
        for a, b in zip(starts, ends, strict=True):
            out[a:b] = np.cumsum(prob[a:b]) / np.arange(1, b - a + 1)
        return out

    # -- scoring
    def score_steps(self, model, x):
        return torch.sigmoid(model(x)).float().cpu().numpy()

    def score_trace(self, model, x):
        p = torch.sigmoid(model(x)).double()
        n = torch.arange(1, len(p) + 1, dtype=p.dtype, device=p.device)
        return (p.cumsum(0) / n).cpu().numpy()

    def new_state(self) -> MLPHistory:
        return MLPHistory()

    def append(self, model, state, x):
        if not isinstance(state, MLPHistory):
            raise TypeError("this is an MLP scorer: pass a history from its init_history()")
        p = torch.sigmoid(model(x)).double()
        h = MLPHistory(state.n_steps + len(p), state.total + float(p.sum()))
        return h, float(h.score)

    def step(self, model, states, x):
        p = self.score_steps(model, x).astype(np.float64).reshape(-1)
        new = [
            MLPHistory(h.n_steps + 1, h.total + float(pi)) for h, pi in zip(states, p, strict=True)
        ]
        return new, np.array([h.score for h in new])


def build_model(kind: str, input_size: int, **kwargs: Any) -> nn.Module:
    """The network of scorer kind ``kind``: 'mlp' -> StepMLP(input_size, hidden_sizes);
    'seq' -> SeqScorer(input_size, ...)."""
    return get_kind(kind).build(input_size, **kwargs)
