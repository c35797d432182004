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

This module is the registry; the interface is :mod:`gambit_scorer.scorer_kind`, the kinds
:mod:`gambit_scorer.kind_seq` and :mod:`gambit_scorer.kind_mlp`. Adding a kind: in a module
of its own, write its three parts (subclasses of ``KindNetwork``, ``KindTraining`` and
``KindRuntime``) and combine them with :class:`~gambit_scorer.scorer_kind.ScorerKind`
(``class LSTMKind(LSTMNetwork, LSTMTraining, LSTMRuntime, ScorerKind)``), :func:`register` it
below, add ``conf/scorer/<name>.yaml`` (``name: <name>``, ``model: {...}`` for
:meth:`build`).

Only torch and numpy here (the search runtime imports this through ``checkpoint.py``);
the data methods import ``gambit_scorer.data`` (Lightning) when called.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from gambit_core.registry import Registry
from gambit_scorer.kind_mlp import MLPKind
from gambit_scorer.kind_seq import SeqKind
from gambit_scorer.scorer_kind import ScorerKind

__all__ = ["build_model", "detect_kind", "get_kind", "kind_names", "kind_of_model", "register"]

def _unknown(name: object, names: tuple[str, ...]) -> ValueError:
    return ValueError(
        f"unknown scorer kind {name!r}: the known kinds are {', '.join(names)} "
        f"(choose {' or '.join(f'scorer={n}' for n in names)})"
    )


_KINDS: Registry[ScorerKind] = Registry(_unknown, what="scorer kind")


def register(cls: type[ScorerKind]) -> type[ScorerKind]:
    """Add a kind class to the registry (usable as a class decorator). Registration order is
    the order :func:`detect_kind` tries kinds in (register the more specific test first)."""
    _KINDS.add(cls.name, cls())
    return cls


def kind_names() -> tuple[str, ...]:
    """The registered kinds' names, sorted."""
    return _KINDS.names()


def get_kind(name: str | ScorerKind) -> ScorerKind:
    """The kind called ``name`` (a kind is returned as is); ValueError naming the known ones."""
    return name if isinstance(name, ScorerKind) else _KINDS.get(name)


def kind_of_model(model: nn.Module) -> ScorerKind:
    """The kind whose network ``model`` is; TypeError for another module."""
    for kind in _KINDS:
        if isinstance(model, kind.model_class):
            return kind
    classes = " or ".join(_KINDS.get(n).model_class.__name__ for n in kind_names())
    raise TypeError(f"expected a {classes}, got {type(model).__name__}")


def detect_kind(state_dict: dict[str, Tensor], model_config: dict) -> ScorerKind | None:
    """The first registered kind that :meth:`~ScorerKind.recognises` a checkpoint, or None."""
    return next((k for k in _KINDS if k.recognises(state_dict, model_config)), None)


register(SeqKind)  # before MLP: its test (input_proj.*) is the more specific one
register(MLPKind)


def build_model(kind: str, input_size: int, **kwargs: Any) -> nn.Module:
    """The network of scorer kind ``kind``: 'mlp' -> StepMLP(input_size, hidden_sizes);
    'seq' -> SeqScorer(input_size, ...)."""
    return get_kind(kind).build(input_size, **kwargs)
