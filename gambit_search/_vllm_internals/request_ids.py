"""Gambit's vLLM request ids: the one piece of per-request state the driver hands the worker.

The capture hook in the worker sees only vLLM's request ids (and rows, positions, tokens), so
the driver packs what the worker needs to judge a request's rows into its id, built with
:func:`make_request_id`::

    gambit-<trace>-<incarnation>-p<trace prompt len>-<o|c>[s<first position>[n]][f<src>x<cut>][q]

vLLM appends ``-<8 random chars>`` to the external id internally, and that is the id the
model runner sees (``InputProcessor.assign_request_id``, read in 0.32.0; the capture ran on
0.26.0 too). :func:`parse_request_id` reads both forms into a
:class:`ReqKey`; any other id (a plain ``LLM.generate`` request) parses to None and is never
captured.
"""

from __future__ import annotations

import re
from typing import NamedTuple

__all__ = ["ReqKey", "make_request_id", "parse_request_id"]

_ID_RE = re.compile(
    r"^(gambit-(\d+)-(\d+)-p(\d+)-([oc])(?:s(\d+)(n?))?(?:f(\d+)x(\d+))?(q?))(?:-.*)?$")


def make_request_id(trace: int, incarnation: int, trace_prompt_len: int, closed: bool,
                    run_from: int | None = None, run_odd: bool = False,
                    src: int | None = None, cut: int | None = None, quiet: bool = False) -> str:
    """External vLLM request id of one incarnation of a trace.

    ``trace_prompt_len`` is the length of the trace's own prompt (not of the request's, which
    is longer for a revived trace): output positions start there. ``closed`` says the
    reasoning is already closed at the end of the request's prompt. ``run_from`` (split
    boundaries, see :class:`~gambit_search._vllm_internals.capture.CaptureSpec`): the first
    position whose row the worker judges by the newline run, and ``run_odd`` whether the
    trace's text before it ends in an odd run of newlines (state the worker cannot see: a
    fork's or a revive's earlier tokens). ``src``/``cut`` (scoring in the worker): the
    request continues trace ``src``'s scorer state over its boundaries at positions < ``cut``
    (a fork: the parent, cut at the child's prompt; a revive: the trace itself, cut at the
    tokens kept). ``quiet``: the worker's scorer skips this request's rows (nobody reads
    its scores).
    """
    run = "" if run_from is None else f"s{int(run_from)}{'n' if run_odd else ''}"
    if src is not None:
        run += f"f{int(src)}x{int(cut if cut is not None else 0)}"
    if quiet:
        run += "q"
    return f"gambit-{trace}-{incarnation}-p{trace_prompt_len}-{'c' if closed else 'o'}{run}"


class ReqKey(NamedTuple):
    """What a Gambit request id says."""

    ext: str
    """The external id (vLLM's internal id minus its random suffix)."""
    trace: int
    incarnation: int
    prompt_len: int
    """Length of the trace's own prompt: output positions start here."""
    closed: bool
    """Reasoning already closed at the end of the request's prompt."""
    run_from: int = -1
    """First position judged by the newline run (-1: ``prompt_len``)."""
    run_odd: bool = False
    """The text before ``run_from`` ends in an odd run of newlines."""
    src: int = -1
    """Trace whose scorer state this request continues (-1: a fresh state)."""
    cut: int = 0
    """Only ``src``'s boundaries at positions below this carry over."""
    quiet: bool = False
    """The worker's scorer skips this request's rows."""


def parse_request_id(request_id: str) -> ReqKey | None:
    """The :class:`ReqKey` of a Gambit request id (internal or external), else None."""
    m = _ID_RE.match(request_id)
    if m is None:
        return None
    return ReqKey(m.group(1), int(m.group(2)), int(m.group(3)), int(m.group(4)),
                  m.group(5) == "c", int(m.group(6)) if m.group(6) is not None else -1,
                  m.group(7) == "n", int(m.group(8)) if m.group(8) is not None else -1,
                  int(m.group(9)) if m.group(9) is not None else 0, m.group(10) == "q")
