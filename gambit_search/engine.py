"""The engine interface Gambit's search is written against (no vLLM import: instant).

Search needs five things from an inference engine: stream tokens per trace, the hidden state
at every thought boundary, fork a trace from its current prefix cheaply, drop or evict a
trace, and see memory pressure. :class:`Engine` is that contract; two implementations:

* :class:`gambit_search.vllm_engine.VLLMEngine`: stock vLLM (the real thing).
* :class:`gambit_search.fake_engine.FakeEngine`: scripted and deterministic, for fast
  algorithm tests.

Both keep their traces in a :class:`gambit_search.trace_table.TraceTable`, which answers the
reading and lifecycle checks below alike for the two.

A *trace* is one logical reasoning path. Traces of many questions share one engine; each
has an integer id, a prompt (token ids), a :class:`SamplingSpec`, and the output tokens
generated so far. Its life::

    add_trace / fork ──> RUNNING ──step()──> FINISHED (stop | length | error)
                            │  ▲
                     evict  │  │ revive                 abort (any live state) ──> ABORTED
                            ▼  │
                          EVICTED (a ghost: tokens kept, no KV, generates nothing)

A FINISHED or ABORTED trace stays readable until :meth:`Engine.release` forgets it (long
runs release what they have read, so the engine's memory stays bounded).

Delivered tokens: a trace's tokens are the ones :meth:`Engine.step` has delivered in its
deltas, nothing more. An engine may have generated tokens it has not delivered yet (the vLLM
engine holds a finishing delta back until the trace's last hidden states are in, see below);
until their delta comes, the trace is a running trace whose newest tokens do not exist yet:
it reads RUNNING, :meth:`Engine.trace_info` and :meth:`Engine.sampled_logprobs` show only the
delivered tokens, no event refers to an undelivered token, :meth:`Engine.fork` branches from
the delivered prefix, and :meth:`Engine.evict` / :meth:`Engine.abort` drop the undelivered
tokens (a revived ghost regenerates from the delivered ones). So a caller never has to know
whether an engine holds anything back.

Driving loop::

    eng = VLLMEngine(VLLMEngineConfig(model="checkpoints/toy-policy"))
    t = eng.add_trace(prompt_ids, SamplingSpec(temperature=0.8, max_tokens=256), seed=1)
    while eng.has_unfinished():
        out = eng.step()
        for d in out.deltas:      # new tokens / text / finish reason per trace
            ...
        for b in out.boundaries:  # hidden state at a thought boundary (float32 vector)
            ...

Boundary timing (both implementations): the state *at* a boundary token is computed when
that token is fed back to the model, so its :class:`BoundaryEvent` comes in the same or a
later :class:`StepOutput` than the :class:`Delta` carrying the token (usually one or two
steps later), never earlier, and never later than the trace's finishing delta: when a
trace's finishing delta arrives, all its events have arrived (the vLLM engine may hold a
finishing delta back a step or two for that: see "Delivered tokens"). When a trace stops
right after a boundary token (EOS, length, abort or evict), that one state is never computed
and no event is emitted for it. Events of aborted traces are dropped; those of an evicted
trace (a ghost) that the engine had computed still come.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from gambit_core.sampling import sampling_problem

__all__ = [
    "BoundaryEvent",
    "Delta",
    "Engine",
    "EngineDied",
    "EngineError",
    "MemorySnapshot",
    "SamplingSpec",
    "StepOutput",
    "TokenLogprobs",
    "TraceId",
    "TraceInfo",
    "TraceStatus",
]

TraceId = int
"""Engine-assigned integer id of a trace (unique for the engine's lifetime)."""


class EngineError(RuntimeError):
    """A misuse of the engine or a bad input, with a one-line message."""


class EngineDied(EngineError):
    """The engine's own process died (vLLM's EngineCore killed, out of memory ...): nothing
    more runs on it. Raised by :meth:`Engine.step`; a run keeps what it finished."""


class TraceStatus(enum.StrEnum):
    """Where a trace is in its life (see the module docstring)."""

    RUNNING = "running"
    """Has a live request in the engine (scheduled or waiting), or generated tokens the engine
    has not delivered yet (a held finishing delta): both read and act alike."""
    EVICTED = "evicted"
    """A ghost: tokens kept, no KV, generates nothing until :meth:`Engine.revive`."""
    FINISHED = "finished"
    """Stopped by EOS / a stop token ("stop"), its token budget ("length") or an error."""
    ABORTED = "aborted"
    """Dropped by :meth:`Engine.abort`; its tokens stay readable."""


@dataclass(frozen=True)
class SamplingSpec:
    """How a trace samples. Forks copy their parent's spec (see :meth:`Engine.fork`)."""

    temperature: float = 0.6
    """Softmax temperature; 0 is greedy."""
    top_p: float = 0.95
    """Nucleus sampling mass (1.0: off)."""
    top_k: int = 20
    """Keep the k most likely tokens (0: off)."""
    max_tokens: int = 1024
    """Most output tokens for this trace, counted from its own prompt. The engine also caps a
    trace at the model's context length."""
    min_tokens: int = 0
    """EOS / stop tokens are suppressed before this many output tokens."""
    logprobs: int | None = None
    """Return the sampled token's log-probability and the top-k ones of every generated token
    (DeepConf); 0: the sampled token's only (cheapest); None: off."""
    stop_token_ids: tuple[int, ...] = ()
    """Extra token ids that end the trace (EOS always does)."""
    ignore_eos: bool = False
    """Keep generating past EOS (benchmarks only)."""
    score: bool = True
    """Whether an engine that scores boundaries itself scores this trace's (False: the
    caller reads no scores, e.g. self-consistency, and the engine spends nothing on them)."""
    stream: bool = True
    """Deliver the trace's tokens as they are generated. False: a hint that the caller reads
    only the finished trace (the harvest); an engine may then deliver all of its tokens and
    events in the step it finishes (vLLM: ``RequestOutputKind.FINAL_ONLY``, so no per-step
    request outputs are built for it), or stream as usual (the fake engine). A fork of such
    a trace branches from what was delivered."""

    def __post_init__(self) -> None:
        problem = sampling_problem(self, flags=False)
        if problem is not None:
            raise EngineError(problem)
        if self.logprobs is not None and self.logprobs < 0:
            raise EngineError(f"logprobs must be None or >= 0, got {self.logprobs}")


@dataclass(slots=True)
class TokenLogprobs:
    """Log-probabilities at one generated position."""

    token_id: int
    """The sampled token."""
    logprob: float
    """Its log-probability."""
    top_ids: tuple[int, ...]
    """The k most likely token ids, most likely first."""
    top_logprobs: tuple[float, ...]
    """Their log-probabilities (DeepConf's token confidence is ``-mean(top_logprobs)``)."""


@dataclass(slots=True)
class Delta:
    """What one step added to one trace. Concatenating a trace's ``token_ids`` over all its
    deltas gives exactly its final output token ids. Read-only by convention (not frozen:
    one is built per trace per step)."""

    trace: TraceId
    """The trace."""
    token_ids: tuple[int, ...]
    """New output token ids (may be empty on the finishing delta of an error)."""
    text: str
    """Decoded text of the new tokens (the detokenizer may hold back partial characters)."""
    finish_reason: str | None = None
    """None while running; then "stop" (EOS or a stop token), "length" or "error"."""
    logprobs: tuple[TokenLogprobs, ...] | None = None
    """One entry per new token when the spec asked for logprobs, else None."""
    num_cached_tokens: int | None = None
    """On the first delta of a new request (add, fork, revive): how many prompt tokens came
    from the prefix cache. None on later deltas."""
    error: str | None = None
    """One-line reason when ``finish_reason == "error"``."""


@dataclass(slots=True)
class BoundaryEvent:
    """The model's last-layer, post-final-norm hidden state at a thought boundary token
    (read-only by convention)."""

    trace: TraceId
    """The trace."""
    position: int
    """Index of the boundary token in the trace's full sequence (prompt + output)."""
    output_index: int
    """Index of the boundary token in the trace's output (``position - len(prompt)``)."""
    token_id: int
    """The boundary token: the one at which the output text first holds a new "\\n\\n" (its
    own text contains it, or it is the second "\\n" of a split pair); any token in stride
    mode."""
    hidden: np.ndarray = field(repr=False)
    """float32 vector of the model's hidden size; empty (size 0) when the engine scores
    boundaries itself and was not asked to ship the states."""
    score: float | None = None
    """The trace's score after this boundary, when the engine scores boundaries itself
    (:attr:`Engine.scores_boundaries`); None otherwise. NaN: a boundary the engine's scorer
    did not score (its row came before the state it continues)."""


@dataclass
class StepOutput:
    """Everything one :meth:`Engine.step` produced."""

    deltas: list[Delta] = field(default_factory=list)
    """At most one per trace, in no particular order."""
    boundaries: list[BoundaryEvent] = field(default_factory=list)
    """In increasing position per trace."""

    @property
    def finished(self) -> list[TraceId]:
        """Traces that finished in this step."""
        return [d.trace for d in self.deltas if d.finish_reason is not None]


@dataclass(frozen=True)
class MemorySnapshot:
    """Memory pressure as of the last step (cumulative counters since the engine started)."""

    kv_usage: float
    """Fraction of KV blocks in use, 0..1."""
    total_blocks: int
    """KV blocks the engine has."""
    free_blocks: int
    """Blocks not held by any request (cached-but-free blocks count as free)."""
    block_size: int
    """Tokens per KV block."""
    num_running: int
    """Requests scheduled in the last step."""
    num_waiting: int
    """Requests queued (never started, or preempted)."""
    num_preemptions: int
    """Preemptions so far."""
    prefix_cache_queries: int
    """Prompt tokens looked up in the prefix cache so far."""
    prefix_cache_hits: int
    """Of those, tokens found."""


@dataclass(frozen=True)
class TraceInfo:
    """A read-only view of one trace."""

    trace: TraceId
    """The trace."""
    status: TraceStatus
    """Where it is in its life."""
    prompt_ids: tuple[int, ...]
    """Its own prompt (for a fork: the parent's prompt + output at the fork)."""
    output_ids: tuple[int, ...]
    """Output tokens delivered so far: exactly the concatenated ``token_ids`` of the deltas
    :meth:`Engine.step` has returned for this trace (see "Delivered tokens" in the module
    docstring)."""
    spec: SamplingSpec
    """Its sampling spec."""
    seed: int
    """Seed of its current request."""
    parent: TraceId | None
    """The trace it was forked from."""
    incarnation: int
    """0 at creation, +1 per revive."""
    finish_reason: str | None
    """See :attr:`Delta.finish_reason`."""
    num_cached_tokens: int | None
    """Prefix-cache hit of the current request, once known."""
    error: str | None = None
    """Why it failed, when it did."""


class Engine(ABC):
    """What Gambit's search needs from an inference engine.

    Calls are not thread-safe: drive one engine from one thread. Trace ids are never
    reused. Methods that take a trace raise :class:`EngineError` for an unknown id or a
    state the call does not apply to.
    """

    # -- facts ------------------------------------------------------------------------------
    @property
    @abstractmethod
    def hidden_size(self) -> int:
        """Length of every :attr:`BoundaryEvent.hidden`."""

    @property
    @abstractmethod
    def block_size(self) -> int:
        """Tokens per KV block (forks recompute at most this many prompt tokens)."""

    @property
    @abstractmethod
    def max_model_len(self) -> int:
        """Longest sequence (prompt + output) a trace may reach."""

    @property
    @abstractmethod
    def captures_hidden(self) -> bool:
        """Whether boundary hidden states are captured at all."""

    @property
    def scorer_checkpoint(self) -> str | None:
        """The scorer checkpoint the engine scores boundaries with itself, where the states
        are (resolved path; None: it does not score)."""
        return None

    @property
    def scores_boundaries(self) -> bool:
        """Whether the engine scores boundaries itself (each :class:`BoundaryEvent` carries
        ``score``; a branch's and a revived trace's scorer state follow its prompt). False:
        the caller scores ``hidden``."""
        return self.scorer_checkpoint is not None

    # -- traces -----------------------------------------------------------------------------
    @abstractmethod
    def add_trace(
        self, prompt_ids: Sequence[int], spec: SamplingSpec, seed: int | None = None
    ) -> TraceId:
        """Start a trace on ``prompt_ids`` (must be non-empty). ``seed`` fixes its sampling
        (None: derived from the engine seed and the trace id). A prompt the engine rejects
        (e.g. longer than the context) fails this trace only: it comes back from the next
        :meth:`step` as a delta with ``finish_reason="error"``."""

    @abstractmethod
    def step(self) -> StepOutput:
        """Run one engine step (when any request is live) and return new deltas and boundary
        events. Returns an empty output, without blocking, when nothing is live."""

    @abstractmethod
    def fork(
        self,
        parent: TraceId,
        temperature_multiplier: float = 1.0,
        seed: int | None = None,
        max_tokens: int | None = None,
        at: int | None = None,
    ) -> TraceId:
        """A new trace whose prompt is ``parent``'s prompt + delivered output (or its first
        ``at`` output tokens, ``0 <= at <= len(output_ids)``: a branch at an earlier point,
        e.g. the last scored boundary), sampled with the parent's spec at
        ``temperature * temperature_multiplier`` and a fresh ``seed``. Its ``max_tokens``
        defaults to what the parent had left at the branch point
        (``parent max_tokens - cut``), so the total length from the parent's prompt stays
        within the parent's budget. The parent must be running or evicted, and is not
        changed; the child reuses the parent's KV blocks through the prefix cache (at most one
        block is recomputed)."""

    @abstractmethod
    def abort(self, trace: TraceId) -> None:
        """Stop ``trace`` (running or evicted) and free its KV; it keeps its delivered tokens
        (undelivered ones are dropped). No-op on a trace that already finished or was
        aborted. No further deltas or events come for it."""

    @abstractmethod
    def evict(self, trace: TraceId) -> None:
        """Free ``trace``'s KV but keep its delivered tokens (a ghost). Must be running.
        Tokens the engine generated but :meth:`step` has not delivered yet are lost; events
        the engine had computed for delivered tokens may still come."""

    @abstractmethod
    def revive(self, trace: TraceId) -> None:
        """Re-add an evicted trace: a new request on prompt + output so far, with what is left
        of its token budget and a new seed. Its first delta reports in
        ``num_cached_tokens`` how many of those tokens came from the prefix cache."""

    @abstractmethod
    def release(self, trace: TraceId) -> None:
        """Forget a finished or aborted trace: its tokens, last boundary event and
        log-probs. A run that adds traces without end (a harvest) keeps the engine's memory
        bounded this way. Afterwards every method treats the id as unknown. Raises
        :class:`EngineError` for a live trace (abort it first)."""

    # -- reading ----------------------------------------------------------------------------
    @abstractmethod
    def trace_info(self, trace: TraceId) -> TraceInfo:
        """A snapshot of ``trace``."""

    @abstractmethod
    def trace_ids(self) -> list[TraceId]:
        """Every trace ever created, oldest first."""

    @abstractmethod
    def last_boundary(self, trace: TraceId) -> BoundaryEvent | None:
        """The latest boundary event emitted for ``trace`` (None before the first). Raises
        :class:`EngineError` when capture is off or the trace is unknown."""

    def sampled_logprobs(self, trace: TraceId) -> np.ndarray:
        """float32 [len(output_ids)]: the log-probability of each delivered output token
        under the model's unmodified distribution (raw logits: before temperature, top-k,
        top-p; vLLM's default ``raw_logprobs``), NaN where the engine does not know it.
        An engine may learn a token's value only once the token is fed back, so the last
        token of a finished trace may be NaN; every token up to the last boundary event is
        known. Cheaper than ``SamplingSpec.logprobs=0`` where the engine supports it (the
        vLLM engine with ``sampled_logprobs=True``); raises :class:`EngineError` otherwise."""
        raise EngineError(f"{type(self).__name__} does not record sampled log-probs")

    @abstractmethod
    def memory(self) -> MemorySnapshot:
        """Memory pressure as of the last step. An engine whose core steps on in a process of
        its own (vLLM) reports the stats of the last output the driver read, which may predate
        aborts and evictions issued just before that step: their KV shows as freed a step or
        two later."""

    @abstractmethod
    def has_unfinished(self) -> bool:
        """Whether any trace is running (or has an undelivered error delta)."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release the engine (idempotent)."""

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- shared helpers ---------------------------------------------------------------------
    def run_to_completion(self, max_steps: int | None = None) -> list[StepOutput]:
        """Step until nothing is live (or ``max_steps``); returns every step's output."""
        outs: list[StepOutput] = []
        while self.has_unfinished():
            if max_steps is not None and len(outs) >= max_steps:
                break
            outs.append(self.step())
        return outs
