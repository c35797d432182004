"""The "no cancelling slips" toy stratum (``toy-clean:<split>[:n]``): the stratum where the
scorer's signal is clean, the control opposite ``toy-hard``.

A clean question has exactly three hard steps (a carry or borrow with an operand of 7-9),
all of one sign, and 5-8 operations, the first not hard: ``ToyHardConfig(min_hard=3,
min_drift=3, min_lead=1, min_ops=5, max_ops=8)``. A dropped carry on a ``+`` step is -10
and on a ``-`` step +10, so with every hard step of one sign no two slips cancel: a trace
that gave up ends wrong, the wrong traces pile up on dropped-carry answers (majority voting
fails) and the scorer, which sees a give-up, ranks traces well (docs/TOY_WORLD.md measured
a final-trace AUROC of 0.93 on hand-drawn val questions of this stratum). On ``toy-hard``
(five hard steps, both signs) slips cancel and the AUROC is ~0.54.

Same generator and hash split as ``toy``: ``toy-clean:val`` lies inside val and
``toy-clean:test`` inside test (no train: evaluation only). The draw is rejection sampling
from its own stream ``toy-clean-<split>-<seed>`` (:func:`~data_pipelines.toy.hard.draw_hard_questions`),
so a spec always gives the same questions and ``toy-clean:val:32`` is the start of
``toy-clean:val:100``.

    from data_pipelines.toy.clean import CLEAN, make_clean_questions
    qs = make_clean_questions("val", 32)        # or load_questions("toy-clean:val:32")
"""

from __future__ import annotations

from data_pipelines.toy.hard import HARD_SPLITS, ToyHardConfig, draw_hard_questions
from gambit_core.questions import GeneratedSource, Question

NAME = "toy-clean"
"""The spec's prefix, and the name of its random stream."""

CLEAN = ToyHardConfig(min_hard=3, min_drift=3, min_lead=1, min_ops=5, max_ops=8)
"""The stratum: three hard steps of one sign (at most three large operands per sign, so
exactly three), 5-8 operations (the policy's trained range), the first operation not hard."""


def make_clean_questions(split: str, n: int, seed: int = 0) -> list[Question]:
    """The first ``n`` clean questions of ``split`` (``val`` or ``test``) as loader records."""
    return [
        Question(id=f"{NAME}-{split}-{seed}-{i}", question=q.text, answer=str(q.answer),
                 source=f"{NAME}:{split}")
        for i, q in enumerate(draw_hard_questions(split, n, seed, CLEAN, stream=NAME))
    ]


SOURCE = GeneratedSource(
    name=NAME, splits=HARD_SPLITS, make=make_clean_questions,
    refused={"train": f"{NAME} is for evaluation only; train on toy:train"})
"""``toy-clean:<split>[:<count>]`` for :func:`gambit_core.questions.load_questions`
(registered under the ``gambit.datasets`` entry points in pyproject.toml)."""
