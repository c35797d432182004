"""The toy reasoning world: verified modular-arithmetic chains with systematic slips.

A question is a start value and a list of +/- operations mod 100::

    Start 47. Ops: +8 -3 +9. Mod 100.

Its chain-of-thought has one thought per operation, each followed by an explicit
*verification* thought that undoes the step (thoughts are separated by a blank line)::

    47+8=55

    check 55-8=47 ok

    55-3=52
    ...
    \\boxed{61}

Why this shape (see docs/TOY_WORLD.md, "The feasibility study"): a plain chain gives a model that errs without
registering it, so its hidden states carry no error signal. Here a slip is followed by a
check that recomputes the step backwards and ends in ``no``; the model then retries the
step once, and if the retry slips too it gives up: it carries the wrong value on and
stops checking its steps. The model therefore *registers* its mistakes (its state after
a failed check differs from its state after a passed one, and a trace that gave up goes
on in a visibly different mode), yet does not always recover, so the state of a prefix
predicts the final answer, the way "wait, that's wrong" does in real reasoning models.

Slips are systematic, like the carry slips of real models: a step whose units digit
carries or borrows with a large operand (7-9) is "hard" and drops its carry
(off by 10) most of the time; other carrying steps slip rarely; the rest almost never.
Questions with a hard step therefore have one dominant wrong answer, so majority voting
fails on them while some samples are right (the pass@n / majority@n gap search exploits).

Splits are disjoint by construction: a question's split is a hash of its canonical text.

Use::

    from data_pipelines.toy.task import make_questions, sample_trace, ToyTaskConfig
    qs = make_questions("test", 200, seed=0)
"""

from __future__ import annotations

import hashlib
import random
import re
from dataclasses import dataclass, field

from gambit_core.questions import GeneratedSource, Question

MOD = 100
HARD_OPERAND = 7
SPLITS = ("train", "val", "test")


@dataclass(frozen=True)
class ToyTaskConfig:
    """How questions and training traces are drawn."""

    min_ops: int = 5
    """Fewest operations in a question."""
    max_ops: int = 8
    """Most operations in a question."""
    p_hard: float = 0.75
    """Slip probability of a hard step (carry or borrow with an operand of 7-9)."""
    p_carry: float = 0.12
    """Slip probability of any other step that carries or borrows."""
    p_easy: float = 0.02
    """Slip probability of any other step."""
    max_retries: int = 1
    """Retries after a failed check before the trace gives up and carries the value on."""
    check_after_giving_up: bool = False
    """Whether a trace that gave up keeps writing checks (False: it hurries on unchecked)."""
    split_weights: tuple[float, float, float] = field(default=(0.8, 0.1, 0.1))
    """Share of the question space for train / val / test."""


@dataclass(frozen=True)
class ToyQuestion:
    """A start value and signed operands."""

    start: int
    ops: tuple[int, ...]

    @property
    def text(self) -> str:
        ops = " ".join(f"{'+' if o >= 0 else '-'}{abs(o)}" for o in self.ops)
        return f"Start {self.start:02d}. Ops: {ops}. Mod {MOD}."

    @property
    def answer(self) -> int:
        v = self.start
        for o in self.ops:
            v = (v + o) % MOD
        return v

    def values(self) -> list[int]:
        """The correct running values after each operation."""
        out, v = [], self.start
        for o in self.ops:
            v = (v + o) % MOD
            out.append(v)
        return out


def split_of(q: ToyQuestion, cfg: ToyTaskConfig = ToyTaskConfig()) -> str:
    """The split a question belongs to, from a stable hash of its text."""
    h = int.from_bytes(hashlib.blake2b(q.text.encode(), digest_size=8).digest(), "big")
    u = (h % 10_000) / 10_000
    acc = 0.0
    for name, w in zip(SPLITS, cfg.split_weights, strict=True):
        acc += w
        if u < acc:
            return name
    return SPLITS[-1]


