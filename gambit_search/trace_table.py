"""The trace table both engines keep: one record per trace, and the reading and lifecycle
rules of :class:`~gambit_search.engine.Engine` that do not depend on the engine underneath.

:class:`TraceRecord` holds what every engine knows about a trace (prompt, spec, seed, parent,
delivered output, status, incarnation, finish, last boundary event, sampled log-probs); an
engine subclasses it for its own per-trace state. :class:`TraceTable` assigns the ids and
answers the :class:`~gambit_search.engine.Engine` methods that only read or check the table
(``trace_info``, ``trace_ids``, ``last_boundary``, ``release``, the status checks of
``fork`` / ``evict`` / ``revive`` and where a fork branches), with the same errors in both
engines. :class:`TableEngine` is the engines' one lifecycle over the table: ``add_trace``,
``fork``, ``abort``, ``evict``, ``revive``, ``release`` and the reading methods, written once,
with the model's facts and the context rule (a request's token budget, or the error of a
prompt that fills the context), and with hooks for what differs
(:meth:`~TableEngine._submit` a trace's request, :meth:`~TableEngine._drop_request` it, make
a record, derive a revive's seed). Used by
:class:`~gambit_search.fake_engine.FakeEngine` and :class:`~gambit_search.vllm_engine.VLLMEngine`::

    class MyEngine(TableEngine):
        def __init__(self):
            self._facts = ...                # has hidden_size, block_size, max_model_len
            self._traces: TraceTable[MyTrace] = TraceTable()
            self._errors: list[Delta] = []
        def _new_trace(self, prompt, spec, seed, parent): ...   # a MyTrace in the table
        def _submit(self, t, max_tokens): ...                  # self._budget(...), start it
        def _drop_request(self, t): ...                        # end it (evict, abort)
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Generic, NamedTuple, TypeVar

from gambit_search.engine import (
    BoundaryEvent,
    Delta,
    Engine,
    EngineError,
    SamplingSpec,
    TraceId,
    TraceInfo,
    TraceStatus,
)

__all__ = ["ForkPlan", "TableEngine", "TraceRecord", "TraceTable"]


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


class TableEngine(Engine, Generic[T]):
    """An :class:`~gambit_search.engine.Engine` whose traces live in a :class:`TraceTable`:
    the trace lifecycle both engines share (see the module docstring).

    A subclass sets ``config`` (its settings, with ``capture_hidden``), ``_facts`` (what
    knows the model's ``hidden_size``, ``block_size`` and ``max_model_len``), ``_traces`` (its
    table) and ``_errors`` (finishing deltas of traces that failed outside a step, delivered
    by its next step), and implements the hooks :meth:`_new_trace`, :meth:`_submit`,
    :meth:`_drop_request` and :meth:`_revive_seed`; its :meth:`_submit` takes its request's
    token budget from :meth:`_budget`."""

    config: Any
    _facts: Any
    _traces: TraceTable[T]
    _errors: list[Delta]

    @property
    def captures_hidden(self) -> bool:
        return self.config.capture_hidden

    # -- hooks ----------------------------------------------------------------------------
    @abstractmethod
    def _new_trace(self, prompt: list[int], spec: SamplingSpec, seed: int | None,
                   parent: T | None) -> T:
        """A new record in the table (``seed`` None: the engine's own; ``parent``: the
        forked trace's record, None for a new trace)."""

    @abstractmethod
    def _submit(self, t: T, max_tokens: int) -> None:
        """Start the current incarnation of ``t`` (status RUNNING) with ``max_tokens`` left;
        a request the engine refuses fails ``t`` only (:meth:`_fail`)."""

    @abstractmethod
    def _drop_request(self, t: T) -> None:
        """End the running ``t``'s current request (evict, abort): off the engine, and
        nothing undelivered of it is delivered later."""

    @abstractmethod
    def _revive_seed(self, t: T) -> int:
        """The seed of ``t``'s request once revived (``t.incarnation`` already counts it)."""

    def _check_open(self) -> None:  # noqa: B027 - optional hook
        """Raise :class:`EngineError` when the engine can no longer start requests."""

    def _after_abort(self, t: T) -> None:  # noqa: B027 - optional hook
        """Called once ``t`` is marked aborted."""

    # -- the model: its facts and its context ---------------------------------------------
    @property
    def hidden_size(self) -> int:
        return self._facts.hidden_size

    @property
    def block_size(self) -> int:
        return self._facts.block_size

    @property
    def max_model_len(self) -> int:
        return self._facts.max_model_len

    def _budget(self, t: T, n_tokens: int, max_tokens: int) -> int | None:
        """The output tokens a request of ``t`` over ``n_tokens`` tokens may take, with
        ``max_tokens`` left: that, cut to the context; None when it cannot start, and ``t``
        failed ("error" when the tokens fill the context, "length" when no budget is left)."""
        if n_tokens >= self.max_model_len:
            self._fail(t, "error", f"prompt of {n_tokens} tokens does not fit the context of "
                       f"{self.max_model_len}")
            return None
        if max_tokens < 1:
            self._fail(t, "length", None)
            return None
        return min(max_tokens, self.max_model_len - n_tokens)

    def _fail(self, t: T, reason: str, msg: str | None) -> None:
        """End ``t`` outside a step: finished with ``reason`` ("error" with ``msg``, or
        "length"); its finishing delta goes out with the next step."""
        t.status = TraceStatus.FINISHED
        t.finish_reason = reason
        t.error = msg
        self._errors.append(Delta(t.id, (), "", reason, error=msg))

    # -- traces ---------------------------------------------------------------------------
    def add_trace(self, prompt_ids: Sequence[int], spec: SamplingSpec,
                  seed: int | None = None) -> TraceId:
        self._check_open()
        prompt = [int(i) for i in prompt_ids]
        if not prompt:
            raise EngineError("prompt_ids is empty")
        t = self._new_trace(prompt, spec, seed, None)
        self._submit(t, spec.max_tokens)
        return t.id

    def fork(self, parent: TraceId, temperature_multiplier: float = 1.0,
             seed: int | None = None, max_tokens: int | None = None,
             at: int | None = None) -> TraceId:
        self._check_open()
        plan = self._traces.fork_plan(parent, temperature_multiplier, max_tokens, at)
        child = self._new_trace(plan.prompt, plan.spec, seed, plan.parent)
        self._submit(child, plan.budget)
        return child.id

    def abort(self, trace: TraceId) -> None:
        t = self._traces.get(trace)
        if t.status in (TraceStatus.FINISHED, TraceStatus.ABORTED):
            return
        if t.status is TraceStatus.RUNNING:
            self._drop_request(t)
        t.status = TraceStatus.ABORTED
        t.finish_reason = "abort"
        self._after_abort(t)

    def release(self, trace: TraceId) -> None:
        self._traces.release(trace)

    def evict(self, trace: TraceId) -> None:
        t = self._traces.expect(trace, "evict", TraceStatus.RUNNING)
        self._drop_request(t)
        t.status = TraceStatus.EVICTED

    def revive(self, trace: TraceId) -> None:
        self._check_open()
        t = self._traces.expect(trace, "revive", TraceStatus.EVICTED)
        t.incarnation += 1
        t.seed = self._revive_seed(t)
        self._submit(t, t.spec.max_tokens - len(t.output))

    # -- reading --------------------------------------------------------------------------
    def trace_info(self, trace: TraceId) -> TraceInfo:
        return self._traces.info(trace)

    def trace_ids(self) -> list[TraceId]:
        return self._traces.ids()

    def last_boundary(self, trace: TraceId) -> BoundaryEvent | None:
        return self._traces.last_boundary(trace, self.captures_hidden)
