"""Gambit's tournament: one question's thought-level beam search as a pure state machine.

Events in (a trace scored at a boundary, a trace finished, new tokens, memory pressure),
actions out (spawn, fork parent, prune, evict to ghost, revive, stop): see
:mod:`gambit_search.policy`. No engine call inside.

    t = Tournament(TournamentConfig(capacity=32, swap=1, interval=16, warmup=32))
    actions = t.start()                       # capacity x Spawn
    actions = t.handle(Scored(node=3, output_index=17, score=0.81))
    actions = t.handle(Progress({3: NodeDelta((5, 6))}))   # may run a round

Semantics (../shared/REFERENCE.md, "Gambit"); where ours differs it says why:

- **Two views.** Tree View: every logically active node (running + ghosts). Scheduler View:
  the running ones (they hold KV). Ghosts count toward the capacity C, are never parents,
  keep their score and leave only when a round prunes them.
- **Rounds** every ``interval`` decode steps of the question (steps in which any of its
  traces got a token). The reference counts engine decode steps; ours counts the question's
  own, so a question whose traces wait in the engine's queue does not hold rounds, and many
  questions on one engine each keep their own clock.
- **Ranking.** Rankable: active, scored, and past warmup, i.e. ``warmup`` output tokens in
  its lineage (a child's inherited prefix counts: it is the same trace so far). Eligible
  parent: running, scored and with ``warmup`` tokens generated since its own creation.
- **A round**: (1) the hard floor prunes rankable nodes scoring below ``floor``; (2) a full
  pool (N = C) swaps k = min(K, rankable/2): the bottom k rankable are pruned and one child
  is forked from each of the top k eligible parents (victims excluded); only as many
  victims go as there are parents, so the swap is zero-sum; (3) a pool below C (completions,
  failures, the floor) is refilled by forking from the eligible parents best first
  (round-robin when there are fewer parents than slots). Where no parent is eligible yet
  (early completions), fresh samples fill the pool instead, so the capacity never idles;
  the reference would wait. After every round the Tree View holds exactly C nodes until
  the budget is reached.
- **Branch point**: ``"boundary"`` (default) forks at the parent's last scored boundary, so
  the child's prefix is exactly the one its inherited score history describes;
  ``"current"`` (the reference) forks at the parent's current tokens. Measured on the toy
  val split: docs/BENCHMARKS.md ("gambit-solve").
- **Memory pressure** (``MemoryPressure(evict=n)``): the n lowest-scored running nodes
  (unscored ones first) become ghosts; a question always keeps one node running.
  ``revive=n`` (only with ``revive=True``) puts the best ghosts back; with
  ``revive_idle`` the best ghost is put back whenever none of the question's nodes runs.
- **Termination**: ``budget`` completed nodes (default C; with ``drain`` the running ones
  then finish and vote too), or no node running (all ghosts or all done; with
  ``revive_idle`` only when no ghost is left), or
  ``max_unique_tokens`` (a safety stop the reference lacks: a search can
  keep pruning the traces nearest their end; default 4 x budget x max_tokens when the
  driver knows the token cap). Active nodes are then stopped and do not vote.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from gambit_search.policy import (
    Action,
    Event,
    Evict,
    Finished,
    Fork,
    MemoryPressure,
    Node,
    NodeBook,
    NodeState,
    Progress,
    Prune,
    Revive,
    Scored,
    Spawn,
)

__all__ = ["BRANCH_POINTS", "Tournament", "TournamentConfig", "TournamentConfigError"]

BRANCH_POINTS = ("boundary", "current")


class TournamentConfigError(ValueError):
    """A search parameter is out of range (one line)."""


@dataclass(frozen=True)
class TournamentConfig:
    """Search parameters of one question. Toy defaults; the paper's in brackets."""

    capacity: int = 32
    """C: logically active traces kept per question [256]."""
    swap: int = 1
    """K: traces swapped per round when the pool is full [16]."""
    interval: int = 16
    """D: decode steps of the question between rounds [200]."""
    warmup: int = 32
    """w: output tokens a trace needs before it is ranked; a parent needs as many since its
    own creation [12,000]."""
    floor: float = 0.1
    """delta: a ranked trace scoring below this is pruned at the next round (0: off) [0.1]."""
    child_temperature: float = 1.0
    """Children sample at the parent's temperature times this [1.0]."""
    budget: int | None = None
    """Completed traces after which the question stops (None: capacity)."""
    ghosts: bool = True
    """Evict the lowest-scored running trace to a ghost under memory pressure."""
    revive: bool = False
    """Revive the best ghosts when memory frees up again."""
    revive_idle: bool = False
    """When no trace of the question runs but ghosts wait, revive the best ghost instead of
    ending the question (False: the reference's end). Under heavy KV pressure the reference
    rule ends questions far short of the budget (docs/SEARCH.md, "Memory pressure")."""
    branch_point: str = "boundary"
    """"boundary": fork at the parent's last scored boundary; "current": at its current
    tokens (the reference)."""
    max_unique_tokens: int | None = None
    """Safety stop: end the question after this many unique tokens (None: no cap)."""
    parents: str = "top"
    """"top": fork from the best eligible parents; "random": from eligible parents drawn at
    random (an ablation: does the scorer's choice of parent matter?)."""
    drain: bool = True
    """At the budget, stop branching but let the running traces finish and vote (ghosts are
    pruned), instead of stopping them (False: the reference). On the toy world the first
    traces to finish are more often wrong (they gave up checking), so stopping at the budget
    biased the vote: +9-12 points on the val split (docs/BENCHMARKS.md)."""

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
        if self.parents not in ("top", "random"):
            raise TournamentConfigError(f"parents must be 'top' or 'random', got {self.parents!r}")
        if self.max_unique_tokens is not None and self.max_unique_tokens < 1:
            raise TournamentConfigError(
                f"max_unique_tokens must be >= 1, got {self.max_unique_tokens}")


