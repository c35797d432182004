"""The toy world's step checker: is a trace's arithmetic still clean after each thought?

Exact process labels for a toy trace (``gambit-harvest`` writes them per boundary as
``prefix_labels``; ``gambit-train data.labels=prefix`` trains on them). A thought is a step
``29+4=33``, a check ``check 33-4=29 ok``, or the final ``\\boxed{36}``
(docs/TOY_WORLD.md). The checker follows the trace's carried value the way
:func:`data_pipelines.toy.task.first_wrong_step` does (a retry is the same operation
again) and labels the prefix that ends with each thought:

* **1 (clean)**: every operation the trace has moved past was right, the step being
  worked on (the latest attempt) is right, and the latest thought itself is right (a
  check recomputes the attempt correctly and its verdict fits).
* **0, for now**: the latest attempt slipped, or the latest check is wrong. A retry that
  gets the step right makes the prefix clean again: a caught slip is not fatal.
* **0 for good**: the trace moved past an operation with a wrong value (gave up, or a
  check passed a slip), wrote an operation out of order, or a thought that is none of
  the three. Opposite slips that cancel later do not clean it again.

    from data_pipelines.toy.steps import clean_after_thoughts
    clean_after_thoughts("Start 29. Ops: +4 +9. Mod 100.", ["29+4=33", "check 33-4=29 ok"])  # [1, 1]
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from data_pipelines.toy.task import MOD, ToyQuestion, parse_question

_STEP = re.compile(r"(\d+)([+\-])(\d+)=(\d+)")
_CHECK = re.compile(r"check (\d+)([+\-])(\d+)=(\d+) (ok|no)")
_BOXED = re.compile(r"\\boxed\{(\d+)\}")


@dataclass
class _Attempt:
    op: int
    before: int
    """The value the trace wrote as the step's left operand."""
    result: int


class StepChecker:
    """Feed a toy trace's thoughts in order; :meth:`feed` says whether the prefix is clean."""

    def __init__(self, q: ToyQuestion) -> None:
        self.q, self.truth = q, q.values()
        self.i = 0  # index of the operation being worked on
        self.value = q.start  # the value the trace carries into operation i
        self.attempt: _Attempt | None = None
        self.ruined = False

    def _true_before(self, i: int) -> int:
        return self.q.start if i == 0 else self.truth[i - 1]

    def _commit(self) -> None:
        """The trace moves past operation i with its latest attempt's value."""
        a = self.attempt
        if a is None:
            return
        if a.result != self.truth[self.i]:
            self.ruined = True
        self.value, self.attempt = a.result, None
        self.i += 1

    def feed(self, thought: str) -> bool:
        """Whether the prefix ending with ``thought`` is clean (see the module docstring)."""
        if self.ruined:
            return False
        th = thought.strip()
        if m := _STEP.fullmatch(th):
            before, op, result = int(m.group(1)), int(m.group(3)), int(m.group(4))
            op = op if m.group(2) == "+" else -op
            if self.attempt is not None and self.attempt.op != op:
                self._commit()  # a new operation: the previous one is final
                if self.ruined:
                    return False
            if self.i >= len(self.q.ops) or op != self.q.ops[self.i]:
                self.ruined = True
                return False
            self.attempt = _Attempt(op, before, result)
            return (before == self.value == self._true_before(self.i)
                    and result == self.truth[self.i])
        if m := _CHECK.fullmatch(th):
            a = self.attempt
            if a is None:
                self.ruined = True
                return False
            shown, undo, back, verdict = int(m.group(1)), int(m.group(3)), int(m.group(4)), m.group(5)
            undo = undo if m.group(2) == "+" else -undo
            right = (shown == a.result and undo == -a.op and back == (a.result - a.op) % MOD
                     and verdict == ("ok" if back == a.before else "no"))
            return right and a.result == self.truth[self.i] and a.before == self._true_before(self.i)
        if m := _BOXED.fullmatch(th):
            self._commit()
            ok = (not self.ruined and self.i == len(self.q.ops) and int(m.group(1)) == self.q.answer)
            self.ruined = True  # nothing may follow the answer
            return ok
        self.ruined = True
        return False


def clean_after_thoughts(question: str | ToyQuestion, thoughts: Sequence[str]) -> list[int]:
    """1/0 per thought: whether the trace is still clean after it (``question``: the toy
    question's text or the question itself; a text that is not a toy question: ValueError)."""
    q = parse_question(question) if isinstance(question, str) else question
    c = StepChecker(q)
    return [int(c.feed(t)) for t in thoughts]


def clean_at_boundaries(question: str | ToyQuestion, prefix_texts: Sequence[str]) -> list[int]:
    """1/0 per boundary, from the decoded text of the trace up to and including each boundary
    token (``prefix_texts[k]``: the output text through boundary k). The thoughts a boundary
    closes are the ``"\\n\\n"``-separated pieces before its last separator."""
    if not prefix_texts:
        return []
    thoughts = prefix_texts[-1].split("\n\n")
    clean = clean_after_thoughts(question, thoughts)
    out = []
    for text in prefix_texts:
        n = text.count("\n\n")  # thoughts closed by this boundary
        out.append(clean[n - 1] if 0 < n <= len(clean) else 0)
    return out
