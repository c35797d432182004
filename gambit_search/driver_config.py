"""How the driver schedules questions on the engine: :class:`DriverConfig` (read by
:mod:`gambit_search.driver`; gambit-solve, gambit-serve and gambit-harvest build one).

    from gambit_search.driver_config import DriverConfig
    DriverConfig(max_live=256, admit_on_live=True, queue=32)
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DriverConfig"]


@dataclass(frozen=True)
class DriverConfig:
    """How the driver schedules questions on the engine."""

    max_live: int = 256
    """Global limit of live traces: questions are admitted while their slots fit (one question
    is always admitted, even when it alone exceeds the limit)."""
    admit_on_live: bool = False
    """Count the traces live in the engine against ``max_live`` when admitting, instead of
    the admitted questions' slots: a question near its end then gives its finished traces'
    places to the next question at once (the harvest's setting: its SC questions' last
    traces no longer leave the engine half empty)."""
    queue: int = 0
    """Traces admitted beyond ``max_live`` to wait in vLLM's queue (the engine still runs at
    most ``max_live``, its ``max_num_seqs``): a trace that finishes or is pruned gives its
    place to a waiting one in the engine's next step, without waiting for the driver to
    learn of it and admit the next question (the harvest queues one question's traces).
    Waiting traces are not memory pressure: a ghost is revived while no more than these
    wait."""
    seed: int = 0
    """Base seed of every trace (see :func:`trace_seed`)."""
    evict_above: float = 0.97
    """KV usage at which a memory-using method is asked to evict a trace to a ghost."""
    revive_below: float = 0.75
    """KV usage under which (with nothing waiting beyond ``queue``) a ghost may be revived."""
    score_every: int = 1
    """Score waiting boundaries in one forward every N steps (also at once in any step where
    a trace finishes or memory is read). N > 1 means fewer, larger forwards (on 2 CPU cores a
    forward of 100 boundaries cost 1.7x one of 25, not 4x); a round may then rank on scores
    up to N - 1 steps old, and a branch at current tokens may miss the last unscored steps."""
    memory_every: int = 1
    """Read the engine's memory every N steps for a method that acts on it (each step: what
    vLLM would preempt next step is evicted this one; preemptions are counted cumulatively,
    so none is missed at N > 1)."""
    log_memory: bool = True
    """Record KV use and running/waiting requests (``Driver.trace_log``) for every method,
    also those that do not act on memory (the benchmark plots read it)."""
    log_every: int = 16
    """Memory reads of a method that only logs them: every N steps (reads cost SC ~3% of
    its wall at every 4th step on 2 CPU cores)."""
    release: bool = True
    """Forget engine traces as they end (False keeps them readable: tests recount tokens)."""
    vote_rule: str | None = None
    """Vote rule of the reported answer; None: the method's own."""
    keep_texts: bool = False
    """Return every completed trace's text in the result (``texts``: {node: text}); a
    server answers with the best voter's."""
