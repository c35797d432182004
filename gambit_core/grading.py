"""Answer extraction and equivalence for math and multiple-choice grading (the vote bins that
pool equivalent answers: :mod:`gambit_core.vote_bins`).

The grading rules (see docs/REFERENCE.md, "Grading"):

* the answer of a completion is the content of its last ``\\boxed{...}`` (or ``\\fbox{...}``),
  brace-matched; multiple-choice (GPQA) answers are one letter A-D;
* two answers are equal when Hugging Face ``math-verify`` says so, gold first:
  ``verify(parse(gold), parse(pred))``. Bare answers are wrapped in ``\\boxed{}`` first;
  plain-text math (``sqrt(2)/2``, ``pi/3``, ``2+4*ln(2)``, ``C(n,k)``: some gold answers
  are written so) is rewritten as LaTeX, which math-verify otherwise misreads. One guard on
  top: answers that both evaluate to numbers (or tuples / sets / intervals of numbers) must
  agree to a relative ``NUMERIC_REL_TOL``; math-verify alone rounds to 6 decimals and calls
  all tiny values equal (``1/2^2011 == 1/2^2012``). The guard also skips most verify calls;
* votes are pooled over bins of answers that ``math-verify`` judges equal, not over exact
  strings.

Usage::

    from gambit_core.grading import extract_boxed, grade, is_equivalent

    extract_boxed(r"so the answer is \\boxed{\\frac{1}{2}}.")   # -> r"\\frac{1}{2}"
    is_equivalent("1/2", r"\\frac{1}{2}")                       # -> True
    grade("70", r"... \\boxed{70}")                             # -> ("70", True)

Thread safety: math-verify bounds parse/verify time with ``SIGALRM``, which only works in
the main thread. Here the timeouts are used in the main thread and switched off in any
other thread, and all math-verify calls are serialized by one lock (sympy and the LaTeX
parser are CPU-bound under the GIL, so the lock costs no parallelism). Parses are cached.
"""

from __future__ import annotations

import functools
import inspect
import re
import threading
from collections.abc import Sequence
from typing import Any, NamedTuple

import mpmath
import sympy
from math_verify import parse, verify

__all__ = [
    "NUMERIC_REL_TOL",
    "PARSE_TIMEOUT_S",
    "VERIFY_TIMEOUT_S",
    "extract_boxed",
    "extract_choice",
    "grade",
    "is_equivalent",
    "normalize_answer",
    "parse_answer",
]

#: math-verify time limits (seconds), applied only in the main thread (SIGALRM).
PARSE_TIMEOUT_S: int = 5
VERIFY_TIMEOUT_S: int = 5
#: Two answers that both evaluate to numbers must agree to this relative tolerance.
NUMERIC_REL_TOL: float = 1e-6

_MV_LOCK = threading.RLock()

# ---------------------------------------------------------------------------------------
# Extraction
# ---------------------------------------------------------------------------------------

_BOXED_RE = re.compile(r"\\(?:boxed|fbox)\s*\{")


def _match_brace(text: str, open_idx: int) -> int | None:
    """Index of the ``}`` closing the ``{`` at ``open_idx``; escaped ``\\{``/``\\}`` skipped."""
    depth = 0
    i = open_idx
    n = len(text)
    while i < n:
        c = text[i]
        if c == "\\":
            i += 2  # skip the escaped character (\{, \}, \\)
            continue
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return None


def extract_boxed(text: str) -> str | None:
    r"""Content of the last top-level ``\boxed{...}`` (or ``\fbox{...}``) in ``text``.

    Braces are matched (nested groups and escaped ``\{``/``\}`` are handled). A box nested
    inside another box belongs to the outer one. Returns None when there is no box or the
    last one is not closed (e.g. a truncated generation).
    """
    result: str | None = None
    found = False
    covered_until = -1  # end of the last top-level box; matches before this are nested
    for m in _BOXED_RE.finditer(text):
        if m.start() < covered_until:
            continue
        found = True
        open_idx = m.end() - 1
        close_idx = _match_brace(text, open_idx)
        if close_idx is None:
            return None  # unbalanced: everything after it is inside the open box
        result = text[open_idx + 1 : close_idx]
        covered_until = close_idx + 1
    return result if found else None


