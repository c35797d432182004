"""The vLLM engine's delivery rules: when a trace's tokens and boundary events reach the
caller, given that tokens and hidden states come from vLLM on two different channels.

Tokens come in vLLM's request outputs (deltas); boundary rows come from the worker over the
row channel (:mod:`gambit_search._vllm_internals.channel`), usually a step or two later.
:class:`Delivery` reconciles them on the engine's trace table (records of :class:`VTrace`):

* rows whose token the driver has not delivered yet wait in the trace's ``pending`` and
  become :class:`~gambit_search.engine.BoundaryEvent` s once it has (:meth:`Delivery.apply`,
  :meth:`Delivery.flush_pending`); rows of a dropped incarnation past what was delivered, and
  rows after the reasoning closed, are dropped;
* each worker message also lists the position of every Gambit row of its step, so the driver
  knows when a trace's last row (the state at its second-to-last token) is in (the trace's
  ``watermark``): a finishing delta is held back until then (:meth:`Delivery.finish`, at
  most ``HOLD_STEPS`` steps, then the engine runs a ``gambit_flush`` barrier and releases
  everything), which keeps the interface's promise that no event of a trace comes after its
  finishing delta;
* a held trace is a running trace whose newest tokens are not delivered yet (the interface's
  rule): its output, log-probs and events stop at the delivered tokens, fork branches from
  them, evict and abort drop the held delta (:meth:`Delivery.drop`; an evicted one revives
  from the delivered tokens).

Pure driver-side bookkeeping: no vLLM and no ZMQ here. Used by
:class:`~gambit_search.vllm_engine.VLLMEngine` only.
"""

from __future__ import annotations

import logging
import math
from collections.abc import KeysView
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from gambit_search.engine import BoundaryEvent, Delta, StepOutput, TraceStatus
from gambit_search.trace_table import TraceRecord, TraceTable

if TYPE_CHECKING:
    from gambit_search._vllm_internals.channel import RowMessage

__all__ = ["HOLD_STEPS", "Delivery", "VTrace", "merge_deltas"]

logger = logging.getLogger(__name__)

HOLD_STEPS = 4
"""Steps a finishing delta may wait for its trace's last rows before a flush barrier."""


def merge_deltas(deltas: list[Delta]) -> list[Delta]:
    """One delta per trace, as the interface promises: a trace's deltas of several engine
    steps taken in one :meth:`~gambit_search.engine.Engine.step` (catch-up) become one, at the
    first one's place, with their tokens, text and log-probs in order, the first's
    ``num_cached_tokens`` and the last's finish. Returns ``deltas`` itself when no trace
    repeats."""
    first: dict[int, int] = {}
    merged: list[Delta] = []
    for d in deltas:
        k = first.get(d.trace)
        if k is None:
            first[d.trace] = len(merged)
            merged.append(d)
            continue
        a = merged[k]
        lps = None if a.logprobs is None or d.logprobs is None else a.logprobs + d.logprobs
        merged[k] = Delta(d.trace, a.token_ids + d.token_ids, a.text + d.text, d.finish_reason,
                          lps, a.num_cached_tokens, d.error)
    return deltas if len(merged) == len(deltas) else merged


@dataclass
class VTrace(TraceRecord):
    """A trace of the vLLM engine: the shared record plus its request and row state."""

    text_start: int = 0  # index in prompt + output where the trace's decoded output begins (a
    # fork's is its parent's): the newline run of split boundaries is counted from there
    req_id: str | None = None
    first_output_pending: bool = True
    pending: dict[int, tuple[int, np.ndarray, float | None]] = field(default_factory=dict)
    # output index -> (token, row, worker's score): rows in before their token was delivered
    closed_at: int | None = None  # output index of the </think> that closed the reasoning
    # (negative: closed inside the prompt); None while the reasoning is open
    watermark: int = -1  # highest position the worker recorded for the current incarnation
    inc_limit: dict[int, int] = field(default_factory=dict)  # dropped incarnation -> output
    # length at the drop (its rows below that are still valid)
    # ``lps`` (shared record): may run ahead of ``output`` (rows can arrive before their delta)


