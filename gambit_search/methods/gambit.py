"""Gambit: the scorer-guided tournament (:mod:`gambit_search.tournament`) as a method.

    gambit-solve --method gambit --n 64 --capacity 32 --swap 2 --interval 32 --warmup 16 --dataset toy:test:200

``--n`` is the budget N of completed traces that vote; ``--capacity`` is C, the traces kept
active at once (at most N; the toy default C = 32 at N = 64 was chosen on val, the paper
runs C = N = 256). Answers by the score-weighted vote.
"""

from __future__ import annotations

from dataclasses import dataclass

from gambit_search.methods import Method
from gambit_search.tournament import Tournament, TournamentConfig


@dataclass(frozen=True)
class GambitParams:
    """Gambit's flags (``--capacity``, ``--swap`` ...). Defaults: chosen on toy:val at N = 64
    (docs/RESULTS.md, "Accuracy at equal budgets"); the paper's for real reasoning models in
    brackets."""

    capacity: int | None = 32
    """Gambit's C, logically active traces per question, at most n (None: n) [paper 256]."""
    swap: int = 2
    """Gambit's K, traces swapped per round [paper 16]."""
    interval: int = 32
    """Gambit's D, decode steps of a question between rounds [paper 200]."""
    warmup: int = 16
    """Gambit's w, output tokens before a trace is ranked or may branch [paper 12000]."""
    floor: float = 0.1
    """Gambit's hard floor: ranked traces scoring below it are pruned (0: off) [paper 0.1]."""
    child_temperature: float = 1.0
    """Children sample at the parent's temperature times this."""
    branch_point: str = "boundary"
    """Where a child branches: "boundary" (the parent's last scored thought boundary),
    "current" (its current tokens, the reference), "best" (its best-scored boundary so far)
    or "drop" (the last boundary before its score last fell) [paper current]."""
    interval_unit: str = "steps"
    """What --interval counts: "steps" (decode steps of the question) or "thoughts" (scored
    boundaries per running trace: a round every D thoughts of the average trace) [paper
    steps]."""
    max_children: int = 0
    """Diversity cap: a trace that has had this many children is no longer a parent (0: no
    cap) [paper 0]."""
    parents: str = "top"
    """Which eligible traces Gambit forks from: "top" (best scored) or "random" (ablation)."""
    drain: bool = True
    """Keep completed + active traces within n, so every trace kept finishes and votes
    (--no-drain: the reference, which refills until n complete, then stops the active ones)."""
    ghosts: bool = True
    """Under memory pressure evict the lowest-scored running traces to ghosts."""
    revive: bool = True
    """Revive ghosts in batches sized to the free KV (they also come back whenever none of
    their question's traces runs)."""


def _capacity(params: GambitParams, n: int) -> int:
    return min(int(params.capacity or n), n)  # C <= N: more never run


def tournament_config(params: GambitParams, n: int, max_tokens: int | None = None
                      ) -> TournamentConfig:
    """The :class:`TournamentConfig` of Gambit's parameters and budget ``n`` (raises
    TournamentConfigError, a ValueError, with one line)."""
    return TournamentConfig(
        capacity=_capacity(params, n), swap=params.swap, interval=params.interval,
        warmup=params.warmup, floor=params.floor, child_temperature=params.child_temperature,
        budget=n, ghosts=params.ghosts, revive=params.revive, branch_point=params.branch_point,
        parents=params.parents, drain=params.drain, interval_unit=params.interval_unit,
        max_children=params.max_children,
        max_unique_tokens=4 * n * max_tokens if max_tokens else None,
    )


def _make(params: GambitParams, n: int, ctx=None) -> Tournament:
    return Tournament(tournament_config(params, n, ctx.max_tokens if ctx is not None else None))


def _check(params: GambitParams, n: int) -> None:
    tournament_config(params, n)


METHOD = Method(
    name="gambit",
    summary="thought-level beam search: prune the worst K, fork the best K prefixes, ghosts "
            "under memory pressure",
    make_policy=_make,
    slots=_capacity,
    params=GambitParams,
    needs_scorer=True,
    scores_traces=True,
    uses_memory=True,
    vote="weighted",
    check=_check,
)
