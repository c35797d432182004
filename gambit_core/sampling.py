"""The sampling fields, declared once: every console script that samples traces takes them.

    @dataclass(kw_only=True)
    class HarvestConfig(SamplingConfig): ...        # --temperature --top-p --top-k --max-tokens --seed

The defaults fit the embedded toy policy; a reasoning model's published settings are
T = 0.6, top-p 0.95, top-k 20 (docs/REFERENCE.md).
"""

from __future__ import annotations

from dataclasses import dataclass


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

        if self.temperature < 0:
            raise InputError(f"--temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise InputError(f"--top-p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise InputError(f"--top-k must be >= 0 (0: off), got {self.top_k}")
        if self.max_tokens < 1:
            raise InputError(f"--max-tokens must be >= 1, got {self.max_tokens}")