def _rank_key(n: Node) -> tuple[float, int]:
    """Ascending: worst first; unscored count as 0; among equals the older goes first."""
    return (n.score if n.score is not None else 0.0, n.id)


class Tournament(NodeBook):
    """One question's search; see the module docstring."""

    def __init__(self, config: TournamentConfig) -> None:
        super().__init__()
        self.config = config
        self.budget = config.budget if config.budget is not None else config.capacity
        self._since_round = 0
        self.draining = False
        """Budget reached with ``drain``: no more rounds, the running traces finish and vote."""
        self.rounds = 0
        self.round_log: list[dict] = []
        """Per round: active count, parents used (for parent-diversity ablations)."""

    # -- life ----------------------------------------------------------------------------------
    def start(self) -> list[Action]:
        """The first C fresh traces."""
        return [Spawn(self._new_root().id) for _ in range(self.config.capacity)]

    def handle(self, event: Event) -> list[Action]:
        """Apply one event; returns the actions to carry out, in order."""
        if self.done:
            if isinstance(event, Progress):
                self._on_progress(event)  # the last step's tokens still count
            return []
        if isinstance(event, Scored):
            self._on_scored(event)
            return []
        if isinstance(event, Finished):
            self._on_finished(event)
            return self._check_end()
        if isinstance(event, Progress):
            if self._on_progress(event):
                self._since_round += 1
            if (self.config.max_unique_tokens is not None
                    and self.unique_tokens >= self.config.max_unique_tokens):
                return self.stop()
            acts: list[Action] = []
            if self._since_round >= self.config.interval and not self.draining:
                self._since_round = 0
                acts = self.round()
            return acts + self._check_end()
        if isinstance(event, MemoryPressure):
            return self._on_memory(event)
        raise TypeError(f"unknown event {event!r}")

    def _check_end(self) -> list[Action]:
        if self.done:
            return []
        if not self.running():
            ghosts = self.ghosts()
            if self.config.revive_idle and ghosts and not self.draining:
                best = max(ghosts, key=_rank_key)
                best.state = NodeState.RUNNING
                self.counts["revivals"] += 1
                return [Revive(best.id)]
            return self.stop()
        if len(self.completed()) >= self.budget:
            if not self.config.drain:
                return self.stop()
            if not self.draining:  # no more rounds; ghosts go, the running ones finish
                self.draining = True
                acts: list[Action] = []
                for g in self.ghosts():
                    self._end(g, NodeState.PRUNED)
                    self.counts["prunes"] += 1
                    acts.append(Prune(g.id))
                return acts
        return []

    # -- a round -------------------------------------------------------------------------------
    def round(self) -> list[Action]:
        """One tournament round (normally triggered by :class:`Progress`)."""
        cfg = self.config
        self.rounds += 1
        active = self.active()
        rankable = sorted((n for n in active if n.score is not None
                           and n.length >= cfg.warmup), key=_rank_key)
        victims: list[Node] = []
        if cfg.floor > 0:
            victims = [n for n in rankable if n.score < cfg.floor]  # type: ignore[operator]
        rest = [n for n in rankable if n not in victims]
        parents = sorted((n for n in active if n.state is NodeState.RUNNING
                          and n.score is not None and n.generated >= cfg.warmup
                          and n not in victims), key=_rank_key, reverse=True)
        if len(active) - len(victims) >= cfg.capacity:
            k = min(cfg.swap, len(rest) // 2)
            bottom = rest[:k]
            k = min(k, len([p for p in parents if p not in bottom]))
            victims += bottom[:k]
        vset = {n.id for n in victims}
        parents = [p for p in parents if p.id not in vset]
        if cfg.parents == "random":  # deterministic: a function of the round's state
            key = hash((self.rounds, tuple((p.id, p.score) for p in parents)))
            random.Random(key).shuffle(parents)
        slots = cfg.capacity - (len(active) - len(victims))
        acts: list[Action] = []
        used: list[int] = []
        for i in range(max(0, slots)):
            if parents:
                p = parents[i % len(parents)]
                acts.append(self._fork(p))
                used.append(p.id)
            else:
                acts.append(Spawn(self._new_root().id))
        for v in victims:
            self._end(v, NodeState.PRUNED)
            self.counts["prunes"] += 1
            acts.append(Prune(v.id))
        self.round_log.append({"round": self.rounds, "step": self.steps,
                               "active": len(self.active()), "pruned": len(victims),
                               "parents": used, "ghosts": len(self.ghosts())})
        return acts

    def stats(self) -> dict:
        """Tree statistics plus parent diversity: distinct parents per round that forked, and
        the share of all forks taken from each round's most used parent."""
        st = super().stats()
        forked = [r["parents"] for r in self.round_log if r["parents"]]
        st["rounds"] = self.rounds
        st["distinct_parents_per_round"] = (
            round(sum(len(set(p)) for p in forked) / len(forked), 3) if forked else 0.0)
        st["top_parent_share"] = (
            round(sum(max(p.count(x) for x in p) for p in forked)
                  / sum(len(p) for p in forked), 3) if forked else 0.0)
        return st

    def _fork(self, p: Node) -> Fork:
        cfg = self.config
        at: int | None = None
        if cfg.branch_point == "boundary" and p.scores:
            at = max(0, p.scores[-1][0] + 1 - p.inherited)
            at = min(at, p.generated)
        child = self._new_child(p, at)
        return Fork(child.id, p.id, at, cfg.child_temperature)

    # -- memory --------------------------------------------------------------------------------
    def _on_memory(self, e: MemoryPressure) -> list[Action]:
        acts: list[Action] = []
        if e.evict > 0 and self.config.ghosts and not self.draining:
            run = sorted(self.running(), key=_rank_key)
            for n in run[: max(0, min(e.evict, len(run) - 1))]:
                n.state = NodeState.GHOST
                n.evictions += 1
                self.counts["ghosts"] += 1
                acts.append(Evict(n.id))
        if e.revive > 0 and self.config.revive:
            for n in sorted(self.ghosts(), key=_rank_key, reverse=True)[: e.revive]:
                n.state = NodeState.RUNNING
                self.counts["revivals"] += 1
                acts.append(Revive(n.id))
        return acts
