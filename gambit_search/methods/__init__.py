"""The method registry: every search method behind one small interface.

A method is a :class:`Method` record: its typed parameters (a dataclass whose fields are
its command-line flags), how to build one question's policy (a state machine speaking
:mod:`gambit_search.policy` events and actions) from those parameters and the budget N, how
many live traces a question occupies, what it needs from the engine and the scorer, and
which vote rule answers by default. :meth:`Method.bind` fixes the parameters and N into a
:class:`BoundMethod`, the policy factory the driver (:mod:`gambit_search.driver`) runs; the
driver knows nothing else about methods, so a new one is a module with a ``METHOD`` and a
line in :data:`_METHODS` (a :class:`~gambit_core.registry.Registry`)::

    from gambit_search.methods import get_method
    m = get_method("gambit")
    bound = m.bind(m.params(capacity=16), n=64)    # GambitParams; raises InputError if bad
    policy = bound.policy(ctx)                     # ctx: PolicyContext
    actions = policy.start()

Modules are imported only when their method is asked for, so ``--help`` stays instant.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from gambit_core.errors import InputError
from gambit_core.registry import Registry
from gambit_search.policy import Policy

__all__ = ["BoundMethod", "Method", "NoParams", "PolicyContext", "UnknownMethodError",
           "get_method", "method_names", "param_classes"]


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


class UnknownMethodError(InputError):
    """No method of that name (the message lists the known ones)."""


@dataclass(frozen=True)
class NoParams:
    """A method without parameters of its own (its budget N is the run's ``--n``)."""


@dataclass(frozen=True)
class Method:
    """A search method as the driver sees it."""

    name: str
    """Registry name (``--method``)."""
    summary: str
    """One line for ``--help`` and tables."""
    make_policy: Callable[[Any, int, PolicyContext], Policy]
    """(params, n, context) -> a fresh policy for one question with budget n."""
    slots: Callable[[Any, int], int] = lambda params, n: n
    """(params, n) -> most traces one question keeps live (the driver's admission unit)."""
    params: type = NoParams
    """The method's parameters: a dataclass with a default for every field and a docstring
    per field; each field is the flag ``--<flag_prefix><field-name>``."""
    flag_prefix: str = ""
    """Prefix of the parameters' flags ("deepconf-": ``--deepconf-window``)."""
    needs_scorer: bool = False
    """Refuse to run without a scorer."""
    scores_traces: bool = False
    """Feed boundary scores to the policy (needs a scorer)."""
    uses_memory: bool = False
    """Send :class:`~gambit_search.policy.MemoryPressure` events."""
    vote: str = "plain"
    """Default vote rule: "weighted" (final trace scores), "plain", "top1" or "lineage"
    (:mod:`gambit_search.voting`)."""
    logprobs: int | None = None
    """``SamplingSpec.logprobs`` its traces need (None: none)."""
    check: Callable[[Any, int], None] | None = None
    """(params, n) -> None, or raise ``ValueError`` with one line for a bad parameter (run
    before any engine starts)."""

    def bind(self, params: Any = None, n: int = 32) -> BoundMethod:
        """This method with its parameters (None: the defaults) and budget, checked:
        :class:`InputError` with one line for a bad value."""
        params = self.params() if params is None else params
        if not isinstance(params, self.params):
            raise InputError(f"method {self.name!r} takes {self.params.__name__}, "
                             f"got {type(params).__name__}")
        if n < 1:
            raise InputError(f"--n must be >= 1, got {n}")
        if self.check is not None:
            try:
                self.check(params, n)
            except ValueError as e:
                raise InputError(str(e)) from None
        return BoundMethod(self, params, n)


@dataclass(frozen=True)
class BoundMethod:
    """A method bound to its parameters and budget: the policy factory the driver runs."""

    method: Method
    """The registry record."""
    params: Any
    """Its typed parameters (an instance of ``method.params``)."""
    n: int
    """Budget: completed traces per question that vote."""

    @property
    def slots(self) -> int:
        """Most traces one question keeps live."""
        return self.method.slots(self.params, self.n)

    def policy(self, ctx: PolicyContext) -> Policy:
        """A fresh policy for one question."""
        return self.method.make_policy(self.params, self.n, ctx)


_METHODS: Registry[Method] = Registry(
    lambda name, known: UnknownMethodError(
        f"unknown method {name!r}: choose one of {', '.join(known)}"),
    entries={
        "gambit": "gambit_search.methods.gambit",
        "sc": "gambit_search.methods.sc",
        "bon": "gambit_search.methods.bon",
        "step": "gambit_search.methods.step",
        "deepconf-low": "gambit_search.methods.deepconf_low",
        "deepconf-high": "gambit_search.methods.deepconf_high",
        "slim-sc": "gambit_search.methods.slim_sc",
    },
    load=lambda mod: importlib.import_module(mod).METHOD, what="method")
"""{method name: its module}, imported when the method is asked for."""


def method_names() -> list[str]:
    """Registered method names."""
    return list(_METHODS.names())


def get_method(name: str) -> Method:
    """The method called ``name``; :class:`UnknownMethodError` names the known ones."""
    return _METHODS.get(name)


def param_classes() -> dict[type, str]:
    """{parameter dataclass: flag prefix} over every registered method (a class two methods
    share, DeepConf's, appears once): the flags a CLI adds for all methods."""
    out: dict[type, str] = {}
    for name in method_names():
        m = get_method(name)
        if m.params is not NoParams:
            out.setdefault(m.params, m.flag_prefix)
    return out
