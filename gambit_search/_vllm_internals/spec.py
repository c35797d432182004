"""What the worker-side capture keeps: :class:`CaptureSpec`, sent once by the driver to every
worker (plain types: it crosses processes). Read by :mod:`.row_filter` (the keep rule) and
:mod:`.capture` (the recorder). Plain Python: no vLLM import.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["CaptureSpec"]


@dataclass
class CaptureSpec:
    """What the worker keeps; sent once by the driver (plain types: it crosses processes)."""

    boundary_ids: list[int] = field(default_factory=list)
    """Token ids whose decoded text contains the boundary text ("\\n\\n")."""
    run_start_ids: list[int] = field(default_factory=list)
    """Split boundaries (the two newlines of "\\n\\n" in two tokens): ids whose text
    starts with "\\n". Such a token is a boundary when the text before it ends in an odd
    run of newlines (the decoded text's count of "\\n\\n", non-overlapping, grows at it).
    Empty: only ``boundary_ids`` are boundaries."""
    run_odd_ids: list[int] = field(default_factory=list)
    """Ids whose text is not all newlines and ends in an odd run of them: odd after them."""
    run_flip_ids: list[int] = field(default_factory=list)
    """Ids whose text is an odd number of newlines only: they flip the run's parity."""
    run_keep_ids: list[int] = field(default_factory=list)
    """Ids whose text is an even number (>= 2) of newlines only: parity unchanged. Every
    other id ends the run (even after it)."""
    stride: int | None = None
    """Also keep the state after every ``stride`` output tokens (None: off)."""
    think_start: int | None = None
    """Token id of ``<think>``, when the tokenizer has it as one token."""
    think_end: int | None = None
    """Token id of ``</think>``, when the tokenizer has it as one token."""
    sink: str | None = None
    """ZMQ address the driver PULLs rows from; None: rows wait for :meth:`RowCapture.drain`."""
    max_pending_steps: int = 8
    """Device-side steps kept before the oldest is filtered even if not known complete."""
    logprobs: bool = False
    """Also ship, for every Gambit row, the log-probability of its input token under the
    previous step's raw logits (see :class:`SampledLogprobs`)."""

    scorer: str | None = None
    """A scorer checkpoint (``ckpt.pt``) to score the boundary rows with inside the worker,
    on the model's device (:class:`~gambit_search.scoring.ScoreBook`); each kept row then
    travels with its trace score. None: rows only, scored by the driver."""
    ship_rows: bool = True
    """Send the kept rows' states to the driver (off when the worker scores and nobody reads
    them: only scores cross)."""

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CaptureSpec:
        return cls(**d)
