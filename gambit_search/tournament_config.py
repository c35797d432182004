"""The tournament's parameters of one question (:class:`TournamentConfig`), validated on
construction; what each does is :mod:`gambit_search.tournament`'s docstring. Gambit's flags
(:class:`gambit_search.methods.gambit.GambitParams`) map onto it.
"""

from __future__ import annotations

from dataclasses import dataclass

from gambit_core.errors import InputError

__all__ = ["BRANCH_POINTS", "INTERVAL_UNITS", "TournamentConfig", "TournamentConfigError"]

BRANCH_POINTS = ("boundary", "current", "best", "drop")
"""Where a child branches off its parent (:attr:`TournamentConfig.branch_point`)."""
INTERVAL_UNITS = ("steps", "thoughts")
"""What :attr:`TournamentConfig.interval` counts."""


class TournamentConfigError(InputError):
    """A search parameter is out of range (one line)."""


@dataclass(frozen=True)
class TournamentConfig:
    """Search parameters of one question. Toy defaults; the paper's in brackets."""

    capacity: int = 32
    """C: logically active traces kept per question [256]."""
    swap: int = 2
    """K: traces swapped per round when the pool is full [16]."""
    interval: int = 32
    """D: decode steps of the question between rounds [200]."""
    warmup: int = 16
    """w: output tokens a trace needs before it is ranked; a parent needs as many since its
    own creation [12,000]."""
    floor: float = 0.1
    """delta: a ranked trace scoring below this is pruned at the next round (0: off) [0.1]."""
    child_temperature: float = 1.0
    """Children sample at the base temperature times this, at every depth [1.0]."""
    budget: int | None = None
    """N: completed traces the question votes on (None: capacity) [256]."""
    ghosts: bool = True
    """Evict the lowest-scored running traces to ghosts under memory pressure."""
    revive: bool = True
    """Revive the best ghosts when the driver offers free KV (they also come back whenever
    none of the question's traces runs)."""
    branch_point: str = "boundary"
    """"boundary": fork at the parent's last scored boundary; "current": at its current
    tokens (the reference); "best": at its best-scored boundary so far; "drop": at the last
    boundary before its score last fell."""
    interval_unit: str = "steps"
    """What ``interval`` counts: "steps" (decode steps of the question, the reference) or
    "thoughts" (scored boundaries per running trace)."""
    max_children: int = 0
    """Diversity cap: a parent with this many children is no longer eligible (0: none)."""
    max_lineage: int = 0
    """Diversity cap: a fork may not take a root's lineage (the root and its descendants)
    above this many active traces; with no parent left under it, a fresh root is sampled
    (0: none)."""
    max_prunes: int | None = None
    """Prune budget: at most this many traces pruned per question, then the survivors finish
    (None: no cap)."""
    max_unique_tokens: int | None = None
    """Safety stop: end the question after this many unique tokens (None: no cap)."""
    parents: str = "top"
    """"top": fork from the best eligible parents; "random": from eligible parents drawn at
    random (an ablation: does the scorer's choice of parent matter?)."""
    drain: bool = True
    """Keep completed + active traces within the budget, so every trace kept finishes and
    votes (False: the reference, which refills until N complete and then stops the active
    ones, starting more traces for the same N votes)."""

    def __post_init__(self) -> None:
        if self.swap < 1:
            raise TournamentConfigError(f"swap K must be >= 1, got {self.swap}")
        if self.capacity < 2 * self.swap:
            raise TournamentConfigError(
                f"capacity C={self.capacity} must be >= 2K={2 * self.swap} (K={self.swap}): a "
                "round prunes K and keeps K parents")
        if self.interval <= 0:
            raise TournamentConfigError(f"interval D must be > 0, got {self.interval}")
        if self.warmup <= 0:
            raise TournamentConfigError(f"warmup w must be > 0, got {self.warmup}")
        if not 0 <= self.floor < 1:
            raise TournamentConfigError(f"floor must be in [0, 1), got {self.floor}")
        if self.child_temperature < 0:
            raise TournamentConfigError(
                f"child_temperature must be >= 0, got {self.child_temperature}")
        if self.budget is not None and self.budget < 1:
            raise TournamentConfigError(f"budget must be >= 1, got {self.budget}")
        if self.branch_point not in BRANCH_POINTS:
            raise TournamentConfigError(
                f"branch_point must be one of {BRANCH_POINTS}, got {self.branch_point!r}")
        if self.interval_unit not in INTERVAL_UNITS:
            raise TournamentConfigError(
                f"interval_unit must be one of {INTERVAL_UNITS}, got {self.interval_unit!r}")
        if self.max_children < 0:
            raise TournamentConfigError(
                f"max_children must be >= 0 (0: no cap), got {self.max_children}")
        if self.max_lineage < 0:
            raise TournamentConfigError(
                f"max_lineage must be >= 0 (0: no cap), got {self.max_lineage}")
        if self.parents not in ("top", "random"):
            raise TournamentConfigError(f"parents must be 'top' or 'random', got {self.parents!r}")
        if self.max_prunes is not None and self.max_prunes < 0:
            raise TournamentConfigError(
                f"max_prunes must be >= 0 (None: no cap), got {self.max_prunes}")
        if self.max_unique_tokens is not None and self.max_unique_tokens < 1:
            raise TournamentConfigError(
                f"max_unique_tokens must be >= 1, got {self.max_unique_tokens}")
