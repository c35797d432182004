"""Gambit's tournament: one question's thought-level beam search as a pure state machine.

Events in (a trace scored at a boundary, a trace finished, new tokens, memory pressure),
actions out (spawn, fork parent, prune, evict to ghost, revive, stop): see
:mod:`gambit_search.policy`. No engine call inside.

    t = Tournament(TournamentConfig(capacity=32, budget=64, swap=2, interval=32, warmup=16))
    actions = t.start()                       # capacity x Spawn (or fewer: start(limit))
    actions = t.handle(Scored(node=3, output_index=17, score=0.81))
    actions = t.handle(Progress({3: NodeDelta((5, 6))}))   # may run a round

Semantics (docs/SEARCH.md and docs/REFERENCE.md, "Gambit"); where ours differs it says why:

- **The budget** N (``budget``) is the number of completed traces that vote. A question
  ends when N traces have completed, and with ``drain`` (the default) it never has more
  than N traces *in play*: completed + active (running + ghosts) <= N, so every trace it
  keeps finishes and votes and it votes on exactly N, unless it stops on the token cap or
  on errors (``end_reason`` says which). A pruned or failed trace gives its place back.
  Without ``drain`` (the reference) the pool is refilled until N have completed and the
  traces still active then are stopped and do not vote: also exactly N votes, with more
  traces started.
- **Two views.** Tree View: every logically active node (running + ghosts). Scheduler View:
  the running ones (they hold KV). Ghosts count toward the capacity C and are never parents.
- **Refill on the event.** When a trace completes, fails or is pruned and the pool has room
  (active < C and, with ``drain``, budget left), the same event returns the Fork/Spawn that
  refills it, so the capacity never idles between rounds.
- **Rounds** every ``interval`` decode steps of the question (steps in which any of its
  traces got a token). The reference counts engine decode steps; ours counts the question's
  own, so a question whose traces wait in the engine's queue does not hold rounds.
- **Ranking.** Rankable: every ghost, and every running node that is scored and past
  warmup (``warmup`` output tokens in its lineage; a child's inherited prefix counts).
  Unscored or pre-warmup ghosts rank below everything, so bottom-K reaches them and a
  ghost can always leave. Eligible parent: running, scored, and ``warmup`` tokens
  generated since its own creation.
- **A round**: (1) the hard floor prunes ranked nodes scoring below ``floor``; (2) a full
  pool (no room to refill) swaps k = min(K, rankable/2): the bottom k rankable are pruned
  and one child is forked from each of the top k eligible parents (victims excluded); only
  as many victims go as there are parents, so the swap is zero-sum; (3) room left is
  refilled by forking from the eligible parents best first (round-robin), or with fresh
  samples where no parent is eligible yet (the reference would wait).
- **Branch point**: ``"boundary"`` (default) forks at the parent's last scored boundary, so
  the child's prefix is exactly the one its inherited score history describes;
  ``"current"`` (the reference) forks at the parent's current tokens. Two backtrack:
  ``"best"`` forks at the parent's best-scored boundary so far, ``"drop"`` at the last
  boundary before its score last fell (its last boundary while the score never fell).
  Both choose among the boundaries the parent can be cut at: its own, and the inherited one
  it was forked at (a cut there is ``at=0``, the parent's own prompt). Each node keeps its
  best and its last pre-drop boundary as two numbers, updated on every :class:`Scored`
  (O(1) per boundary and per fork; the score history itself is the book's).
- **Rounds in thoughts** (``interval_unit="thoughts"``): a round after the question's
  running traces have scored ``interval`` boundaries each on average (scored boundaries
  since the last round >= ``interval`` x running traces), so a round is a fixed share of a
  trace whatever its thought length; ``"steps"`` (default, the reference) counts decode
  steps.
- **Diversity** (``max_children``): a parent with that many children (ever) is no longer
  eligible, so the forks of a round spread over more parents (0: no cap, the reference).
  ``max_lineage``: a fork may not take a root's lineage (the root and all its descendants)
  above that many active traces; the next-best parent of another lineage forks instead, or a
  fresh root when none has room (DVTS-like independent subtrees; 0: no cap, the reference).
- **Prune budget** (``max_prunes``): a question prunes at most this many traces (floor and
  swap alike, lowest ranked first); then rounds prune no more and the survivors finish, so
  at most N + ``max_prunes`` traces start (errors aside): a cap on the search's exploration
  cost (None: no cap, the reference).
- **Temperature**: a root samples at the base temperature T, every child at T x
  ``child_temperature`` whatever its depth (the reference; multiplying the parent's own
  temperature would compound to T x m^depth).
- **Memory pressure** (``MemoryPressure(evict=n)``): n running nodes become ghosts, lowest
  score first and only scored ones while any exist; a question always keeps one node
  running. ``MemoryPressure(revive=n)`` offers n traces' worth of free KV: the best ghosts
  come back first, then a question admitted below C (``start(limit)``) grows toward C.
  Whenever none of the question's nodes runs, its best ghost is revived: a question never
  ends with ghosts waiting.
- **Termination**: N completed (``end_reason`` "budget"); ``max_unique_tokens`` (a safety
  stop the reference lacks: a search can keep pruning the traces nearest their end;
  default 4 x budget x max_tokens when the driver knows the token cap; "token_cap");
  ``budget`` failures without a completion in between ("errors"). Active nodes are then
  stopped and do not vote.
"""