def draw_question(rng: random.Random, cfg: ToyTaskConfig = ToyTaskConfig()) -> ToyQuestion:
    """One random question (any split)."""
    n = rng.randint(cfg.min_ops, cfg.max_ops)
    # distinct single-digit signed operands: the step lookup is unambiguous
    ops = tuple(rng.sample([s * m for m in range(1, 10) for s in (1, -1)], n))
    return ToyQuestion(rng.randrange(MOD), ops)


def draw_questions(split: str, n: int, seed: int = 0, cfg: ToyTaskConfig = ToyTaskConfig()) -> list[ToyQuestion]:
    """``n`` distinct questions of ``split``, deterministic in ``seed``."""
    if split not in SPLITS:
        raise ValueError(f"unknown toy split {split!r}: expected one of {', '.join(SPLITS)}")
    if n <= 0:
        raise ValueError(f"need a positive number of toy questions, got {n}")
    rng = random.Random(f"toy-{split}-{seed}")
    seen: set[str] = set()
    out: list[ToyQuestion] = []
    while len(out) < n:
        q = draw_question(rng, cfg)
        if q.text in seen or split_of(q, cfg) != split:
            continue
        seen.add(q.text)
        out.append(q)
    return out


def make_questions(split: str, n: int, seed: int = 0):
    """Toy questions as loader ``Question`` records (``toy:test`` in ``load_questions``)."""
    return [
        Question(id=f"toy-{split}-{seed}-{i}", question=q.text, answer=str(q.answer), source=f"toy:{split}")
        for i, q in enumerate(draw_questions(split, n, seed))
    ]


def parse_question(text: str) -> ToyQuestion:
    """Inverse of ``ToyQuestion.text``."""
    m = re.fullmatch(r"Start (\d+)\. Ops: ([+\-\d ]+)\. Mod (\d+)\.", text.strip())
    if not m:
        raise ValueError(f"not a toy question: {text!r}")
    return ToyQuestion(int(m.group(1)), tuple(int(t) for t in m.group(2).split()))


# ---------------------------------------------------------------- traces


def step_kind(value: int, op: int) -> str:
    """'hard', 'carry' or 'easy', the systematic difficulty of applying ``op`` to ``value``.

    A step carries (or borrows) when the units digit overflows; it is hard when it
    carries with a large operand (7-9), the slips real models make most.
    """
    vu, ou = value % 10, abs(op)
    carry = vu + ou >= 10 if op >= 0 else vu < ou
    if carry and ou >= HARD_OPERAND:
        return "hard"
    return "carry" if carry else "easy"


def slip(value: int, op: int) -> int:
    """The systematic wrong result: the units carry (or borrow) is dropped."""
    right = (value + op) % MOD
    return (right - 10) % MOD if op >= 0 else (right + 10) % MOD


def step_text(value: int, op: int, result: int) -> str:
    return f"{value:02d}{'+' if op >= 0 else '-'}{abs(op)}={result:02d}"


def check_text(value: int, op: int, result: int) -> str:
    """Undo the step: result -op should give back value."""
    back = (result - op) % MOD
    verdict = "ok" if back == value else "no"
    return f"check {result:02d}{'-' if op >= 0 else '+'}{abs(op)}={back:02d} {verdict}"


@dataclass
class ToyTrace:
    """A sampled chain-of-thought and what went wrong in it."""

    text: str
    answer: int
    correct: bool
    first_wrong_step: int | None
    """0-based operation index of the first slip that was carried on (None if none)."""
    n_slips: int


