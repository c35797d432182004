"""What the driver is fed: plain questions or :class:`Job` s (a question with its own method
and sampling), and an :class:`Intake` of questions arriving while it runs (gambit-serve).

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

__all__ = ["Intake", "Job", "QuestionLike", "bound_of", "question_of"]


class QuestionLike:
    """What the driver reads of a question: ``id``, ``question``, ``answer`` (gold or "")."""

    id: str
    question: str
    answer: str


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
