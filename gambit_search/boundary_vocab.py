"""Thought boundaries on a real tokenizer's vocabulary: which token ids end a thought, worked
out once per engine from the decoded vocabulary, so nothing is detokenized per step.

Boundary definition: the token at which the decoded output first holds a new
``boundary_text`` ("\\n\\n"; counted left to right without overlap, from the start of the
trace's output, a fork's from its root's), at an output position, while the reasoning is open
(before ``</think>`` when the tokenizer has it as one token; a prompt that already closed it
captures nothing). That is a token whose own text contains "\\n\\n" (also merged with text:
".\\n\\n"; :func:`boundary_token_ids`), or one whose text starts with "\\n" after text
ending in an odd run of newlines ("\\n" then "\\n", as SmolLM2 writes it; split boundaries,
:func:`run_classes`). The vLLM worker decides this from these per-id classes and a one-bit
state per request (the driver passes the state at a request's start in its id:
:meth:`BoundaryVocab.odd_run`). :func:`text_boundaries` is the same rule on decoded text (the
reference the tests hold the id rule to).

Used by :class:`~gambit_search.vllm_engine.VLLMEngine` (one :class:`BoundaryVocab` per
engine, sent to the worker in its capture spec) and by the scorer checkpoints, whose
fingerprint of the boundary rule is :func:`boundary_token_ids`::

    vocab = BoundaryVocab.from_tokenizer(tokenizer, "\\n\\n", split_boundaries=True)
    vocab.boundary_ids, vocab.runs["start"], vocab.closed_after(prompt_ids)

No vLLM import: a tokenizer (``transformers``) is all it needs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["BoundaryVocab", "boundary_token_ids", "closed_after", "run_classes",
           "text_boundaries", "think_token_ids", "token_texts"]


def token_texts(tokenizer: Any) -> list[str]:
    """The decoded text of every token id, alone (special tokens included)."""
    n = len(tokenizer)
    return tokenizer.batch_decode([[i] for i in range(n)], skip_special_tokens=False,
                                  clean_up_tokenization_spaces=False)


def boundary_token_ids(tokenizer: Any, text: str = "\n\n",
                       texts: Sequence[str] | None = None) -> list[int]:
    """Ids of every token whose decoded text contains ``text`` (the boundaries that one token
    makes on its own; also the scorer checkpoints' fingerprint of the boundary rule)."""
    pieces = token_texts(tokenizer) if texts is None else texts
    return [i for i, s in enumerate(pieces) if text in s]


def run_classes(texts: Sequence[str], char: str = "\n") -> dict[str, list[int]]:
    """Token classes for boundaries whose two ``char`` come in two tokens (see
    :class:`~gambit_search._vllm_internals.capture.CaptureSpec`): ``start`` (text starts with
    ``char``), ``odd`` (not all ``char``, ends in an odd run of it), ``flip`` (an odd number
    of ``char`` only), ``keep`` (an even number >= 2 of ``char`` only)."""
    out: dict[str, list[int]] = {"start": [], "odd": [], "flip": [], "keep": []}
    for i, s in enumerate(texts):
        if not s or (s[0] != char and s[-1] != char):
            continue
        if s[0] == char:
            out["start"].append(i)
        body = s.rstrip(char)
        run = len(s) - len(body)
        if not body:
            out["flip" if run % 2 else "keep"].append(i)
        elif run % 2:
            out["odd"].append(i)
    return out


def text_boundaries(texts: Sequence[str], text: str = "\n\n") -> list[int]:
    """Reference rule on decoded pieces (tests, analysis): the indices ``j`` at which the
    non-overlapping count of ``text`` in ``"".join(texts[: j + 1])`` grows, i.e. the tokens at
    which the decoded output first holds a new ``text``."""
    out, joined, count = [], "", 0
    for j, s in enumerate(texts):
        joined += s
        c = joined.count(text)
        if c > count:
            out.append(j)
        count = c
    return out


def think_token_ids(tokenizer: Any, start: str, end: str) -> tuple[int | None, int | None]:
    """Single-token ids of the reasoning delimiters (None where the vocab lacks them)."""
    vocab = tokenizer.get_vocab()
    return vocab.get(start), vocab.get(end)


def closed_after(ids: Sequence[int], think_start: int | None, think_end: int | None) -> bool:
    """Whether the reasoning is closed at the end of ``ids`` (</think> after the last
    <think>)."""
    if think_end is None:
        return False
    last_end = last_start = -1
    for i in range(len(ids) - 1, -1, -1):
        t = ids[i]
        if t == think_end and last_end < 0:
            last_end = i
            if think_start is None:
                break
        elif think_start is not None and t == think_start and last_start < 0:
            last_start = i
        if last_end >= 0 and last_start >= 0:
            break
    return last_end > last_start


def _no_runs() -> dict[str, list[int]]:
    return {"start": [], "odd": [], "flip": [], "keep": []}


@dataclass(frozen=True)
class BoundaryVocab:
    """One engine's boundary token classes (empty: no boundary tokens, e.g. capture off)."""

    boundary_ids: list[int] = field(default_factory=list)
    """Tokens whose own text holds the boundary text."""
    runs: dict[str, list[int]] = field(default_factory=_no_runs)
    """Split-boundary classes (:func:`run_classes`; all empty: split boundaries off)."""
    think_start: int | None = None
    """``<think>`` as one token, if the vocabulary has it."""
    think_end: int | None = None
    """``</think>`` as one token, if the vocabulary has it."""
    boundary_set: frozenset[int] = field(init=False, repr=False, compare=False)
    """``boundary_ids`` as a set."""
    _odd: frozenset[int] = field(init=False, repr=False, compare=False)
    _flip: frozenset[int] = field(init=False, repr=False, compare=False)
    _keep: frozenset[int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:  # the derived lookups of a frozen instance
        object.__setattr__(self, "boundary_set", frozenset(self.boundary_ids))
        for k in ("odd", "flip", "keep"):
            object.__setattr__(self, f"_{k}", frozenset(self.runs[k]))

    @classmethod
    def from_tokenizer(cls, tokenizer: Any, boundary_text: str | None,
                       split_boundaries: bool = True, think_start_text: str = "<think>",
                       think_end_text: str = "</think>") -> BoundaryVocab:
        """The classes of ``tokenizer``'s vocabulary. ``boundary_text`` None: stride only (no
        boundary tokens); split boundaries only for a boundary text of two equal characters."""
        ids: list[int] = []
        runs = _no_runs()
        if boundary_text is not None:
            texts = token_texts(tokenizer)
            ids = boundary_token_ids(tokenizer, boundary_text, texts)
            bt = boundary_text
            if split_boundaries and len(bt) == 2 and bt[0] == bt[1]:
                runs = run_classes(texts, bt[0])
        ts, te = think_token_ids(tokenizer, think_start_text, think_end_text)
        return cls(ids, runs, ts, te)

    @property
    def has_boundaries(self) -> bool:
        """Whether any token can be a boundary (one-token or split)."""
        return bool(self.boundary_ids or self.runs["start"])

    @property
    def think(self) -> tuple[int | None, int | None]:
        """``(think_start, think_end)``."""
        return self.think_start, self.think_end

    def closed_after(self, ids: Sequence[int]) -> bool:
        """:func:`closed_after` with this vocabulary's delimiters."""
        return closed_after(ids, self.think_start, self.think_end)

    def odd_run(self, ids: Sequence[int], start: int, end: int) -> bool:
        """Whether the text of ``ids[start:end]`` ends in an odd run of newlines."""
        odd = False
        for i in range(end - 1, start - 1, -1):
            t = ids[i]
            if t in self._flip:
                odd = not odd
            elif t not in self._keep:
                return odd != (t in self._odd)
        return odd

    def capture_fields(self) -> dict[str, Any]:
        """The :class:`~gambit_search._vllm_internals.capture.CaptureSpec` fields these
        classes fill."""
        r = self.runs
        return {"boundary_ids": self.boundary_ids, "run_start_ids": r["start"],
                "run_odd_ids": r["odd"], "run_flip_ids": r["flip"], "run_keep_ids": r["keep"],
                "think_start": self.think_start, "think_end": self.think_end}
