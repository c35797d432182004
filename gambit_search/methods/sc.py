"""Self-consistency (SC@N): N independent traces per question, plain majority vote.

All N start at once; the engine queues what does not fit (that queueing is what Gambit is
measured against). No scorer, no rounds, no memory handling.

    gambit-solve --method sc --n 32 --dataset toy:test:200
"""

from __future__ import annotations

from gambit_search.methods import Method
from gambit_search.policy import (
    Action,
    Event,
    Finished,
    MemoryPressure,
    NodeBook,
    Progress,
    Scored,
    Spawn,
)


class SelfConsistency(NodeBook):
    """N fresh traces; done when all have ended."""

    def __init__(self, n: int) -> None:
        super().__init__()
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        self.n = n

    def start(self, limit: int | None = None) -> list[Action]:
        """Every trace at once (``limit`` is for methods that use memory: this one gets None)."""
        return [Spawn(self._new_root().id) for _ in range(self.n)]

    def handle(self, event: Event) -> list[Action]:
        if self._after_done(event):
            return []
        if isinstance(event, Scored):
            self._on_scored(event)
        elif isinstance(event, Finished):
            self._on_finished(event)
            if not self.num_active:
                self.done = True
        elif isinstance(event, Progress):
            self._on_progress(event)
        elif not isinstance(event, MemoryPressure):
            raise TypeError(f"unknown event {event!r}")
        return []


def _make(params, n: int, ctx=None) -> SelfConsistency:
    return SelfConsistency(n)


METHOD = Method(
    name="sc",
    summary="self-consistency: N independent traces, plain majority over equivalence bins",
    make_policy=_make,
    vote="plain",
)
