"""Hidden-state capture inside the vLLM worker: record the rows the sampler sees, keep the
boundary rows, ship them to the driver.

Driven by the runner hooks (:mod:`~gambit_search._vllm_internals.runner_hooks`), which call
:meth:`RowCapture.record` once per engine step with the step's rows (one post-final-norm
last-layer state per scheduled request), their request ids, positions and input tokens;
configured by a :class:`CaptureSpec` the driver sends once (``gambit_install``). Pure
Python/torch: no vLLM import, so it is unit tested without an engine.

Row semantics (vLLM facts, 0.26.0 and 0.32.0): the row of request r at position p is the
state *at* the token at position p, from which token p+1 is sampled. So the state at an
output boundary token arrives one engine step after that token was sampled; partial prefill
chunks, preemption recompute and the extra step after a stop (async scheduling) add rows at
positions seen before, and a request that finishes right after a boundary token may never
produce its row.

Nothing is copied to the host synchronously inside the step: the gathered rows are copied
without waiting and filtered once their data is known to be complete (at once on CPU; a
CUDA event checked at the next step on GPU). Which rows are kept:
:mod:`~gambit_search._vllm_internals.row_filter`; how they travel:
:mod:`~gambit_search._vllm_internals.channel`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from gambit_search._vllm_internals.channel import (
    RowPusher,
    decode_message,
    encode_message,
    encode_rows,
)
from gambit_search._vllm_internals.logprobs import SampledLogprobs
from gambit_search._vllm_internals.row_filter import RowFilter
from gambit_search._vllm_internals.spec import CaptureSpec
from gambit_search.scoring import ScoreBook

__all__ = ["CaptureSpec", "RowCapture"]


@dataclass
class _Step:
    req_ids: list[str]
    rows: torch.Tensor  # [n, d], model dtype: on the host (pinned, filled async on CUDA)
    pos: torch.Tensor  # [n] host
    tok: torch.Tensor  # [n] host
    lp: torch.Tensor | None = None  # [n] host float32: log-prob of the input token (NaN: unknown)
    event: Any = None  # CUDA event recorded after the host copies (None: ready at once)
    device: Any = None  # the device the rows came from (where the scorer runs)


def _to_host(t: torch.Tensor, fresh: bool = False) -> torch.Tensor:
    """A host copy of ``t`` that never waits for the device: on CUDA a non-blocking copy into
    pinned memory (torch's caching host allocator reuses the blocks, so this costs no
    ``cudaHostAlloc`` per step once warm), ordered on the current stream before whatever the
    next step writes into ``t``; the copy is complete when the step's event is. On the CPU a
    clone (the runner reuses its buffers), or ``t`` itself when ``fresh`` (a tensor this step
    made, e.g. by ``index_select``: nobody else writes into it)."""
    if t.is_cuda:
        h = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        h.copy_(t, non_blocking=True)
        return h
    return t.detach() if fresh else t.detach().clone()


class RowCapture:
    """Records sampler rows each step, filters them to boundary rows, ships them in order.

    ``record`` gathers on the device only. Steps are filtered as soon as their data is known
    to be on hand (at once on CPU; on CUDA when the event recorded after the gathers has
    completed, checked at the next record, or when more than ``max_pending_steps`` wait),
    so a GPU step is never synchronised. Each recorded step becomes one message
    (:class:`~gambit_search._vllm_internals.channel.RowMessage`): the (trace, incarnation,
    position) of every Gambit row (so the driver knows which rows exist: its watermark) plus
    the kept rows (float32, host), pushed non-blocking to ``spec.sink``; what cannot be sent
    yet waits in an outbox, in order. :meth:`flush` is the barrier the driver uses when it
    needs everything (returns the last sequence number sent and the unsent messages);
    :meth:`drain` returns the kept rows as one blob (no sink: tests).
    """

    def __init__(self, spec: CaptureSpec, scorer: Any = None) -> None:
        """``scorer``: a loaded scorer (on the model's device) to score the kept rows with
        (:class:`~gambit_search.scoring.ScoreBook`); the spec names its checkpoint."""
        self.spec = spec
        self._book: ScoreBook | None = None if scorer is None else ScoreBook(scorer)
        self._started_of: list | None = None  # the keys list the book's starts were read for
        self._stream: Any = None  # CUDA stream of the scorer's forwards
        self._rule = RowFilter(spec)
        self._logprobs = SampledLogprobs()
        self._last_ids: list[str] | None = None  # the last recorded step's request ids,
        self._last_keep: list[int] = []  # the rows of its Gambit requests,
        self._last_kept_ids: list[str] = []  # and their ids
        self._pending: list[_Step] = []
        # filtered steps whose scores are still on the device: (message fields, host scores,
        # CUDA event after their copy or None), encoded in order once their event completes
        self._late: list[tuple[tuple, Any, Any]] = []
        self._out = RowPusher(spec.sink)
        self._seq = 0  # last sequence number handed to the outbox
        self.rows_seen = 0
        self.rows_kept = 0
        self.steps_recorded = 0
        self.seconds = 0.0  # wall seconds spent in record (gather, filter, send)
        self.cpu_seconds = 0.0  # CPU seconds of this thread in record
        self.score_seconds = 0.0  # wall seconds of those spent scoring

    @property
    def rows_scored(self) -> int:
        """Boundary rows the worker's scorer has scored (0: no scorer)."""
        return 0 if self._book is None else self._book.rows_scored

    @property
    def messages(self) -> int:
        """Messages made so far (the last sequence number)."""
        return self._seq

    # -- recording (hot path) ------------------------------------------------------------
    def record(
        self,
        req_ids: Sequence[str],
        rows: torch.Tensor,
        positions: torch.Tensor,
        tokens: torch.Tensor,
        logits: torch.Tensor | None = None,
    ) -> None:
        """Record one step: row i of ``rows`` belongs to ``req_ids[i]`` at ``positions[i]``
        whose input token is ``tokens[i]`` (all tensors on the same device). ``logits`` (the
        rows' logits, [n, vocab]) feeds the sampled-token log-probs when the spec asks."""
        t0, c0 = time.perf_counter(), time.thread_time()
        try:
            self._record(req_ids, rows, positions, tokens, logits)
        finally:
            self.seconds += time.perf_counter() - t0
            self.cpu_seconds += time.thread_time() - c0

    def _record(self, req_ids: Sequence[str], rows: torch.Tensor, positions: torch.Tensor,
                tokens: torch.Tensor, logits: torch.Tensor | None = None) -> None:
        n = len(req_ids)
        if n == 0:
            return
        # Most decode steps see the same requests in the same rows as the step before: then
        # the Gambit rows and their id list are the last step's (the same list object, which
        # RowFilter.select recognises to reuse its parsed keys). Nobody mutates these lists.
        ids_now = req_ids if isinstance(req_ids, list) else list(req_ids)
        parse = self._rule.parse
        if ids_now == self._last_ids:
            keep, ids = self._last_keep, self._last_kept_ids
        else:
            keep = [i for i, r in enumerate(ids_now) if parse(r) is not None]
            ids = [ids_now[i] for i in keep]
            self._last_ids, self._last_keep, self._last_kept_ids = list(ids_now), keep, ids
        if not keep:
            return
        self.steps_recorded += 1
        self.rows_seen += len(keep)
        fresh = len(keep) < n  # index_select makes new tensors: no clone needed on the CPU
        if not fresh:
            r, p, t = rows[:n], positions[:n], tokens[:n]
            lg = logits[:n] if logits is not None else None
        else:
            idx = torch.tensor(keep, dtype=torch.long).to(rows.device, non_blocking=True)
            r, p, t = (x.index_select(0, idx) for x in (rows, positions, tokens))
            lg = logits.index_select(0, idx) if logits is not None else None
        lp = None
        if self.spec.logprobs:
            if lg is not None:
                lp = self._logprobs.step(ids, p, t, lg)
            else:  # a step without logits (stand-in runners): unknown
                lp = torch.full((len(ids),), float("nan"), device=p.device)
        # Everything goes to the host now, without waiting: a blocking copy later (in
        # _filter, while the next step's forward is queued) would wait for that forward and
        # take away the CPU/GPU overlap of vLLM's async scheduling (seen on 0.26.0 MRV2).
        step = _Step(ids, _to_host(r, fresh), _to_host(p, fresh), _to_host(t, fresh),
                     None if lp is None else _to_host(lp, fresh=True))
        step.event = self._make_event(r)
        step.device = r.device
        self._pending.append(step)
        self._compact(block=len(self._pending) > self.spec.max_pending_steps)
        self._out.send()

    def _make_event(self, device_rows: torch.Tensor) -> Any:
        """A completion marker for a step's host copies (None: complete at once)."""
        if device_rows.is_cuda:
            ev = torch.cuda.Event()
            ev.record()
            return ev
        return None

    # -- filtering -----------------------------------------------------------------------
    def _compact(self, block: bool) -> None:
        """Filter pending steps in order, then encode the filtered steps whose scores are on
        the host: all of them if ``block``, else those ready."""
        while self._pending:
            st = self._pending[0]
            if not block and st.event is not None and not st.event.query():
                break
            self._pending.pop(0)
            self._filter(st)
        while self._late:
            fields, scores, ev = self._late[0]
            if ev is not None:
                if not block and not ev.query():
                    break
                ev.synchronize()
            self._late.pop(0)
            if scores is not None and not isinstance(scores, np.ndarray):
                scores = scores.numpy().astype(np.float64)
            self._seq += 1
            self._out.outbox.append(encode_message(self._seq, *fields, scores))

    def _filter(self, st: _Step) -> None:
        """One message per recorded step: every Gambit row's (trace, incarnation, position)
        (the driver's watermark: which rows exist) and the kept rows' data."""
        if st.event is not None:
            st.event.synchronize()  # at once unless _compact was told to block
        pos = st.pos.to(torch.int64).numpy()
        tok = st.tok.to(torch.int64).numpy()
        keys, trace, inc, sel = self._rule.select(st.req_ids, pos, tok)
        scores, ev = None, None
        if self._book is not None:
            t0 = time.perf_counter()
            scores, ev = self._score(st, keys, trace, pos, sel)
            self.score_seconds += time.perf_counter() - t0
        if len(sel) and self.spec.ship_rows:
            rows = st.rows[torch.from_numpy(sel)].to(torch.float32).numpy()
        else:
            rows = np.zeros((len(sel), st.rows.shape[1] if self.spec.ship_rows else 0),
                            dtype=np.float32)
        self.rows_kept += len(sel)
        # encoded by _compact, in order, once the scores are on the host
        self._late.append(((trace, inc, pos, sel.astype(np.int64),
                            [keys[i].ext for i in sel.tolist()], tok[sel], rows,
                            None if st.lp is None else st.lp.to(torch.float32).numpy()),
                           scores, ev))

    def _score(self, st: _Step, keys: list, trace: np.ndarray, pos: np.ndarray,
               sel: np.ndarray) -> tuple[Any, Any]:
        """The kept rows' trace scores from the book, after starting the states of the
        step's new requests (a fork's or a revive's from its source, cut where its id
        says) -> (scores, event). Runs on the rows' original device. On CUDA everything the
        book does runs on a stream of its own (its starts copy pool slots that its steps
        write: one stream orders them), and nothing waits here: the scores are copied to
        pinned host memory behind an event, and the step's message is encoded once that
        event completes (at a later step, or at the next flush), so the worker never waits
        for the scorer's kernels while the next forward is queued. Elsewhere: (numpy
        scores, None)."""
        book = self._book
        assert book is not None
        dev = st.device
        if dev is None or dev.type != "cuda":
            return self._score_on(st, keys, trace, pos, sel, on_device=False), None
        if self._stream is None:
            self._stream = torch.cuda.Stream(dev)
        with torch.cuda.stream(self._stream):
            out = self._score_on(st, keys, trace, pos, sel, on_device=book.pooled)
            if isinstance(out, np.ndarray):
                return out, None
            host = torch.empty(out.shape, dtype=out.dtype, pin_memory=True)
            host.copy_(out, non_blocking=True)
            ev = torch.cuda.Event()
            ev.record(self._stream)
            return host, ev

    def _score_on(self, st: _Step, keys: list, trace: np.ndarray, pos: np.ndarray,
                  sel: np.ndarray, on_device: bool) -> Any:
        """The book's starts for the step's new requests, then its scores of the kept rows
        (NaN for rows nobody reads: self-consistency's), as numpy or (``on_device``) as a
        tensor on the rows' device."""
        book = self._book
        assert book is not None
        if keys is not self._started_of:  # the step's requests changed: any new ones?
            self._started_of = keys
            for k in {k.ext: k for k in keys}.values():
                if book.current(k.trace) != k.incarnation:
                    book.start(k.trace, k.incarnation, k.src if k.src >= 0 else None, k.cut)
        quiet = np.fromiter((keys[i].quiet for i in sel.tolist()), dtype=bool, count=len(sel))
        loud = sel[~quiet]
        if len(loud):
            h = st.rows[torch.from_numpy(loud)]
            if st.device is not None and st.device.type == "cuda":
                h = h.to(st.device, non_blocking=True)
            got = book.score(trace[loud].tolist(), pos[loud].tolist(), h, on_device=on_device)
        if not quiet.any():
            return got if len(sel) else np.zeros(0)
        # rows nobody reads the scores of (self-consistency's): NaN
        if on_device:
            out = torch.full((len(sel),), float("nan"), device=st.device)
            if len(loud):
                out[torch.from_numpy(np.flatnonzero(~quiet)).to(st.device)] = got
            return out
        out = np.full(len(sel), np.nan)
        if len(loud):
            out[~quiet] = got
        return out

    def forget(self, traces: Sequence[int]) -> None:
        """Drop the scorer states of ``traces`` (they ended for good)."""
        if self._book is not None:
            self._book.forget(traces)

    # -- shipping ------------------------------------------------------------------------
    def flush(self) -> tuple[int, list[bytes]]:
        """Filter everything and send what can be sent: (last sequence number sent, unsent
        messages in order). The driver reads its socket up to that number, then the rest."""
        self._compact(block=True)
        self._out.send()
        return self._out.sent, self._out.take()

    def drain(self) -> bytes | None:
        """The kept rows recorded so far as one blob (see
        :func:`~gambit_search._vllm_internals.channel.decode_rows`), for use without a sink;
        None when no row was kept."""
        self._compact(block=True)
        msgs = [decode_message(m) for m in self._out.take()]
        self._out.sent = self._seq
        return encode_rows(msgs)

    def close(self) -> None:
        self._out.close()
