"""The event loop of the methods whose traces run side by side and never fork (SC, BoN,
STEP, DeepConf, Slim-SC): a :class:`~gambit_search.policy.NodeBook` whose
:meth:`~IndependentTraces.handle` books every event the same way and leaves a method two
hooks, what follows a trace's end and what a step's progress does.

    from gambit_search.methods.independent import IndependentTraces

    class MyMethod(IndependentTraces):
        def _progress(self, event):           # one engine step's Progress
            self._on_progress(event)          # count its tokens (NodeBook)
            return [Prune(...)]               # the method's actions for this step

By default a question is done when its last live trace ends, and progress only counts
tokens; memory events are ignored (STEP, which acts on them, answers them before this).
:func:`from_budget` is the ``make_policy`` of a method whose policy takes only its budget
(SC, BoN, STEP): ``Method(..., make_policy=from_budget(SelfConsistency))``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gambit_search.policy import (
    Action,
    Event,
    Finished,
    MemoryPressure,
    NodeBook,
    Progress,
    Scored,
)

__all__ = ["IndependentTraces", "from_budget"]


class IndependentTraces(NodeBook):
    """A NodeBook that answers events for independent traces (see the module docstring)."""

    def handle(self, event: Event) -> list[Action]:
        if self._after_done(event):
            return []
        if isinstance(event, Scored):
            self._on_scored(event)
            return []
        if isinstance(event, Finished):
            self._on_finished(event)
            self._after_finished(event)
            return []
        if isinstance(event, Progress):
            return self._progress(event)
        if isinstance(event, MemoryPressure):
            return []
        raise TypeError(f"unknown event {event!r}")

    def _after_finished(self, event: Finished) -> None:
        """Called once ``event``'s trace end is booked: the question is done when no trace
        is left active."""
        if not self.num_active:
            self.done = True

    def _progress(self, event: Progress) -> list[Action]:
        """One engine step's tokens: count them; the actions the method takes on them."""
        self._on_progress(event)
        return []


def from_budget(cls: Callable[[int], Any]) -> Callable[..., Any]:
    """A :attr:`~gambit_search.methods.Method.make_policy` that builds ``cls(n)`` from the
    budget alone (the method has no parameters and needs nothing of the context)."""

    def make(params: Any, n: int, ctx: Any = None) -> Any:
        return cls(n)

    return make
