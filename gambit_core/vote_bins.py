"""Vote bins: answers grouped by math equivalence, for every vote rule.

    from gambit_core.vote_bins import VoteBins, majority_vote

    majority_vote([r"\\frac{1}{2}", "0.5", "3"])                # -> r"\\frac{1}{2}"
    bins = VoteBins()
    bins.add("0.5", weight=0.9)
    bins.add(r"\\frac12", weight=0.4)
    bins.winner()                                              # -> "0.5"

Equivalence is :func:`gambit_core.grading.is_equivalent` ("1/2", "0.5" and "\\frac{1}{2}" are
one answer).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import NamedTuple

from gambit_core.grading import is_equivalent, normalize_answer

# ---------------------------------------------------------------------------------------
# Voting
# ---------------------------------------------------------------------------------------


class VoteBin(NamedTuple):
    """One bin of equivalent answers: its first-seen representative, summed weight, count."""

    representative: str
    weight: float
    count: int


class VoteBins:
    """Weighted votes pooled over bins of math-verify-equivalent answers.

    An added answer joins the first bin whose representative (the bin's first answer) is
    equivalent to it (``is_equivalent(representative, answer)``), else opens a new bin.
    """

    def __init__(self, answers: Iterable[str] = (), weights: Iterable[float] | None = None):
        self._reps: list[str] = []
        self._weights: list[float] = []
        self._counts: list[int] = []
        answers = list(answers)
        ws = [1.0] * len(answers) if weights is None else list(weights)
        if len(ws) != len(answers):
            raise ValueError(f"{len(answers)} answers but {len(ws)} weights")
        for a, w in zip(answers, ws, strict=True):
            self.add(a, w)

    def add(self, answer: str, weight: float = 1.0) -> int:
        """Add one vote; returns the index of the bin it landed in."""
        weight = float(weight)
        if math.isnan(weight):
            raise ValueError("vote weight is NaN")
        idx = self._find(answer)
        if idx is None:
            self._reps.append(answer)
            self._weights.append(weight)
            self._counts.append(1)
            return len(self._reps) - 1
        self._weights[idx] += weight
        self._counts[idx] += 1
        return idx

    def _find(self, answer: str) -> int | None:
        norm = normalize_answer(answer)
        for i, rep in enumerate(self._reps):  # cheap exact pass first
            if normalize_answer(rep) == norm:
                return i
        for i, rep in enumerate(self._reps):
            if is_equivalent(rep, answer):
                return i
        return None

    def winner(self) -> str | None:
        """Representative of the heaviest bin (first seen wins ties); None when empty."""
        if not self._reps:
            return None
        best = max(range(len(self._reps)), key=lambda i: (self._weights[i], -i))
        return self._reps[best]

    def bins(self) -> list[VoteBin]:
        """All bins in first-seen order."""
        return [VoteBin(*t) for t in zip(self._reps, self._weights, self._counts, strict=True)]

    @property
    def total_weight(self) -> float:
        return math.fsum(self._weights)

    def __len__(self) -> int:
        return len(self._reps)


def majority_vote(
    answers: Iterable[str | None], weights: Iterable[float] | None = None
) -> str | None:
    """Winner of a (weighted) vote over equivalence bins; None answers are skipped.

    Returns None when there is no answer to vote on.
    """
    answers = list(answers)
    ws = [1.0] * len(answers) if weights is None else list(weights)
    if len(ws) != len(answers):
        raise ValueError(f"{len(answers)} answers but {len(ws)} weights")
    bins = VoteBins()
    for a, w in zip(answers, ws, strict=True):
        if a is not None and a.strip():
            bins.add(a, w)
    return bins.winner()


def majority_correct(answers: Sequence[str | None],
                     correct: Sequence[bool]) -> tuple[str | None, bool]:
    """The majority answer of one question's traces and whether it is right.

    The vote pools answers over math-verify equivalence bins
    (:func:`majority_vote`: "1/2", "0.5" and "\\frac{1}{2}" are one
    answer; None and empty answers do not vote). The winner is its bin's representative,
    itself one trace's answer, so its correctness is that trace's graded ``correct``: no
    second grading, and a majority verdict never disagrees with the per-trace grade of the
    answer it outputs. ``(None, False)`` when no trace has an answer.
    """
    if len(answers) != len(correct):
        raise ValueError(f"{len(answers)} answers but {len(correct)} verdicts")
    winner = majority_vote(answers)
    if winner is None:
        return None, False
    return winner, bool(next(c for a, c in zip(answers, correct, strict=True) if a == winner))
