"""What every search method's per-question state machine speaks: events in, actions out.

A *policy* owns one question. The driver (:mod:`gambit_search.driver`) turns engine output
into :data:`Event` values, feeds them to the question's policy, and carries out the
:data:`Action` values it returns on the engine. A policy never calls the engine, so tests
drive it directly (``tests/test_tournament.py``) and an async server can drive it later.

Nodes are the policy's own integer ids (0, 1, ...), one per trace it asked for; the driver
maps them to engine traces. Output indices in events are in the node's *own* coordinates
(the engine's: 0 is the first token the node generated itself).

:class:`NodeBook` is the bookkeeping every policy shares: the tree (parent, depth, state,
inherited prefix, own tokens, score history, answer), unique-token accounting, votes and
the tree export. ``gambit_search.methods.sc`` is the smallest policy built on it.
:class:`Policy` is the protocol every policy meets.

Bookkeeping that scales: the book keeps an index of its nodes by state, updated on every
state change (:meth:`NodeBook._set_state`, the one way to change a node's state; ``state``
is read-only), so the counts (:attr:`NodeBook.num_active` ...) cost O(1) and a list of one
state's nodes (:meth:`NodeBook.running` ...) costs its length, never the whole tree. Lists
come in node-id order, as a scan of the tree would give them.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

__all__ = [
    "Action", "Event", "Evict", "Finished", "Fork", "MemoryPressure", "Node", "NodeBook",
    "NodeDelta", "NodeState", "Policy", "Progress", "Prune", "Revive", "Scored", "Spawn", "Stop",
]


# ----------------------------------------------------------------------------- events


@dataclass(frozen=True, slots=True)
class Scored:
    """The trace score of ``node`` after its thought boundary at ``output_index``."""

    node: int
    output_index: int
    score: float


@dataclass(frozen=True, slots=True)
class Finished:
    """``node`` stopped on its own: ``reason`` "stop" / "length" (it completed and votes with
    ``answer``, None when it has none) or "error" (it failed; ``error`` says why)."""

    node: int
    reason: str
    answer: str | None = None
    error: str | None = None
    last: bool = True
    """False while more of the question's traces finish in the same engine step: a policy
    refills at the last one, so it never forks from a trace that has finished unannounced."""


@dataclass(frozen=True, slots=True)
class NodeDelta:
    """New tokens of one node in one engine step (log-probs when the method asked)."""

    token_ids: tuple[int, ...]
    logprobs: tuple | None = None


@dataclass(frozen=True, slots=True)
class Progress:
    """One engine step's new tokens of the question's nodes, delivered after that step's
    :class:`Scored` and :class:`Finished` events. A step in which the question generated any
    token is one *decode step of the question* (the tournament's interval unit)."""

    deltas: Mapping[int, NodeDelta]


@dataclass(frozen=True, slots=True)
class MemoryPressure:
    """The driver asks the question to give up ``evict`` traces' KV (ghosts) and may take
    back ``revive`` ghosts."""

    evict: int = 0
    revive: int = 0


Event = Scored | Finished | Progress | MemoryPressure


# ----------------------------------------------------------------------------- actions


@dataclass(frozen=True, slots=True)
class Spawn:
    """Start ``node`` as a fresh trace on the question's prompt."""

    node: int


@dataclass(frozen=True, slots=True)
class Fork:
    """Start ``node`` from ``parent``'s prefix: its first ``at`` own output tokens (None: all
    delivered so far), temperature multiplied by ``temperature_multiplier``, a fresh seed."""

    node: int
    parent: int
    at: int | None = None
    temperature_multiplier: float = 1.0


@dataclass(frozen=True, slots=True)
class Prune:
    """Abort ``node`` (running or ghost); it leaves the search and does not vote."""

    node: int


@dataclass(frozen=True, slots=True)
class Evict:
    """Free ``node``'s KV and keep its tokens: a ghost."""

    node: int


@dataclass(frozen=True, slots=True)
class Revive:
    """Put ghost ``node`` back on the engine."""

    node: int


@dataclass(frozen=True, slots=True)
class Stop:
    """The question is done: abort ``nodes`` (still active; they do not vote)."""

    nodes: tuple[int, ...]


Action = Spawn | Fork | Prune | Evict | Revive | Stop


# ----------------------------------------------------------------------------- the protocol


class Policy(Protocol):
    """One question's state machine, as the driver runs it."""

    done: bool
    """The question is over: the driver collects its votes and tree."""

    def start(self, limit: int | None = None) -> list[Action]:
        """The first actions. ``limit``: most traces to start, when the driver's KV share for
        the question holds fewer than the policy would start (None: no such bound); a policy
        that starts fewer grows later on :class:`MemoryPressure` with ``revive``."""
        ...

    def handle(self, event: Event) -> list[Action]:
        """The actions answering ``event``."""
        ...

    def stop(self) -> list[Action]:
        """End the question now (the driver's stop): abort what still runs."""
        ...

    def running(self) -> list[int]: ...

    def ghosts(self) -> list[int]: ...

    def votes(self) -> list[tuple[int, str | None, float | None]]: ...

    def stats(self) -> dict: ...

    def tree(self) -> list[dict]: ...


# ----------------------------------------------------------------------------- the tree


class NodeState(enum.StrEnum):
    RUNNING = "running"
    """On the engine (scheduled or queued)."""
    GHOST = "ghost"
    """Evicted under memory pressure: no KV, generates nothing, still logically active."""
    COMPLETED = "completed"
    """Finished on its own (stop or length): votes once."""
    PRUNED = "pruned"
    """Removed by the search."""
    STOPPED = "stopped"
    """Still active when the question ended: does not vote."""
    FAILED = "failed"
    """The engine failed it."""


ACTIVE = (NodeState.RUNNING, NodeState.GHOST)


@dataclass
class Node:
    """One trace of the search tree. Token positions ``*_at`` are the question's unique-token
    counter at that moment (a clock shared by all nodes of the question)."""

    id: int
    parent: int | None
    depth: int
    inherited: int
    """Output tokens taken over from the parent's lineage (0 for a root)."""
    created_at: int
    _state: NodeState = NodeState.RUNNING
    """Read through ``state``; changed only by the book (:meth:`NodeBook._set_state`)."""
    generated: int = 0
    """Tokens generated since its own creation (the unique-token unit)."""
    scores: list[tuple[int, float]] = field(default_factory=list)
    """(lineage output index, trace score) per scored boundary; a child starts with a copy of
    its parent's entries up to the branch point."""
    n_inherited_scores: int = 0
    ended_at: int | None = None
    answer: str | None = None
    finish_reason: str | None = None
    error: str | None = None
    evictions: int = 0

    @property
    def state(self) -> NodeState:
        """Where the node is. Read-only: its book changes it (:meth:`NodeBook._set_state`),
        keeping the book's index by state."""
        return self._state

    @property
    def score(self) -> float | None:
        """The current trace score (None before the first scored boundary)."""
        return self.scores[-1][1] if self.scores else None

    @property
    def length(self) -> int:
        """Lineage output length: inherited + own tokens."""
        return self.inherited + self.generated

    def to_json(self) -> dict:
        return {
            "id": self.id, "parent": self.parent, "depth": self.depth, "state": self.state.value,
            "inherited": self.inherited, "generated": self.generated,
            "created_at": self.created_at, "ended_at": self.ended_at,
            "pruned_at": self.ended_at if self.state is NodeState.PRUNED else None,
            "completed_at": self.ended_at if self.state is NodeState.COMPLETED else None,
            "scores": [[i, round(s, 6)] for i, s in self.scores],
            "n_inherited_scores": self.n_inherited_scores, "answer": self.answer,
            "finish_reason": self.finish_reason, "error": self.error,
            "evictions": self.evictions,
        }


class NodeBook:
    """Shared per-question bookkeeping. Subclasses decide what to do with events."""

    def __init__(self) -> None:
        self.nodes: dict[int, Node] = {}
        self._by_state: dict[NodeState, dict[int, Node]] = {s: {} for s in NodeState}
        """The index: state -> {id: node} of the nodes in it, in id order unless the state
        is in ``_unsorted``."""
        self._top_id: dict[NodeState, int] = dict.fromkeys(NodeState, -1)
        """Largest id ever put in each state (an id below it arrives out of order)."""
        self._unsorted: set[NodeState] = set()
        self.unique_tokens = 0
        self.steps = 0
        """Decode steps of the question so far."""
        self.done = False
        self.counts = {"spawns": 0, "branches": 0, "prunes": 0, "ghosts": 0, "revivals": 0,
                       "completions": 0, "failures": 0, "stopped": 0}

    # -- tree changes --------------------------------------------------------------------------
    def _add(self, n: Node) -> None:
        self.nodes[n.id] = n
        self._file(n, n.state)

    def _file(self, n: Node, state: NodeState) -> None:
        """Put ``n`` in ``state``'s index (its id order broken when a larger id is there)."""
        if n.id < self._top_id[state]:
            self._unsorted.add(state)
        else:
            self._top_id[state] = n.id
        self._by_state[state][n.id] = n

    def _set_state(self, n: Node, state: NodeState) -> None:
        """Move ``n`` to ``state``, index included (O(1))."""
        old = n.state
        if old is state:
            return
        del self._by_state[old][n.id]
        self._file(n, state)
        n._state = state

    def _new_root(self) -> Node:
        n = Node(len(self.nodes), None, 0, 0, self.unique_tokens)
        self._add(n)
        self.counts["spawns"] += 1
        return n

    def _new_child(self, parent: Node, at: int | None) -> Node:
        """A child of ``parent`` cut after ``at`` own output tokens (None: all)."""
        cut = parent.length if at is None else parent.inherited + at
        n = Node(len(self.nodes), parent.id, parent.depth + 1, cut, self.unique_tokens)
        n.scores = [(i, s) for i, s in parent.scores if i < cut]
        n.n_inherited_scores = len(n.scores)
        self._add(n)
        self.counts["branches"] += 1
        return n

    def _end(self, n: Node, state: NodeState) -> None:
        self._set_state(n, state)
        n.ended_at = self.unique_tokens

    # -- shared event handling -----------------------------------------------------------------
    def _on_scored(self, e: Scored) -> None:
        n = self.nodes[e.node]
        if n.state not in ACTIVE:
            return
        if not math.isfinite(e.score):
            raise ValueError(f"node {e.node}: score {e.score} is not finite")
        n.scores.append((n.inherited + e.output_index, float(e.score)))

    def _on_finished(self, e: Finished) -> None:
        n = self.nodes[e.node]
        if n.state not in ACTIVE:
            return  # e.g. finished in the step it was pruned: it does not vote
        n.finish_reason = e.reason
        if e.reason == "error":
            n.error = e.error
            self._end(n, NodeState.FAILED)
            self.counts["failures"] += 1
        else:
            n.answer = e.answer
            self._end(n, NodeState.COMPLETED)
            self.counts["completions"] += 1

    def _after_done(self, e: Event) -> bool:
        """True once the question is done: the event then needs no action (a
        :class:`Progress` still counts its tokens, the last step's)."""
        if not self.done:
            return False
        if isinstance(e, Progress):
            self._on_progress(e)
        return True

    def _on_progress(self, e: Progress) -> bool:
        """Count tokens; True when this was a decode step of the question."""
        got = False
        for node, d in e.deltas.items():
            n = self.nodes[node]
            k = len(d.token_ids)
            if k:
                n.generated += k
                self.unique_tokens += k
                got = True
        if got:
            self.steps += 1
        return got

    def stop(self) -> list[Action]:
        """End the question: active nodes are stopped and do not vote."""
        self.done = True
        left = tuple(n.id for n in self.active())
        for i in left:
            self._end(self.nodes[i], NodeState.STOPPED)
        self.counts["stopped"] += len(left)
        return [Stop(left)] if left else []

    # -- reading -------------------------------------------------------------------------------
    def in_state(self, state: NodeState) -> list[Node]:
        """The nodes in ``state``, in id order (O(their number))."""
        d = self._by_state[state]
        if state in self._unsorted:
            d = self._by_state[state] = dict(sorted(d.items()))
            self._unsorted.discard(state)
            self._top_id[state] = next(reversed(d), -1)
        return list(d.values())

    def num_in(self, state: NodeState) -> int:
        """How many nodes are in ``state`` (O(1))."""
        return len(self._by_state[state])

    def active(self) -> list[Node]:
        """Running nodes and ghosts, in id order."""
        run, ghosts = self.in_state(NodeState.RUNNING), self.in_state(NodeState.GHOST)
        if not ghosts:
            return run
        return sorted(run + ghosts, key=lambda n: n.id) if run else ghosts

    def running(self) -> list[Node]:
        return self.in_state(NodeState.RUNNING)

    def ghosts(self) -> list[Node]:
        return self.in_state(NodeState.GHOST)

    def completed(self) -> list[Node]:
        return self.in_state(NodeState.COMPLETED)

    @property
    def num_running(self) -> int:
        return len(self._by_state[NodeState.RUNNING])

    @property
    def num_ghosts(self) -> int:
        return len(self._by_state[NodeState.GHOST])

    @property
    def num_active(self) -> int:
        """Running nodes + ghosts."""
        return len(self._by_state[NodeState.RUNNING]) + len(self._by_state[NodeState.GHOST])

    @property
    def num_completed(self) -> int:
        return len(self._by_state[NodeState.COMPLETED])

    def votes(self) -> list[tuple[int, str | None, float | None]]:
        """(node, answer, final trace score) of every completed node, once each."""
        return [(n.id, n.answer, n.score) for n in self.completed()]

    def stats(self) -> dict:
        """Tree statistics: nodes, branches, prunes, ghosts, completions, depth, prefixes."""
        inh = sorted(n.inherited for n in self.nodes.values() if n.parent is not None)
        return {
            "nodes": len(self.nodes), **self.counts,
            "started": self.counts["spawns"] + self.counts["branches"],
            "max_depth": max((n.depth for n in self.nodes.values()), default=0),
            "unique_tokens": self.unique_tokens, "decode_steps": self.steps,
            "inherited_prefix": {
                "mean": round(sum(inh) / len(inh), 2) if inh else 0.0,
                "median": inh[len(inh) // 2] if inh else 0, "max": inh[-1] if inh else 0,
            },
        }

    def tree(self) -> list[dict]:
        """Every node, for ``trees/<question>.json``."""
        return [n.to_json() for n in self.nodes.values()]
