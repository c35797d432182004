"""Search diagnostics of a question, a run and a table row, from the saved search tree.

    from gambit_search.diagnostics import question_diagnostics, Totals
    d = question_diagnostics(tree_nodes, gold="36")   # one question (results.jsonl "diagnostics")
    t = Totals.of([d, ...])                           # additive sums: pool questions, runs, seeds
    t.means()                                         # the row's numbers (summary, bench table)

What they tell (docs/SEARCH.md, "Diagnostics"): whether the budget bought exploration or
copies. Every number counts *completed* traces (the ones that finished on their own; the
traces a method votes on are among them):

* **coverage** (pass@N): a correct completion exists (graded questions only);
* **correct completions** per question, and **distinct answers** per question (answers
  compared up to whitespace; a completion without an answer gives none);
* **inherited share**: over completions that were forked (a parent), inherited prefix tokens
  / final output length (inherited + own), the mean over those completions;
* **fork depth** of completions (a root is 0, its child 1), mean and max.

One module computes them for ``results.jsonl`` rows (:mod:`gambit_search.solve.outputs`),
gambit-solve's summary and gambit-bench's tables (:mod:`gambit_search.bench_tables`), so the
three agree.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any

__all__ = ["QuestionDiagnostics", "Totals", "completion_correct", "question_diagnostics",
           "row_diagnostics"]

COMPLETED = "completed"
"""The saved state of a trace that finished on its own (``NodeState.COMPLETED``)."""


@dataclass(frozen=True)
class QuestionDiagnostics:
    """One question's diagnostics (``results.jsonl``: the row's ``diagnostics``)."""

    completions: int
    """Completed traces."""
    correct: int | None
    """Completed traces whose answer equals gold (None: the question has no gold)."""
    distinct_answers: int
    """Distinct answers among the completed traces (up to whitespace; None answers not counted)."""
    forked: int
    """Completed traces that are forks (they have a parent)."""
    inherited_share: float | None
    """Mean over forked completions of inherited tokens / (inherited + own tokens) (None: none)."""
    depth_mean: float | None
    """Mean fork depth of the completed traces (a root: 0; None: no completion)."""
    depth_max: int
    """Deepest completed trace (0: roots only, or no completion)."""

    @property
    def covered(self) -> bool | None:
        """A correct completion exists (None: ungraded)."""
        return None if self.correct is None else self.correct > 0

    def to_json(self) -> dict[str, Any]:
        """The row's ``diagnostics`` mapping (with ``covered``)."""
        return asdict(self) | {"covered": self.covered}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> QuestionDiagnostics:
        """The inverse of :meth:`to_json` (``covered`` is derived, so ignored)."""
        return cls(**{f.name: d[f.name] for f in fields(cls)})


def completion_correct(nodes: Sequence[Mapping[str, Any]], gold: str | None
                       ) -> dict[int, bool | None]:
    """{node id: its answer equals gold} for every completed node (None: no gold)."""
    from gambit_core.grading import is_equivalent

    seen: dict[str | None, bool] = {}
    out: dict[int, bool | None] = {}
    for n in nodes:
        if n["state"] != COMPLETED:
            continue
        a = n.get("answer")
        if not gold:
            out[n["id"]] = None
            continue
        if a not in seen:
            seen[a] = a is not None and is_equivalent(gold, a)
        out[n["id"]] = seen[a]
    return out


def question_diagnostics(nodes: Sequence[Mapping[str, Any]], gold: str | None
                         ) -> QuestionDiagnostics:
    """The diagnostics of one question's tree (``trees/<q>.json`` "nodes", or a row's ``tree``)."""
    done = [n for n in nodes if n["state"] == COMPLETED]
    right = completion_correct(done, gold)
    forks = [n for n in done if n.get("parent") is not None]
    shares = [n["inherited"] / (n["inherited"] + n["generated"]) for n in forks
              if n["inherited"] + n["generated"] > 0]
    depths = [int(n["depth"]) for n in done]
    answers = {" ".join(str(n["answer"]).split()) for n in done if n.get("answer") is not None}
    return QuestionDiagnostics(
        completions=len(done),
        correct=sum(bool(v) for v in right.values()) if gold else None,
        distinct_answers=len(answers),
        forked=len(forks),
        inherited_share=sum(shares) / len(shares) if shares else None,
        depth_mean=sum(depths) / len(depths) if depths else None,
        depth_max=max(depths, default=0),
    )


def row_diagnostics(row: Mapping[str, Any], nodes: Sequence[Mapping[str, Any]] | None = None
                    ) -> QuestionDiagnostics | None:
    """A result row's diagnostics: its ``diagnostics`` if written, else from ``nodes`` or the
    row's own ``tree`` (None: neither is there)."""
    if row.get("diagnostics"):
        return QuestionDiagnostics.from_json(row["diagnostics"])
    nodes = nodes if nodes is not None else row.get("tree")
    if nodes is None:
        return None
    return question_diagnostics(nodes, row.get("gold"))


@dataclass
class Totals:
    """Sums of questions' diagnostics: add runs and seeds, then take :meth:`means`."""

    questions: int = 0
    """Questions with diagnostics."""
    graded: int = 0
    """Of those, questions with gold."""
    covered: int = 0
    """Graded questions with a correct completion."""
    correct: int = 0
    """Correct completions over graded questions."""
    completions: int = 0
    """Completed traces."""
    distinct_answers: int = 0
    """Distinct answers, summed over questions."""
    forked: int = 0
    """Forked completions."""
    share_sum: float = 0.0
    """Sum over forked completions of their inherited share."""
    depth_sum: int = 0
    """Sum of the completions' fork depths."""
    depth_max: int = 0
    """Deepest completion."""

    @classmethod
    def of(cls, items: Iterable[QuestionDiagnostics | None]) -> Totals:
        """The sums over questions (None: a row without diagnostics, skipped)."""
        t = cls()
        for d in items:
            if d is None:
                continue
            t.questions += 1
            if d.correct is not None:
                t.graded += 1
                t.covered += d.correct > 0
                t.correct += d.correct
            t.completions += d.completions
            t.distinct_answers += d.distinct_answers
            t.forked += d.forked
            t.share_sum += (d.inherited_share or 0.0) * d.forked
            t.depth_sum += round((d.depth_mean or 0.0) * d.completions)
            t.depth_max = max(t.depth_max, d.depth_max)
        return t

    def __add__(self, other: Totals) -> Totals:
        return Totals(**{f.name: (max if f.name == "depth_max" else _plus)(
            getattr(self, f.name), getattr(other, f.name)) for f in fields(Totals)})

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: Mapping[str, Any] | None) -> Totals:
        return cls(**{f.name: d[f.name] for f in fields(cls) if f.name in d}) if d else cls()

    def means(self) -> dict[str, float | int | None]:
        """Per-question (or per-completion) means: coverage, correct and distinct per
        question, inherited share, fork depth mean and max (None where undefined)."""
        def div(a: float, b: int) -> float | None:
            return a / b if b else None

        return {"coverage": div(self.covered, self.graded),
                "correct_per_question": div(self.correct, self.graded),
                "distinct_per_question": div(self.distinct_answers, self.questions),
                "inherited_share": div(self.share_sum, self.forked),
                "fork_depth_mean": div(self.depth_sum, self.completions),
                "fork_depth_max": self.depth_max if self.questions else None}


def _plus(a: Any, b: Any) -> Any:
    return a + b