_TEXT_WRAPPER_RE = re.compile(r"\\(?:text|textbf|mathrm|mathbf|textrm|mbox)\s*\{([^{}]*)\}")
_BOXED_LETTER_RE = re.compile(r"^\(?\s*([A-D])\s*\)?\s*[.:]?$|^\(?([A-D])[).:]\s")
_ANSWER_LETTER_RE = re.compile(
    r"(?i:answer)\s*(?:(?i:is)|:)?\s*:?\s*(?:(?i:option)\s*)?(?:\*\*)?\s*\(?\s*([A-D])\s*\)?"
    r"(?![A-Za-z0-9])"
)


def _choice_from_boxed(content: str) -> str | None:
    s = content.strip()
    for _ in range(3):  # unwrap \text{\textbf{...}} etc.
        s2 = _TEXT_WRAPPER_RE.sub(r"\1", s).strip()
        if s2 == s:
            break
        s = s2
    m = _BOXED_LETTER_RE.match(s)
    if m is None:
        return None
    return m.group(1) or m.group(2)


def extract_choice(text: str) -> str | None:
    r"""Multiple-choice letter A-D from ``text``, or None.

    Candidates are boxed letters (``\boxed{C}``, ``\boxed{\text{(C)}}``) and phrases like
    "the answer is (C)" / "Answer: C"; the one that occurs last in the text wins.
    """
    best: tuple[int, str] | None = None
    covered_until = -1
    for m in _BOXED_RE.finditer(text):
        if m.start() < covered_until:
            continue
        close_idx = _match_brace(text, m.end() - 1)
        if close_idx is None:
            break
        covered_until = close_idx + 1
        letter = _choice_from_boxed(text[m.end() : close_idx])
        if letter is not None:
            best = (m.start(), letter)
    for m in _ANSWER_LETTER_RE.finditer(text):
        letter = m.group(1).upper()
        if best is None or m.start() > best[0]:
            best = (m.start(), letter)
    return None if best is None else best[1]


# ---------------------------------------------------------------------------------------
# Equivalence
# ---------------------------------------------------------------------------------------


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _timeout_kwarg(fn: Any, names: Sequence[str]) -> str | None:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # pragma: no cover - builtins / C functions
        return None
    return next((n for n in names if n in params), None)


_PARSE_TIMEOUT_KW = _timeout_kwarg(parse, ("parsing_timeout", "timeout_seconds"))
_VERIFY_TIMEOUT_KW = _timeout_kwarg(verify, ("timeout_seconds", "parsing_timeout"))


def normalize_answer(answer: str) -> str:
    """``answer`` with its whitespace runs collapsed (the exact-match key before math-verify)."""
    return " ".join(answer.split())


_ASCII_FUNC_RE = re.compile(r"(?<![A-Za-z\\])(sqrt|ln|log|exp|sin|cos|tan|binom|comb|C)\(")
_ASCII_PI_RE = re.compile(r"(?<![A-Za-z\\])pi(?![A-Za-z])")


def _match_paren(text: str, open_idx: int) -> int | None:
    depth = 0
    for i in range(open_idx, len(text)):
        if text[i] == "(":
            depth += 1
        elif text[i] == ")":
            depth -= 1
            if depth == 0:
                return i
    return None