from __future__ import annotations

import heapq
import random
from collections import Counter

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
from gambit_search.tournament_config import TournamentConfig

__all__ = ["Tournament"]


def _rank_key(n: Node, warmup: int) -> tuple[int, float, int]:
    """Ascending: worst first. Unranked (unscored or pre-warmup) nodes, i.e. such ghosts,
    come below every ranked one; then by score; among equals the older goes first."""
    ranked = n.score is not None and n.length >= warmup
    return (int(ranked), n.score if ranked else 0.0, n.id)  # type: ignore[return-value]


def _evict_key(n: Node) -> tuple[float, int]:
    """Ascending: the first becomes a ghost first (lowest score; among equals the older)."""
    return (n.score if n.score is not None else 0.0, n.id)


class Tournament(NodeBook):
    """One question's search; see the module docstring."""

    sweep_slack = 64
    """Stale entries the eligible-parent heap may hold beyond 3x the running nodes."""

    def __init__(self, config: TournamentConfig) -> None:
        super().__init__()
        self.config = config
        self.budget = config.budget if config.budget is not None else config.capacity
        self.limit = config.capacity
        """Active traces allowed now: C, or less while the question's KV share is smaller
        (``start(limit)``); grows back with ``MemoryPressure(revive=n)``."""
        self._since_round = 0
        self.end_reason: str | None = None
        """Why the question ended: "budget", "token_cap", "errors" or "stopped"."""
        self.rounds = 0
        self.round_log: list[dict] = []
        """Per round: active count, parents used (for parent-diversity ablations)."""
        self._cands: list[tuple[float, int, int]] = []
        """Eligible parents as a lazy max-heap of (-score, -id, version): a refill takes its
        best few in O(few log n) instead of sorting every running node (see :meth:`_offer`)."""
        self._version: dict[int, int] = {}
        self._children: dict[int, int] = {}
        """Children forked from each node (for ``max_children``)."""
        self._root: dict[int, int] = {}
        """Each forked node's root (for ``max_lineage``; a root is its own and is not filed)."""
        self._scored_since_round = 0
        """Scored boundaries of active nodes since the last round (``interval_unit="thoughts"``)."""
        self._best: dict[int, tuple[int, float]] = {}
        """Per node: (lineage output index, score) of its best cuttable boundary so far."""
        self._before_drop: dict[int, int] = {}
        """Per node: lineage output index of the boundary before its score last fell."""

    # -- life ----------------------------------------------------------------------------------
    def start(self, limit: int | None = None) -> list[Action]:
        """The first traces: C, or ``limit`` (at least 1) when the driver's KV share for the
        question holds fewer."""
        if limit is not None:
            self.limit = max(1, min(self.config.capacity, int(limit)))
        return [Spawn(self._new_root().id) for _ in range(self.room())]

    @property
    def draining(self) -> bool:
        """With ``drain``: every remaining trace of the budget is in play (no refill)."""
        return self.config.drain and self._in_play() >= self.budget

    def _in_play(self) -> int:
        return self.counts["completions"] + self.num_active

    def room(self) -> int:
        """Traces the pool may add now (capacity, KV share and, with ``drain``, budget)."""
        room = self.limit - self.num_active
        if self.config.drain:
            room = min(room, self.budget - self._in_play())
        return max(0, room)

    def handle(self, event: Event) -> list[Action]:
        """Apply one event; returns the actions to carry out, in order."""
        if self._after_done(event):
            return []
        if isinstance(event, Scored):
            n = self.nodes[event.node]
            k = len(n.scores)
            self._on_scored(event)
            if len(n.scores) > k:  # recorded: an active node's new boundary
                self._track(n)
            self._offer(n)
            return []
        if isinstance(event, Finished):
            self._on_finished(event)
            end = self._check_end()
            if self.done or not event.last:
                return end
            return self._refill() + self._keep_one_running()
        if isinstance(event, Progress):
            if self._on_progress(event):
                self._since_round += 1
            w = self.config.warmup
            for node, d in event.deltas.items():  # who just became old enough to branch
                n = self.nodes[node]
                if n.generated >= w > n.generated - len(d.token_ids):
                    self._offer(n)
            if (self.config.max_unique_tokens is not None
                    and self.unique_tokens >= self.config.max_unique_tokens):
                return self._stop("token_cap")
            acts: list[Action] = []
            if self._round_due():
                self._since_round = self._scored_since_round = 0
                acts = self.round()
            return acts + self._check_end() + self._keep_one_running()
        if isinstance(event, MemoryPressure):
            return self._on_memory(event) + self._keep_one_running()
        raise TypeError(f"unknown event {event!r}")

    def _round_due(self) -> bool:
        cfg = self.config
        if cfg.interval_unit == "thoughts":
            return self._scored_since_round >= cfg.interval * max(1, self.num_running)
        return self._since_round >= cfg.interval

    # -- fork points -----------------------------------------------------------------------------
    def _track(self, n: Node) -> None:
        """After ``n``'s newest score: its best and its pre-drop boundary (O(1))."""
        self._scored_since_round += 1
        i, s = n.scores[-1]
        best = self._best.get(n.id)
        if best is None or s >= best[1]:
            self._best[n.id] = (i, s)
        if len(n.scores) >= 2 and s < n.scores[-2][1] and n.scores[-2][0] >= n.inherited - 1:
            self._before_drop[n.id] = n.scores[-2][0]

    def _inherit_points(self, child: Node) -> None:
        """A child cut right after an inherited boundary can be forked there (at 0)."""
        if child.scores and child.scores[-1][0] == child.inherited - 1:
            self._best[child.id] = child.scores[-1]

    def _branch_at(self, p: Node) -> int | None:
        """Own output tokens of ``p`` a child keeps (None: all, ``"current"``)."""
        mode = self.config.branch_point
        if mode == "current" or not p.scores:
            return None
        i = p.scores[-1][0]  # "boundary", and the fallback of the others
        if mode == "best" and p.id in self._best:
            i = self._best[p.id][0]
        elif mode == "drop":
            i = self._before_drop.get(p.id, i)
        return min(max(0, i + 1 - p.inherited), p.generated)

    def _stop(self, reason: str) -> list[Action]:
        self.end_reason = reason
        return self.stop()

    def _check_end(self) -> list[Action]:
        if self.done:
            return []
        if self.counts["completions"] >= self.budget:
            return self._stop("budget")
        if self.counts["failures"] >= self.budget:
            return self._stop("errors")
        if not self.num_active and not self.room():
            return self._stop("stopped")
        return []

    def _keep_one_running(self) -> list[Action]:
        """None of the question's traces runs but ghosts wait: the best one comes back."""
        if self.done or self.num_running or not self.num_ghosts:
            return []
        best = max(self.ghosts(), key=lambda n: _rank_key(n, self.config.warmup))
        return [self._revive(best)]

    def _revive(self, n: Node) -> Revive:
        self._set_state(n, NodeState.RUNNING)
        self._offer(n)
        self.counts["revivals"] += 1
        return Revive(n.id)

    # -- eligible parents, indexed ---------------------------------------------------------------
    def _eligible(self, n: Node) -> bool:
        cap = self.config.max_children
        return (n.state is NodeState.RUNNING and n.score is not None
                and n.generated >= self.config.warmup
                and not (cap and self._children.get(n.id, 0) >= cap))

    def _offer(self, n: Node) -> None:
        """(Re)file ``n`` among the eligible parents after a change that may have made it
        one or changed its score: a scored boundary, its ``warmup``-th token, a revival. Its
        older entries go stale (their version); entries of nodes that stopped running are
        dropped when met. Stale entries are swept when they outnumber the running nodes."""
        if not self._eligible(n):
            return
        heapq.heappush(self._cands, self._entry(n))
        if len(self._cands) > 4 * self.num_running + self.sweep_slack:
            self._cands = [self._entry(m) for m in self.running() if self._eligible(m)]
            heapq.heapify(self._cands)

    def _entry(self, n: Node) -> tuple[float, int, int]:
        """A heap entry for eligible ``n``, of a new version (its older entries go stale)."""
        v = self._version[n.id] = self._version.get(n.id, 0) + 1
        return (-n.score, -n.id, v)  # type: ignore[operator]

    def _top_parents(self, k: int) -> list[Node]:
        """The best ``k`` eligible parents, best first: ``self._parents(set())[:k]`` with
        ``parents="top"``, without ranking every running node."""
        out: list[Node] = []
        keep: list[tuple[float, int, int]] = []
        while self._cands and len(out) < k:
            e = heapq.heappop(self._cands)
            n = self.nodes[-e[1]]
            if e[2] == self._version[n.id] and self._eligible(n) and n.score == -e[0]:
                out.append(n)
                keep.append(e)
        for e in keep:
            heapq.heappush(self._cands, e)
        return out

    # -- a round -------------------------------------------------------------------------------
    def _parents(self, exclude: set[int]) -> list[Node]:
        """Eligible parents, best first (or shuffled with ``parents="random"``)."""
        cfg = self.config
        parents = sorted((n for n in self.running() if self._eligible(n)
                          and n.id not in exclude),
                         key=_evict_key, reverse=True)
        if cfg.parents == "random":  # deterministic: a function of the round's state
            key = hash((self.rounds, len(self.nodes), tuple((p.id, p.score) for p in parents)))
            random.Random(key).shuffle(parents)
        return parents

    def _fill(self, slots: int, parents: list[Node]) -> tuple[list[Action], list[int]]:
        """``slots`` forks from ``parents`` round-robin (a parent at its ``max_children``, or
        whose lineage holds ``max_lineage`` active traces, drops out), fresh samples when none
        is left."""
        cfg = self.config
        acts: list[Action] = []
        used: list[int] = []
        parents = list(parents)
        load = (Counter(self.root_of(n.id) for n in self.active()) if cfg.max_lineage
                else None)
        i = 0
        for _ in range(max(0, slots)):
            if cfg.max_children:
                parents = [p for p in parents if self._eligible(p)]
            if load is not None:
                parents = [p for p in parents if load[self.root_of(p.id)] < cfg.max_lineage]
            if parents:
                p = parents[i % len(parents)]
                i += 1
                acts.append(self._fork(p))
                used.append(p.id)
                if load is not None:
                    load[self.root_of(p.id)] += 1
            else:
                acts.append(Spawn(self._new_root().id))
        return acts, used

    def root_of(self, node_id: int) -> int:
        """The root of ``node_id``'s lineage (itself for a root)."""
        return self._root.get(node_id, node_id)

    def _refill(self) -> list[Action]:
        """Refill the pool on the event that opened room in it."""
        if self.done:
            return []
        room = self.room()
        if room == 0:  # the common case: no parents to rank
            return []
        # _fill forks from parents[i % len(parents)], i < room: only the best `room` matter
        # (with max_lineage, the best `room` may all be in full lineages: rank them all)
        parents = (self._top_parents(room)
                   if self.config.parents == "top" and not self.config.max_lineage
                   else self._parents(set()))
        acts, _ = self._fill(room, parents)
        return acts

    def round(self) -> list[Action]:
        """One tournament round (normally triggered by :class:`Progress`)."""
        cfg = self.config
        self.rounds += 1
        w = cfg.warmup
        rankable = sorted((n for n in self.active() if n.state is NodeState.GHOST
                           or (n.score is not None and n.length >= w)),
                          key=lambda n: _rank_key(n, w))
        victims: list[Node] = []
        allowed = (len(rankable) if cfg.max_prunes is None
                   else max(0, cfg.max_prunes - self.counts["prunes"]))
        if cfg.floor > 0:
            victims = [n for n in rankable if _rank_key(n, w)[0] and n.score < cfg.floor]  # type: ignore[operator]
            victims = victims[:allowed]  # rankable is sorted worst first
        vset = {n.id for n in victims}
        rest = [n for n in rankable if n.id not in vset]
        parents = self._parents(vset)
        for v in victims:  # the floor's victims give their places back first
            self._end(v, NodeState.PRUNED)
        if self.room() == 0:  # a full pool: a zero-sum swap of k
            k = min(cfg.swap, len(rest) // 2, allowed - len(victims))
            bottom = rest[:k]
            bottom_ids = {n.id for n in bottom}
            k = min(k, len([p for p in parents if p.id not in bottom_ids]))
            for v in bottom[:k]:
                self._end(v, NodeState.PRUNED)
                victims.append(v)
            vset = {n.id for n in victims}
            parents = [p for p in parents if p.id not in vset]
        acts, used = self._fill(self.room(), parents)
        for v in victims:
            self.counts["prunes"] += 1
            acts.append(Prune(v.id))
        self.round_log.append({"round": self.rounds, "step": self.steps,
                               "active": self.num_active, "pruned": len(victims),
                               "parents": used, "ghosts": self.num_ghosts})
        return acts

    def stats(self) -> dict:
        """Tree statistics plus parent diversity (distinct parents per round that forked, and
        the share of all forks taken from each round's most used parent), traces started and
        why the question ended."""
        st = super().stats()
        forked = [r["parents"] for r in self.round_log if r["parents"]]
        st["rounds"] = self.rounds
        st["end_reason"] = self.end_reason
        st["distinct_parents_per_round"] = (
            round(sum(len(set(p)) for p in forked) / len(forked), 3) if forked else 0.0)
        st["top_parent_share"] = (
            round(sum(max(p.count(x) for x in p) for p in forked)
                  / sum(len(p) for p in forked), 3) if forked else 0.0)
        return st

    def _fork(self, p: Node) -> Fork:
        cfg = self.config
        at = self._branch_at(p)
        child = self._new_child(p, at)
        self._children[p.id] = self._children.get(p.id, 0) + 1
        self._root[child.id] = self.root_of(p.id)
        self._inherit_points(child)
        # the engine multiplies the parent's temperature: a root's is T, a child's T x m
        mult = cfg.child_temperature if p.depth == 0 else 1.0
        return Fork(child.id, p.id, at, mult)

    # -- memory --------------------------------------------------------------------------------
    def _on_memory(self, e: MemoryPressure) -> list[Action]:
        acts: list[Action] = []
        if e.evict > 0 and self.config.ghosts:
            run = self.running()
            scored = [n for n in run if n.score is not None]
            pool = sorted(scored or run, key=_evict_key)
            for n in pool[: max(0, min(e.evict, len(run) - 1))]:
                self._set_state(n, NodeState.GHOST)
                n.evictions += 1
                self.counts["ghosts"] += 1
                acts.append(Evict(n.id))
        if e.revive > 0:
            left = e.revive
            if self.config.revive:
                w = self.config.warmup
                for n in sorted(self.ghosts(), key=lambda n: _rank_key(n, w),
                                reverse=True)[:left]:
                    acts.append(self._revive(n))
                    left -= 1
            if left > 0 and self.limit < self.config.capacity:  # grow back toward C
                self.limit = min(self.config.capacity, self.limit + left)
                acts += self._refill()
        return acts

    def wants(self) -> int:
        """Traces this question would put on the engine if KV allowed: its ghosts (with
        revival on) and what it lacks of C (a question admitted below C)."""
        if self.done:
            return 0
        cfg = self.config
        g = self.num_ghosts if cfg.revive else 0
        useful = cfg.capacity
        if cfg.drain:
            useful = min(useful, self.budget - self.counts["completions"])
        return g + max(0, min(cfg.capacity - self.limit, useful - self.num_active))
