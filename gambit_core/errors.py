"""The one error class for bad input, shared by every console script.

Anything a user can get wrong (a flag, a dataset spec, a checkpoint that does not fit the
model, an output directory of another config) raises :class:`InputError` (a question source:
its subclass :class:`DatasetError`, raised by the question loaders) with one line
that says what and where; :func:`gambit_core.cli.run_main` prints it as ``prog: error: ...``
and exits with :data:`EXIT_BAD_INPUT`, as argparse does for a bad flag.
"""

from __future__ import annotations

EXIT_BAD_INPUT = 2
"""Exit status for bad input (argparse's own for a bad flag)."""


class InputError(ValueError):
    """Bad input, reported as one line before any heavy work starts."""

    def __init__(self, msg: str = "error") -> None:
        super().__init__((msg.splitlines() or ["error"])[0])


class DatasetError(InputError):
    """A question source is missing, malformed or empty (``gambit_core.questions``)."""
