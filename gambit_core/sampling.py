"""The sampling fields, declared once: every console script that samples traces takes them.

    @dataclass(kw_only=True)
    class HarvestConfig(SamplingConfig): ...        # --temperature --top-p --top-k --max-tokens --seed

The defaults fit the embedded toy policy; a reasoning model's published settings are
T = 0.6, top-p 0.95, top-k 20 (docs/REFERENCE.md). The range rules of these values are
:func:`sampling_problem`'s, shared with the engine's ``SamplingSpec``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

_RULES: tuple[tuple[str, str, Callable[[Any], bool]], ...] = (
    ("temperature", ">= 0", lambda v: v >= 0),
    ("top_p", "in (0, 1]", lambda v: 0 < v <= 1),
    ("top_k", ">= 0 (0: off)", lambda v: v >= 0),
    ("max_tokens", ">= 1", lambda v: v >= 1),
)


def sampling_problem(obj: Any, flags: bool) -> str | None:
    """The first of ``obj``'s ``temperature``, ``top_p``, ``top_k``, ``max_tokens`` that no
    engine takes, as one line naming it (``flags``: by its command-line flag, ``--top-p``;
    else by its field, ``top_p``), or None when they are all fine. Each value is read only
    once the ones before it passed."""
    for field, rule, ok in _RULES:
        value = getattr(obj, field)
        if not ok(value):
            name = "--" + field.replace("_", "-") if flags else field
            return f"{name} must be {rule}, got {value}"
    return None


@dataclass(kw_only=True)
class SamplingConfig:
    """How every trace samples (standard nucleus / top-k sampling)."""

    temperature: float = 1.0
    """Sampling temperature (toy policy: 1.0) [paper 0.6]."""
    top_p: float = 1.0
    """Nucleus sampling mass [paper 0.95]."""
    top_k: int = 0
    """Top-k (0: off) [paper 20]."""
    max_tokens: int = 400
    """Most output tokens per trace (per trace lineage, for a search that forks)."""
    seed: int = 0
    """Base seed: every trace's seed derives from (seed, question id, trace or node index)."""

    def check_sampling(self) -> None:
        """Raise :class:`~gambit_core.errors.InputError` for a value no engine takes."""
        from gambit_core.errors import InputError

        problem = sampling_problem(self, flags=True)
        if problem is not None:
            raise InputError(problem)
