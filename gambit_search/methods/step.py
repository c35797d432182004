"""STEP (arXiv 2601.09093): SC's N traces, scored; under memory pressure the worst go.

All N traces start at once (like SC) and are scored at every thought boundary. Whenever the
KV cache cannot hold the next step (the driver sends ``MemoryPressure(evict=n)`` after vLLM
preempted n requests, or n=1 when KV use reaches ``DriverConfig.evict_above``), the n
running traces with the lowest trace score are aborted and their KV freed; there is no
refill, so a question starts at most N traces and votes on those that complete. The driver
checks KV use after every step and asks for the excess before vLLM would preempt (the
published method aborts in place of preempting), and admits only the traces that fit (the
rest start as KV frees). Answer: the score-weighted vote over the completed traces' final
scores.

Choices where the paper leaves room:

- Unscored traces count as 0 (they go first); among equal scores the trace with the fewest
  generated tokens goes first (the least work thrown away), then the newer one.
- A question never aborts its last running trace (it would end with no vote); the driver
  asks the question with the most running traces, so this only binds when every question
  is down to one.

    gambit-solve --method step --n 32 --kv-cache 0.05 --dataset toy:val:100 --out runs/step
"""

from __future__ import annotations

from gambit_search.methods import Method
from gambit_search.methods.independent import from_budget
from gambit_search.methods.sc import SelfConsistency
from gambit_search.policy import Action, Event, MemoryPressure, Node, NodeState, Prune, Spawn

__all__ = ["Step", "victim_order"]


def victim_order(n: Node) -> tuple[float, int, int]:
    """Ascending: the first is aborted first (lowest score, unscored as 0; then the fewest
    generated tokens; then the newer)."""
    return (n.score if n.score is not None else 0.0, n.generated, -n.id)


class Step(SelfConsistency):
    """N fresh scored traces; ``MemoryPressure(evict=n)`` aborts the n worst running ones.

    ``start(limit)`` starts only the traces the question's KV share holds and
    ``MemoryPressure(revive=k)`` starts k more of the N as KV frees up (vLLM would queue
    them; held back here, they cannot take the blocks the running traces need to grow, so
    the engine never has to preempt)."""

    def start(self, limit: int | None = None) -> list[Action]:
        k = self.n if limit is None else max(1, min(self.n, int(limit)))
        return [Spawn(self._new_root().id) for _ in range(k)]

    def wants(self) -> int:
        """Traces of the N not started yet."""
        return 0 if self.done else self.n - len(self.nodes)

    def handle(self, event: Event) -> list[Action]:
        if isinstance(event, MemoryPressure) and not self.done:
            return self._on_memory(event)
        acts = super().handle(event)
        if self.done and self.wants_more():  # the started ones ended early: start the rest
            self.done = False
            acts += [Spawn(self._new_root().id) for _ in range(self.n - len(self.nodes))]
        return acts

    def wants_more(self) -> bool:
        return len(self.nodes) < self.n

    def _on_memory(self, e: MemoryPressure) -> list[Action]:
        acts: list[Action] = []
        if e.evict > 0:
            run = sorted(self.running(), key=victim_order)
            for n in run[: max(0, min(e.evict, len(run) - 1))]:
                self._end(n, NodeState.PRUNED)
                self.counts["prunes"] += 1
                acts.append(Prune(n.id))
        if e.revive > 0:
            acts += [Spawn(self._new_root().id) for _ in range(min(e.revive, self.wants()))]
        return acts


METHOD = Method(
    name="step",
    summary="STEP: N scored traces, abort the lowest-scored under memory pressure, "
            "score-weighted vote",
    make_policy=from_budget(Step),
    needs_scorer=True,
    scores_traces=True,
    uses_memory=True,
    vote="weighted",
)