class Delivery:
    """Delivers deltas and events on ``traces`` (see the module docstring).

    ``think``: the ``(<think>, </think>)`` token ids; ``hold``: whether finishing deltas wait
    for their trace's last rows (the engine captures); ``warn_after``: warn once when a trace
    with open reasoning has this many delivered output tokens after its last boundary (None:
    never; the engine passes None with ``stride`` set or capture off); ``boundary_text``: for
    that warning."""

    def __init__(self, traces: TraceTable[VTrace], think: tuple[int | None, int | None],
                 hold: bool, warn_after: int | None = None,
                 boundary_text: str | None = None) -> None:
        self._traces = traces
        self._think = think
        self._hold = hold
        self._warn_after = warn_after
        self._boundary_text = boundary_text
        self._warned_no_boundary = False
        # finishing deltas waiting for their trace's last rows: trace -> (delta, position of
        # the last row the request computed, steps waited)
        self._held: dict[int, list[Any]] = {}

    @property
    def holding(self) -> bool:
        """Whether any finishing delta is held back."""
        return bool(self._held)

    @property
    def held(self) -> KeysView[int]:
        """The traces whose finishing delta is held back (a live view of their ids)."""
        return self._held.keys()

    @property
    def overdue(self) -> bool:
        """Whether a held delta has waited ``HOLD_STEPS`` steps (time for a barrier)."""
        return any(h[2] >= HOLD_STEPS for h in self._held.values())

    # -- deltas ------------------------------------------------------------------------------
    def finish(self, t: VTrace, delta: Delta, out: StepOutput) -> None:
        """Deliver ``delta`` (vLLM's newest output of ``t``), or hold it when it finishes the
        trace and its last rows may still come."""
        if delta.finish_reason is not None and self._hold:
            # the request's last row is the state at its second-to-last token: hold the
            # finishing delta until that row is in, so no event comes after it. Until then
            # the trace is a running one whose newest tokens are not delivered (they are not
            # in its output; evict and abort drop them, fork branches before them).
            new = delta.token_ids
            self._held[t.id] = [delta, len(t.prompt) + len(t.output) + len(new) - 2, 0]
        else:
            self.deliver(t, delta, out)

    def deliver(self, t: VTrace, delta: Delta, out: StepOutput) -> None:
        """Make ``delta``'s tokens part of ``t``'s output and put it in ``out``, with the
        events its tokens unlock; a finishing delta finishes the trace."""
        new = delta.token_ids
        start = len(t.output)
        t.output.extend(new)
        if delta.num_cached_tokens is not None:
            t.num_cached_tokens = delta.num_cached_tokens
        ts, te = self._think
        if te is not None and (te in new or (ts is not None and ts in new)):
            for k, tok in enumerate(new):
                if tok == te and t.closed_at is None:
                    t.closed_at = start + k
                elif tok == ts and t.closed_at is not None:
                    t.closed_at = None  # re-opened
        if t.pending:
            out.boundaries.extend(self.flush_pending(t))
        if (not self._warned_no_boundary and self._warn_after is not None
                and t.closed_at is None
                and len(t.output) - 1 - t.last_emitted > self._warn_after):
            self._warned_no_boundary = True
            logger.warning(
                "trace %d has %d output tokens without a thought boundary (%r): no hidden "
                "state is captured there, so a scorer sees nothing. If the model rarely "
                "writes it, set VLLMEngineConfig(stride=N) to also capture every N tokens. "
                "(Warned once per engine; threshold NO_BOUNDARY_WARN_TOKENS=%d.)", t.id,
                len(t.output) - 1 - t.last_emitted, self._boundary_text, self._warn_after)
        if delta.finish_reason is not None:
            t.status = TraceStatus.FINISHED
            t.finish_reason = delta.finish_reason
            t.pending.clear()
        out.deltas.append(delta)

    def release(self, out: StepOutput, force: bool) -> None:
        """Deliver finishing deltas whose trace's rows are all in (all, with ``force``)."""
        for tid in list(self._held):
            h = self._held[tid]
            t = self._traces.by_id[tid]
            if force or t.watermark >= h[1]:
                del self._held[tid]
                self.deliver(t, h[0], out)
            else:
                h[2] += 1

    def drop(self, t: VTrace) -> None:
        """``t``'s request ended (evict, abort): drop a held finishing delta and forget
        everything past the delivered tokens (buffered rows, log-probs; late rows of this
        incarnation past them are ignored on arrival)."""
        self._held.pop(t.id, None)
        n = len(t.output)
        t.inc_limit[t.incarnation] = n
        for j in [j for j in t.pending if j >= n]:
            del t.pending[j]
        del t.lps[n:]

    # -- rows --------------------------------------------------------------------------------
    def apply(self, m: RowMessage, out: StepOutput) -> None:
        """Apply one worker message: watermarks, log-probs, and the events it completes."""
        traces = self._traces.by_id
        for tr, ic, p in zip(m.trace.tolist(), m.inc.tolist(), m.pos.tolist(), strict=True):
            t = traces.get(tr)
            if t is not None and t.incarnation == ic and p > t.watermark:
                t.watermark = p
        if m.lp is not None:
            self._apply_logprobs(m)
        touched: set[int] = set()
        for k, i in enumerate(m.keep.tolist()):
            tr, ic = int(m.trace[i]), int(m.inc[i])
            t = traces.get(tr)
            if t is None or t.status in (TraceStatus.ABORTED, TraceStatus.FINISHED):
                continue  # never an event after the finishing delta
            j = int(m.pos[i]) - len(t.prompt)
            if j <= t.last_emitted:
                continue
            if ic != t.incarnation and j >= t.inc_limit.get(ic, 0):
                continue  # a dropped incarnation's row past what was delivered
            t.pending[j] = (int(m.tok[k]), m.rows[k],
                            None if m.score is None else float(m.score[k]))
            touched.add(tr)
        for tid in sorted(touched):
            out.boundaries.extend(self.flush_pending(traces[tid]))

    def _apply_logprobs(self, m: RowMessage) -> None:
        """Store each row's input-token log-prob at its output index."""
        known = np.flatnonzero(~np.isnan(m.lp))
        if not len(known):
            return
        traces = self._traces.by_id
        for tr, ic, p, v in zip(m.trace[known].tolist(), m.inc[known].tolist(),
                                m.pos[known].tolist(), m.lp[known].tolist(), strict=True):
            t = traces.get(tr)
            if t is None or t.status is TraceStatus.ABORTED:
                continue
            j = p - len(t.prompt)
            if j < 0 or (ic != t.incarnation and j >= t.inc_limit.get(ic, 0)):
                continue  # a prompt token, or a dropped incarnation's token never delivered
            lps = t.lps
            if j >= len(lps):
                lps.extend([math.nan] * (j + 1 - len(lps)))
            lps[j] = v

    def flush_pending(self, t: VTrace) -> list[BoundaryEvent]:
        """Turn buffered rows whose token the driver has seen into events."""
        events = []
        n = len(t.output)
        for j in sorted(t.pending):
            if j >= n:
                if t.status is not TraceStatus.RUNNING:
                    del t.pending[j]  # the token was never delivered: drop
                continue
            tok, vec, score = t.pending.pop(j)
            if j <= t.last_emitted or t.output[j] != tok:
                continue
            if t.closed_at is not None and j > t.closed_at:
                continue
            ev = BoundaryEvent(t.id, len(t.prompt) + j, j, tok, vec, score)
            t.last_emitted = j
            t.last_event = ev
            events.append(ev)
        return events
