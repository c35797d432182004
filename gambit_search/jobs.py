"""What the driver is fed and what it reports to: plain questions or :class:`Job` s (a
question with its own method and sampling), an :class:`Intake` of questions arriving while it
runs (gambit-serve), and the :class:`Recorder` protocol (gambit-harvest's shards).

    from gambit_search.jobs import Intake, Job
    intake = Intake()
    intake.put(Job(question, get_method("sc").bind(n=8), SamplingSpec(max_tokens=400)))
    for result in driver.serve(intake): ...
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from gambit_search.engine import SamplingSpec
from gambit_search.methods import BoundMethod

__all__ = ["Intake", "Job", "QuestionLike", "Recorder", "bound_of", "question_of"]


class QuestionLike:
    """What the driver reads of a question: ``id``, ``question``, ``answer`` (gold or "")."""

    id: str
    question: str
    answer: str


class Recorder:
    """What a driver's ``recorder`` is called with (duck-typed: any object with these two
    methods). Both calls are on the driver's thread, inside one engine step, for traces the
    driver owns (``qid``: ``str(question.id)``; ``node``: the policy's node id; for SC node
    ``i`` is the question's i-th spawned trace, seeded ``trace_seed(seed, qid, i)``). They
    are on the hot path: take what is needed and hand the work to another thread.

    - :meth:`on_boundary` for each of the step's boundary events (hidden state included
      when the engine ships it), before the policies see the step;
    - :meth:`on_trace_end` for each trace that ends by itself (finish reason "stop",
      "length" or "error"), with the driver's decoded text (None for an error). The engine
      trace is still readable then (``trace_info``, ``sampled_logprobs``): it is released
      only after the policy has seen the step.

    Engine contract: a trace's boundary states arrive no later than the step carrying its
    finishing delta, or never (a boundary right before the stop). A trace the driver aborts
    (prune, stop, cancel) gets no :meth:`on_trace_end`."""

    def on_boundary(self, qid: str, node: int, event: Any) -> None:
        """One boundary event of trace ``node`` of question ``qid``."""

    def on_trace_end(self, qid: str, node: int, trace: int, finish_reason: str,
                     error: str | None, text: str | None) -> None:
        """Trace ``node`` of ``qid`` (engine id ``trace``) ended by itself."""


@dataclass(frozen=True)
class Job:
    """A question with its own method, sampling and vote rule (gambit-serve: one per
    request); a plain question runs with the driver's."""

    question: Any
    """The question (``id``, ``question``, ``answer``)."""
    bound: BoundMethod
    """Its method, parameters and budget."""
    spec: SamplingSpec
    """How its traces sample."""
    rule: str | None = None
    """Vote rule of its answer (None: the driver's, else the method's)."""
    prompt: tuple[int, ...] | None = None
    """Its prompt token ids (None: ``Driver.prompt_ids(question)``)."""


class Intake:
    """Questions arriving while the driver runs (:meth:`Driver.serve`), and cancellations.
    Thread-safe: a server's request handlers :meth:`put` and :meth:`cancel`, the driver's
    thread takes."""

    def __init__(self) -> None:
        import queue

        self._q: Any = queue.SimpleQueue()
        self._cancel: set[str] = set()
        self._lock = threading.Lock()
        self.closed = False

    def put(self, job: Any) -> None:
        """Queue a question or :class:`Job` (ids must be unique among those in flight)."""
        self._q.put(job)

    def cancel(self, qid: str) -> None:
        """Stop question ``qid``: its traces are aborted and it ends with error "cancelled"."""
        with self._lock:
            self._cancel.add(str(qid))

    def close(self) -> None:
        """No more questions: :meth:`Driver.serve` returns once those in flight are done."""
        self.closed = True
        self._q.put(None)

    def take(self, block: bool) -> list[Any]:
        """Every queued item (waiting up to 50 ms for one when ``block``)."""
        import queue

        out = []
        try:
            out.append(self._q.get(timeout=0.05) if block else self._q.get_nowait())
            while True:
                out.append(self._q.get_nowait())
        except queue.Empty:
            pass
        return [x for x in out if x is not None]

    def cancelled(self) -> set[str]:
        with self._lock:
            out, self._cancel = self._cancel, set()
        return out


def question_of(item: Any) -> Any:
    """The question of a plain question or a :class:`Job`."""
    return item.question if isinstance(item, Job) else item


def bound_of(item: Any, default: BoundMethod) -> BoundMethod:
    """The bound method of a :class:`Job`, else ``default`` (the driver's)."""
    return item.bound if isinstance(item, Job) else default
