"""Self-consistency (SC@N): N independent traces per question, plain majority vote.

All N start at once; the engine queues what does not fit (that queueing is what Gambit is
measured against). No scorer, no rounds, no memory handling.

    gambit-solve --method sc --n 32 --dataset toy:test:200
"""

from __future__ import annotations

from gambit_search.methods import Method
from gambit_search.methods.independent import IndependentTraces, from_budget
from gambit_search.policy import Action, Spawn


class SelfConsistency(IndependentTraces):
    """N fresh traces; done when all have ended."""

    def __init__(self, n: int) -> None:
        super().__init__()
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        self.n = n

    def start(self, limit: int | None = None) -> list[Action]:
        """Every trace at once (``limit`` is for methods that use memory: this one gets None)."""
        return [Spawn(self._new_root().id) for _ in range(self.n)]


METHOD = Method(
    name="sc",
    summary="self-consistency: N independent traces, plain majority over equivalence bins",
    make_policy=from_budget(SelfConsistency),
    vote="plain",
)
