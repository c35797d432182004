"""The trace table both engines keep: one record per trace, and the reading and lifecycle
rules of :class:`~gambit_search.engine.Engine` that do not depend on the engine underneath.

:class:`TraceRecord` holds what every engine knows about a trace (prompt, spec, seed, parent,
delivered output, status, incarnation, finish, last boundary event, sampled log-probs); an
engine subclasses it for its own per-trace state. :class:`TraceTable` assigns the ids and
answers the :class:`~gambit_search.engine.Engine` methods that only read or check the table
(``trace_info``, ``trace_ids``, ``last_boundary``, ``release``, the status checks of
``fork`` / ``evict`` / ``revive`` and where a fork branches), with the same errors in both
engines. Used by :class:`~gambit_search.fake_engine.FakeEngine` and
:class:`~gambit_search.vllm_engine.VLLMEngine`::

    self._traces: TraceTable[MyTrace] = TraceTable()
    t = self._traces.add(MyTrace(self._traces.new_id(), prompt, spec, seed, None))
    info = self._traces.info(t.id)
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Generic, NamedTuple, TypeVar

from gambit_search.engine import (
    BoundaryEvent,
    EngineError,
    SamplingSpec,
    TraceId,
    TraceInfo,
    TraceStatus,
)

__all__ = ["ForkPlan", "TraceRecord", "TraceTable"]


@dataclass
class TraceRecord:
    """What an engine keeps about one trace (engines subclass it for their own state)."""

    id: int
    prompt: list[int]
    """Its own prompt (a fork's: the parent's prompt + output at the fork)."""
    spec: SamplingSpec
    seed: int
    """Seed of the current request."""
    parent: int | None
    output: list[int] = field(default_factory=list)
    """Delivered output tokens."""
    status: TraceStatus = TraceStatus.RUNNING
    incarnation: int = 0
    finish_reason: str | None = None
    error: str | None = None
    num_cached_tokens: int | None = None
    last_emitted: int = -1
    """Output index of the last boundary event (-1: none yet)."""
    last_event: BoundaryEvent | None = None
    lps: list[float] = field(default_factory=list)
    """Sampled log-prob by output index (NaN: unknown)."""

    def info(self) -> TraceInfo:
        """A read-only snapshot."""
        return TraceInfo(self.id, self.status, tuple(self.prompt), tuple(self.output),
                         self.spec, self.seed, self.parent, self.incarnation,
                         self.finish_reason, self.num_cached_tokens, self.error)


T = TypeVar("T", bound=TraceRecord)


class ForkPlan(NamedTuple):
    """Where and how a fork branches (see :meth:`TraceTable.fork_plan`)."""

    parent: TraceRecord
    prompt: list[int]
    """The child's prompt: the parent's prompt + output up to the cut."""
    spec: SamplingSpec
    """The parent's spec at the scaled temperature, ``max_tokens = max(1, budget)``."""
    budget: int
    """The child's token budget (what the parent had left at the cut, unless given)."""


class TraceTable(Generic[T]):
    """Traces by id, oldest first. ``get`` raises :class:`EngineError` for an unknown id;
    ``find`` returns None; ``by_id`` is the underlying dict (hot loops read it directly)."""

    def __init__(self) -> None:
        self.by_id: dict[int, T] = {}
        self._next_id = 0

    def new_id(self) -> TraceId:
        """A fresh trace id (never reused)."""
        tid = self._next_id
        self._next_id += 1
        return tid

    def add(self, t: T) -> T:
        self.by_id[t.id] = t
        return t

    def get(self, trace: TraceId) -> T:
        t = self.by_id.get(trace)
        if t is None:
            raise EngineError(f"unknown trace {trace}")
        return t

    def find(self, trace: TraceId) -> T | None:
        return self.by_id.get(trace)

    def __iter__(self) -> Iterator[T]:
        return iter(self.by_id.values())

    def __len__(self) -> int:
        return len(self.by_id)

    # -- the Engine methods that only read or check the table -----------------------------
    def ids(self) -> list[TraceId]:
        """:meth:`Engine.trace_ids`."""
        return list(self.by_id)

    def info(self, trace: TraceId) -> TraceInfo:
        """:meth:`Engine.trace_info`."""
        return self.get(trace).info()

    def last_boundary(self, trace: TraceId, captures: bool) -> BoundaryEvent | None:
        """:meth:`Engine.last_boundary` (``captures``: whether the engine captures)."""
        if not captures:
            raise EngineError("hidden states were not captured: the engine runs with "
                              "capture_hidden=False")
        return self.get(trace).last_event

    def release(self, trace: TraceId) -> None:
        """:meth:`Engine.release`."""
        t = self.get(trace)
        if t.status not in (TraceStatus.FINISHED, TraceStatus.ABORTED):
            raise EngineError(f"cannot release trace {trace}: it is {t.status.value} (abort it first)")
        del self.by_id[trace]

    def expect(self, trace: TraceId, verb: str, *statuses: TraceStatus) -> T:
        """The trace, when its status is one of ``statuses``; else :class:`EngineError`
        "cannot <verb> trace <id>: it is <status>"."""
        t = self.get(trace)
        if t.status not in statuses:
            raise EngineError(f"cannot {verb} trace {trace}: it is {t.status.value}")
        return t

    def fork_plan(self, parent: TraceId, temperature_multiplier: float,
                  max_tokens: int | None, at: int | None) -> ForkPlan:
        """Check a :meth:`Engine.fork` and work out the child: the parent must be running or
        evicted, ``0 <= at <= len(output)`` (None: all of it), the multiplier >= 0."""
        p = self.expect(parent, "fork", TraceStatus.RUNNING, TraceStatus.EVICTED)
        if temperature_multiplier < 0:
            raise EngineError(f"temperature_multiplier must be >= 0, got "
                              f"{temperature_multiplier}")
        cut = len(p.output) if at is None else int(at)
        if not 0 <= cut <= len(p.output):
            raise EngineError(f"cannot fork trace {parent} at output token {cut}: it has "
                              f"{len(p.output)}")
        budget = p.spec.max_tokens - cut if max_tokens is None else int(max_tokens)
        spec = replace(p.spec, temperature=p.spec.temperature * temperature_multiplier,
                       max_tokens=max(1, budget))
        return ForkPlan(p, p.prompt + p.output[:cut], spec, budget)