def _split_top_level_comma(text: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for i, c in enumerate(text):
        if c in "({[":
            depth += 1
        elif c in ")}]":
            depth -= 1
        elif c == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return parts


def _ascii_to_latex(answer: str) -> str:
    """Rewrite plain-text math (``sqrt(2)/2``, ``pi/3``, ``2+4*ln(2)``, ``C(n,k)``) as LaTeX.

    math-verify reads such strings badly (``pi`` -> ``p*i``, ``ln(2)`` -> ``l*n(2)``,
    ``sqrt((7+2*sqrt(13))/3)`` -> ``2``), and some gold answers are written this way.
    Strings holding a backslash are taken to be LaTeX already and left alone.
    """
    if "\\" in answer:
        return answer
    out: list[str] = []
    pos = 0
    for m in _ASCII_FUNC_RE.finditer(answer):
        if m.start() < pos:
            continue  # inside a call already rewritten
        close = _match_paren(answer, m.end() - 1)
        if close is None:
            break
        name, inner = m.group(1), _ascii_to_latex(answer[m.end() : close])
        args = _split_top_level_comma(inner)
        if name == "sqrt":
            rep = f"\\sqrt{{{inner}}}"
        elif name == "exp":
            rep = f"e^{{{inner}}}"
        elif name in ("binom", "comb", "C"):
            if len(args) != 2:
                continue
            rep = f"\\binom{{{args[0].strip()}}}{{{args[1].strip()}}}"
        else:
            rep = f"\\{name}({inner})"
        out.append(answer[pos : m.start()])
        out.append(rep)
        pos = close + 1
    out.append(answer[pos:])
    return _ASCII_PI_RE.sub(r"\\pi ", "".join(out))


_SIZING_RE = re.compile(r"\\(?:[Bb]igg?[lrm]?)(?![A-Za-z])")


def _prepare(answer: str) -> str:
    """Text handed to math-verify: plain math made LaTeX, ``\\big``-style sizing dropped, boxed."""
    return _wrap(_SIZING_RE.sub("", _ascii_to_latex(answer)))


def _wrap(answer: str) -> str:
    """Make a bare answer parseable as LaTeX: ``\\frac{1}{2}`` -> ``\\boxed{\\frac{1}{2}}``."""
    if "\\boxed" in answer or "\\fbox" in answer or "$" in answer:
        return answer
    if answer.startswith(("\\(", "\\[")):
        return answer
    return f"\\boxed{{{answer}}}"


@functools.lru_cache(maxsize=65536)
def _parse_cached(answer: str, main_thread: bool) -> tuple[Any, ...]:
    kwargs: dict[str, Any] = {}
    if _PARSE_TIMEOUT_KW is not None:
        kwargs[_PARSE_TIMEOUT_KW] = PARSE_TIMEOUT_S if main_thread else None
    with _MV_LOCK:
        parsed = parse(_prepare(answer), **kwargs)
        if not parsed:
            # Plain-text forms math-verify's LaTeX reader rejects ("sqrt(2)/2").
            parsed = parse(answer, **kwargs)
    return tuple(parsed)


def parse_answer(answer: str) -> list[Any]:
    """math-verify parse of a bare or LaTeX answer (cached); ``[]`` when it does not parse."""
    answer = normalize_answer(answer)
    if not answer:
        return []
    return list(_parse_cached(answer, _in_main_thread()))


_Number = tuple[mpmath.mpf, mpmath.mpf]  # (re, im)


class _Fingerprint(NamedTuple):
    """Numeric shape of an answer: a number, or a tuple / set / interval of fingerprints."""

    kind: str  # "num" | "tuple" | "set" | "interval"
    value: _Number | None  # for "num"
    items: tuple[_Fingerprint, ...] = ()  # for the containers (interval: its two ends)


def _number(expr: sympy.Expr) -> _Number | None:
    symbols = expr.free_symbols
    if symbols and all(getattr(x, "name", None) == "i" for x in symbols):
        # math-verify reads "3i" as 3*Symbol("i"): take it as the imaginary unit here
        expr = expr.subs({x: sympy.I for x in symbols})
    if expr.free_symbols or not expr.is_number:
        return None
    try:
        re_part, im_part = sympy.N(expr, 30).as_real_imag()
        value = (
            mpmath.mpf(sympy.Float(re_part, 30)._mpf_),
            mpmath.mpf(sympy.Float(im_part, 30)._mpf_),
        )
    except Exception:
        return None
    return value if all(mpmath.isfinite(v) for v in value) else None


def _shape(expr: Any, depth: int = 0) -> _Fingerprint | None:
    if depth > 3:
        return None
    if isinstance(expr, sympy.Interval):
        parts: tuple[Any, ...] = (expr.start, expr.end)
        kind = "interval"
    elif isinstance(expr, sympy.FiniteSet | sympy.Tuple):
        parts = tuple(expr.args)
        kind = "set" if isinstance(expr, sympy.FiniteSet) else "tuple"
    elif isinstance(expr, sympy.Expr):
        value = _number(expr)
        return None if value is None else _Fingerprint("num", value)
    else:
        return None
    items = tuple(_shape(e, depth + 1) for e in parts)
    if not items or any(i is None for i in items):
        return None
    return _Fingerprint(kind, None, items)  # type: ignore[arg-type]


@functools.lru_cache(maxsize=65536)
def _fingerprint(answer: str, main_thread: bool) -> _Fingerprint | None:
    """Numeric fingerprint of a parsed answer; None when it holds anything but numbers."""
    parsed = _parse_cached(answer, main_thread)
    if not parsed:
        return None
    with _MV_LOCK:
        return _shape(parsed[0])


def _close(a: _Number, b: _Number) -> bool:
    diff = mpmath.hypot(a[0] - b[0], a[1] - b[1])
    scale = max(mpmath.hypot(*a), mpmath.hypot(*b))
    return bool(diff <= NUMERIC_REL_TOL * scale)


def _surely_different(a: _Fingerprint, b: _Fingerprint) -> bool:
    """True when two fingerprints cannot denote equal answers (so math-verify is skipped).

    Numbers must agree to ``NUMERIC_REL_TOL``; a number never equals a container of 2+
    items; containers must have equal lengths and agree as sets when either is a set, else
    item by item (tuples, interval ends). A 1-item container against a number or another
    kind of container is left to math-verify, and so is anything that is not numeric.
    """
    if a.kind == "num" and b.kind == "num":
        assert a.value is not None and b.value is not None
        return not _close(a.value, b.value)
    if "num" in (a.kind, b.kind):
        return len((b if a.kind == "num" else a).items) >= 2
    if a.kind != b.kind and min(len(a.items), len(b.items)) < 2:
        return False  # e.g. {(1, 2)} against (1, 2): let math-verify decide
    if len(a.items) != len(b.items):
        return True
    if "set" in (a.kind, b.kind):  # compare as sets
        return any(all(_surely_different(x, y) for y in b.items) for x in a.items) or any(
            all(_surely_different(x, y) for x in a.items) for y in b.items
        )
    return any(_surely_different(x, y) for x, y in zip(a.items, b.items, strict=True))


@functools.lru_cache(maxsize=262144)
def _verify_cached(gold: str, pred: str, main_thread: bool) -> bool:
    g = _parse_cached(gold, main_thread)
    p = _parse_cached(pred, main_thread)
    if not g or not p:
        return False
    fg, fp = _fingerprint(gold, main_thread), _fingerprint(pred, main_thread)
    if fg is not None and fp is not None and _surely_different(fg, fp):
        # Different numbers. Also fixes math-verify's 6-decimal rounding, which calls all
        # tiny values equal (1/2^2011 == 1/2^2012), and skips a slow verify call.
        return False
    kwargs: dict[str, Any] = {}
    if _VERIFY_TIMEOUT_KW is not None:
        kwargs[_VERIFY_TIMEOUT_KW] = VERIFY_TIMEOUT_S if main_thread else None
    with _MV_LOCK:
        try:
            return bool(verify(list(g), list(p), **kwargs))
        except Exception:  # math-verify swallows most errors itself; be safe anyway
            return False


_INT = re.compile(r"[+-]?[0-9]+")


def is_equivalent(gold: str, pred: str) -> bool:
    """True when math-verify judges ``pred`` equal to ``gold`` (gold first, as verify wants).

    Bare answers (``1/2``, ``\\frac{1}{2}``, ``0.5``) are wrapped in ``\\boxed{}`` before
    parsing. Identical strings (up to whitespace) are equal even if they do not parse; an
    empty answer equals nothing. Numeric answers must also agree to ``NUMERIC_REL_TOL``
    (relative). Safe to call from any thread (no timeout off the main thread).
    """
    g = normalize_answer(gold)
    p = normalize_answer(pred)
    if not g or not p:
        return False
    if g == p:
        return True
    if _INT.fullmatch(g) and _INT.fullmatch(p):
        # two plain integers (AIME-style, the toy world): math-verify's verdict is their
        # equality, without its LaTeX parse (~10 ms each, most of a harvest's grading time)
        return int(g) == int(p)
    return _verify_cached(g, p, _in_main_thread())



def grade(gold: str, completion: str) -> tuple[str | None, bool]:
    """Extract the last boxed answer of ``completion`` and compare it with ``gold``.

    Returns ``(extracted_answer_or_None, correct)``.
    """
    pred = extract_boxed(completion)
    if pred is None:
        return None, False
    return pred, is_equivalent(gold, pred)
