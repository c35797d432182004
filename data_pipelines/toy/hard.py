"""The hard toy split: toy questions with many "hard" steps (``toy-hard:<split>[:n]``).

The plain toy test split is too easy for the shipped policy and scorer (pass@64 ~100%,
best-of-N's top-1 right ~92-95%): most questions have 1-3 hard steps (a carry or borrow
with an operand of 7-9, see :func:`data_pipelines.toy.task.step_kind`). Questions with at
least five hard steps are not: clean traces (no give-up) become rare, the policy's
per-trace accuracy is ~0.28 and majority voting often lands on a dropped-carry answer.

A hard question is an ordinary toy question (same generator :func:`draw_question`, same
hash split :func:`split_of`) that passes :class:`ToyHardConfig`'s filter on the question
alone (default: >= 5 hard steps along the correct chain, 8 operations, the first one not
hard), so ``toy-hard:val`` lies inside the val question space and ``toy-hard:test`` inside
test; there is no ``toy-hard:train`` (the split is for evaluation only: train on
``toy:train``). The draw is rejection sampling from its own random stream
(``toy-hard-<split>-<seed>``), so a spec always gives the same questions and the first
``n`` of a longer list are the ``n`` of a shorter one. Changing a default of
:class:`ToyHardConfig` changes the questions behind every ``toy-hard`` spec.

Use::

    from data_pipelines.toy.hard import ToyHardConfig, draw_hard_questions, n_hard_steps
    qs = draw_hard_questions("val", 60)          # ToyQuestion, each passing ToyHardConfig()
    # or through the loader:  load_questions("toy-hard:val:60")

Calibration against the shipped policy and scorer: ``benchmarks/toy_hard_calibration.py``
and ``docs/TOY_WORLD.md`` ("toy-hard").
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from data_pipelines.toy.task import (
    MOD,
    ToyQuestion,
    ToyTaskConfig,
    draw_question,
    split_of,
    step_kind,
)
from gambit_core.questions import GeneratedSource, Question

#: Splits a hard question may be drawn from (train is refused: the split is for evaluation).
HARD_SPLITS: tuple[str, ...] = ("val", "test")

#: Draws allowed per requested question before giving up (the default config accepts
#: ~1 in 1,900 draws for val or test: ~0.5% qualify, 10% of those are in a split).
_MAX_DRAWS_PER_QUESTION = 200_000


@dataclass(frozen=True)
class ToyHardConfig:
    """Which toy questions count as hard (the defaults were calibrated on val:
    docs/TOY_WORLD.md, "toy-hard")."""

    min_hard: int = 5
    """Fewest hard steps (carry/borrow with an operand of 7-9) along the correct chain.
    The distinct single-digit operands hold six large ones (+-7, +-8, +-9), so at most 6."""
    min_ops: int = 8
    """Fewest operations. 8 (not the generator's 5): measured on val, SC@64 30% at 8 ops
    vs 40% at 5-8 (BoN top-1 73% vs 72%)."""
    max_ops: int = 8
    """Most operations (the shipped policy was trained on 5-8: keep within)."""
    min_drift: int = 0
    """Fewest net dropped-carry direction ``|#hard '+' steps - #hard '-' steps|`` (0: any).
    A dropped carry of a '+' step is off by -10 and of a '-' step by +10, so slips of both
    signs cancel; with drift = hard steps no slip cancels, majority voting fails outright
    but the scorer ranks traces well (docs/TOY_WORLD.md). At most 3 (three large operands
    per sign), and at most ``6 - n`` for ``n`` >= 3 hard steps."""
    min_lead: int = 1
    """Fewest non-hard operations before the first hard one (0: the first may be hard).
    On val, questions whose first operation is hard had BoN top-1 ~82%, the others ~57%."""

    def __post_init__(self) -> None:
        if not 1 <= self.min_hard <= 6:
            raise ValueError(f"min_hard must be in 1..6 (got {self.min_hard})")
        if not 1 <= self.min_ops <= self.max_ops <= 18:
            raise ValueError(
                f"need 1 <= min_ops <= max_ops <= 18 (got {self.min_ops}, {self.max_ops})"
            )
        if not 0 <= self.min_drift <= 3:
            raise ValueError(f"min_drift must be in 0..3 (got {self.min_drift})")
        feasible = [
            n
            for n in range(self.min_hard, min(6, self.max_ops) + 1)
            if min(n, 6 - n if n >= 3 else n) >= self.min_drift
        ]
        if self.min_lead < 0 or self.min_lead + self.min_hard > self.max_ops:
            feasible = []
        if not feasible:
            raise ValueError(f"no toy question qualifies under {self}")

    @property
    def task(self) -> ToyTaskConfig:
        """The generator config the questions are drawn with (default slips and splits)."""
        return ToyTaskConfig(min_ops=self.min_ops, max_ops=self.max_ops)


def hard_signs(q: ToyQuestion) -> list[int]:
    """The sign (+1 / -1) of each hard step of ``q`` along its correct chain, in order."""
    v, out = q.start, []
    for op in q.ops:
        if step_kind(v, op) == "hard":
            out.append(1 if op >= 0 else -1)
        v = (v + op) % MOD
    return out


def n_hard_steps(q: ToyQuestion) -> int:
    """How many of ``q``'s steps are hard along its correct chain of values."""
    return len(hard_signs(q))


def first_hard_step(q: ToyQuestion) -> int | None:
    """0-based index of ``q``'s first hard operation (None: none is hard)."""
    v = q.start
    for i, op in enumerate(q.ops):
        if step_kind(v, op) == "hard":
            return i
        v = (v + op) % MOD
    return None


def drift(q: ToyQuestion) -> int:
    """``|#hard '+' steps - #hard '-' steps|``: how far all-slipped carries would not cancel."""
    return abs(sum(hard_signs(q)))


def is_hard(q: ToyQuestion, cfg: ToyHardConfig = ToyHardConfig()) -> bool:
    """Whether ``q`` qualifies for the hard split under ``cfg`` (ops count, hard steps, drift)."""
    if not cfg.min_ops <= len(q.ops) <= cfg.max_ops:
        return False
    signs = hard_signs(q)
    if len(signs) < cfg.min_hard or abs(sum(signs)) < cfg.min_drift:
        return False
    return cfg.min_lead == 0 or first_hard_step(q) >= cfg.min_lead


@dataclass
class _Stream:
    """One (split, seed, config) rejection-sampling stream, kept so that drawing the same
    questions again in a process (gambit-bench loads a dataset once per job) is free."""

    rng: random.Random
    seen: set[str] = field(default_factory=set)
    out: list[ToyQuestion] = field(default_factory=list)


_STREAMS: dict[tuple[str, str, int, ToyHardConfig], _Stream] = {}


def draw_hard_questions(
    split: str, n: int, seed: int = 0, cfg: ToyHardConfig = ToyHardConfig(),
    stream: str = "toy-hard",
) -> list[ToyQuestion]:
    """``n`` distinct hard questions of ``split`` (``val`` or ``test``), deterministic in ``seed``
    (the first ``n`` of the stream ``<stream>-<split>-<seed>``; a fresh list every call).
    ``stream`` names the random stream (``toy-clean`` draws its stratum from its own).

    Raises:
        ValueError: an unknown or refused split, ``n < 1``, or too few qualifying questions.
    """
    if split not in HARD_SPLITS:
        raise ValueError(
            f"unknown {stream} split {split!r}: expected one of {', '.join(HARD_SPLITS)}"
            + (f" ({stream} is for evaluation; train on toy:train)" if split == "train" else "")
        )
    if n <= 0:
        raise ValueError(f"need a positive number of {stream} questions, got {n}")
    st = _STREAMS.get((stream, split, seed, cfg))
    if st is None:
        st = _STREAMS[(stream, split, seed, cfg)] = _Stream(
            random.Random(f"{stream}-{split}-{seed}"))
    task = cfg.task
    for _ in range((n - len(st.out)) * _MAX_DRAWS_PER_QUESTION):
        if len(st.out) >= n:
            break
        q = draw_question(st.rng, task)
        if not is_hard(q, cfg) or q.text in st.seen or split_of(q, task) != split:
            continue
        st.seen.add(q.text)
        st.out.append(q)
    if len(st.out) < n:
        raise ValueError(f"found only {len(st.out)} of {n} {stream} {split} questions under {cfg}")
    return st.out[:n]


def make_hard_questions(split: str, n: int, seed: int = 0, cfg: ToyHardConfig = ToyHardConfig()):
    """Hard questions as loader ``Question`` records (``toy-hard:val`` in ``load_questions``)."""
    return [
        Question(
            id=f"toy-hard-{split}-{seed}-{i}",
            question=q.text,
            answer=str(q.answer),
            source=f"toy-hard:{split}",
        )
        for i, q in enumerate(draw_hard_questions(split, n, seed, cfg))
    ]


SOURCE = GeneratedSource(
    name="toy-hard", splits=HARD_SPLITS, make=make_hard_questions,
    refused={"train": "toy-hard is for evaluation only; train on toy:train"})
"""``toy-hard:<split>[:<count>]`` for :func:`gambit_core.questions.load_questions` (registered
under the ``gambit.datasets`` entry points in pyproject.toml)."""