def sample_trace(q: ToyQuestion, rng: random.Random, cfg: ToyTaskConfig = ToyTaskConfig()) -> ToyTrace:
    """Draw a training trace from the world's error model (slips, checks, retries)."""
    p = {"hard": cfg.p_hard, "carry": cfg.p_carry, "easy": cfg.p_easy}
    thoughts: list[str] = []
    v, true_v = q.start, q.start
    first_wrong, n_slips, gave_up = None, 0, False
    for i, op in enumerate(q.ops):
        true_v = (true_v + op) % MOD
        for _attempt in range(cfg.max_retries + 1):
            r = slip(v, op) if rng.random() < p[step_kind(v, op)] else (v + op) % MOD
            n_slips += r != (v + op) % MOD
            thoughts.append(step_text(v, op, r))
            if gave_up and not cfg.check_after_giving_up:
                break
            thoughts.append(check_text(v, op, r))
            if r == (v + op) % MOD:
                break
        else:
            gave_up = True
        if r != true_v and first_wrong is None:
            first_wrong = i
        v = r
    thoughts.append(f"\\boxed{{{v:02d}}}")
    return ToyTrace("\n\n".join(thoughts), v, v == q.answer, first_wrong, n_slips)


def reference_trace(q: ToyQuestion) -> str:
    """The slip-free chain of thought."""
    return sample_trace(q, random.Random(0), ToyTaskConfig(p_hard=0, p_carry=0, p_easy=0)).text


_STEP_ROLES = ["val_copy"] * 2 + ["op_sign", "op_digit", "eq", "res10", "res1"]
_CHECK = re.compile(r"(check )(\d\d[+-]\d=)(\d\d) (ok|no)")


def char_roles(trace: str) -> list[str]:
    """The role of every character of a trace in this world's format (a thought boundary is
    two characters, role ``boundary``): ``val_copy``, ``op_sign``, ``op_digit``, ``eq``,
    ``res10`` (the tens digit: where slips happen), ``res1`` in a step; ``chk_lit``,
    ``chk_copy``, ``chk_back``, ``verdict`` in a check; ``boxed``. Shows which sub-skill a
    model lacks (scripts/toy_token_loss.py)."""
    out: list[str] = []
    for k, th in enumerate(trace.split("\n\n")):
        if k:
            out += ["boundary", "boundary"]
        m = _CHECK.fullmatch(th) if th.startswith("check") else None
        if m:
            out += ["chk_lit"] * len(m.group(1)) + ["chk_copy"] * len(m.group(2)) + ["chk_back"] * 2
            out += ["chk_lit"] + ["verdict"] * 2
        elif th.startswith("\\boxed"):
            out += ["boxed"] * len(th)
        else:
            out += _STEP_ROLES[: len(th)] + ["other"] * max(0, len(th) - len(_STEP_ROLES))
    return out


_STEP = re.compile(r"^(\d+)([+\-])(\d+)=(\d+)$")


def first_wrong_step(q: ToyQuestion, completion: str) -> int | None:
    """Operation index (0-based) at which a generated trace's carried value first goes wrong.

    Retries count as the same operation; a malformed thought counts as wrong at the
    operation it was meant to perform. Returns None for a trace whose carried values and
    final answer are all right.
    """
    truth = q.values()
    i, last = 0, None
    for th in completion.split("\n\n"):
        th = th.strip()
        m = _STEP.match(th)
        if m:
            sign, b, r = m.group(2), int(m.group(3)), int(m.group(4))
            op = b if sign == "+" else -b
            if last is not None and last[0] == op:  # a retry of the same operation
                last = (op, r)
                continue
            if last is not None:
                if last[1] != truth[i]:
                    return i
                i += 1
                if i >= len(q.ops):
                    return len(q.ops) - 1
            if op != q.ops[i]:
                return i
            last = (op, r)
        elif th.startswith("check"):
            continue
        else:
            break
    if last is None:
        return 0
    if last[1] != truth[i] or i != len(q.ops) - 1:
        return i
    return None


SOURCE = GeneratedSource(name="toy", splits=SPLITS, make=make_questions)
"""``toy:<split>[:<count>]`` for :func:`gambit_core.questions.load_questions` (registered under
the ``gambit.datasets`` entry points in pyproject.toml)."""
