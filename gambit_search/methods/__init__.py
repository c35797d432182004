"""The method registry: every search method behind one small interface.

A method is a :class:`Method` record: how to build one question's policy (a state machine
speaking :mod:`gambit_search.policy` events and actions) from the solve parameters, how
many live traces a question occupies, what it needs from the engine and the scorer, and
which vote rule answers by default. The driver (:mod:`gambit_search.driver`) knows
nothing else about methods, so a new one is a module with a ``METHOD`` and a line in
:data:`_MODULES`::

    from gambit_search.methods import get_method, method_names
    m = get_method("gambit")
    policy = m.make_policy(params, ctx) # params: the SolveConfig fields; ctx: PolicyContext
    actions = policy.start()

Modules are imported only when their method is asked for, so ``--help`` stays instant.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

__all__ = ["Method", "Policy", "PolicyContext", "UnknownMethodError", "get_method", "method_names"]


class Policy(Protocol):
    """One question's state machine (see :mod:`gambit_search.policy`)."""

    done: bool

    def start(self) -> list: ...

    def handle(self, event: Any) -> list: ...

    def stop(self) -> list: ...

    def running(self) -> list: ...

    def ghosts(self) -> list: ...

    def votes(self) -> list[tuple[int, str | None, float | None]]: ...

    def stats(self) -> dict: ...

    def tree(self) -> list[dict]: ...


@dataclass(frozen=True)
class PolicyContext:
    """What a policy may know of the run besides its parameters (no engine handle: policies
    stay pure). Built once per run by the driver."""

    decode: Callable[[Sequence[int]], str]
    """Token ids -> text (e.g. Slim-SC reads a trace's latest thought)."""
    block_size: int
    """Tokens per KV block of the engine."""
    max_model_len: int
    """Longest sequence the engine takes."""
    hidden_size: int
    """The policy model's hidden size."""
    max_tokens: int
    """Output-token cap of a trace lineage."""
    shared: dict = field(default_factory=dict)
    """Per-run objects a method builds once and shares between its questions' policies (an
    embedding model, say): ``ctx.shared.setdefault(key, ...)``."""


class UnknownMethodError(ValueError):
    """No method of that name (the message lists the known ones)."""


@dataclass(frozen=True)
class Method:
    """A search method as the driver sees it."""

    name: str
    """Registry name (``--method``)."""
    summary: str
    """One line for ``--help`` and tables."""
    make_policy: Callable[[Any, PolicyContext], Policy]
    """(params, context) -> a fresh policy for one question."""
    slots: Callable[[Any], int]
    """params -> most traces one question keeps live (the driver's admission unit)."""
    needs_scorer: bool = False
    """Refuse to run without a scorer."""
    scores_traces: bool = False
    """Feed boundary scores to the policy (needs a scorer)."""
    uses_memory: bool = False
    """Send :class:`~gambit_search.policy.MemoryPressure` events."""
    vote: str = "plain"
    """Default vote rule: "weighted" (final trace scores), "plain" or "top1"."""
    logprobs: int | None = None
    """``SamplingSpec.logprobs`` its traces need (None: none)."""
    check: Callable[[Any], None] | None = None
    """params -> None, or raise ``ValueError`` with one line for a bad parameter (run before
    any engine starts)."""


_MODULES = {
    "gambit": "gambit_search.methods.gambit",
    "sc": "gambit_search.methods.sc",
    # baselines (issue 11)
    "bon": "gambit_search.methods.bon",
    "step": "gambit_search.methods.step",
    "deepconf-low": "gambit_search.methods.deepconf_low",
    "deepconf-high": "gambit_search.methods.deepconf_high",
    "slim-sc": "gambit_search.methods.slim_sc",
}


def method_names() -> list[str]:
    """Registered method names."""
    return sorted(_MODULES)


def get_method(name: str) -> Method:
    """The method called ``name``; :class:`UnknownMethodError` names the known ones."""
    mod = _MODULES.get(name)
    if mod is None:
        raise UnknownMethodError(f"unknown method {name!r}: choose one of {', '.join(method_names())}")
    return importlib.import_module(mod).METHOD
