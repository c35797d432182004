"""Which captured rows the worker keeps: the boundary rule, applied to one step's rows.

Used by :class:`~gambit_search._vllm_internals.capture.RowCapture` on every recorded step
(on host numpy arrays, once the step's data is complete): :meth:`RowFilter.select` returns
the keys of the step's Gambit rows and the indices of the kept ones. Pure numpy; the rule is
decided from the request id (:mod:`~gambit_search._vllm_internals.request_ids`) and per-id
token classes the driver computed once from the vocabulary (:class:`CaptureSpec` fields), so
no detokenization happens per step.

A row is kept when its position is an *output* position of the trace (p >= trace prompt
length), the reasoning is still open (no ``</think>`` after the last ``<think>``: ``o``/``c``
in the id gives the state at the prompt, input tokens update it) and its input token is a
boundary token, or, in stride mode, when ``(p - prompt_len + 1) % stride == 0``.

Split boundaries ("\\n" then "\\n", ``CaptureSpec.run_*_ids``): per-id classes and one bit
of state per request in :meth:`RowFilter._split_boundaries`; the state at a request's start
comes in its id (``s<first position>[n]``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from gambit_search._vllm_internals.request_ids import ReqKey, parse_request_id

if TYPE_CHECKING:
    from gambit_search._vllm_internals.spec import CaptureSpec

__all__ = ["RowFilter"]

_RUN_START, _RUN_ODD, _RUN_FLIP, _RUN_KEEP = 1, 2, 4, 8


def _run_codes(spec: CaptureSpec) -> np.ndarray | None:
    """uint8 code per token id for the split-boundary rule (None: the rule is off)."""
    lists = ((spec.run_start_ids, _RUN_START), (spec.run_odd_ids, _RUN_ODD),
             (spec.run_flip_ids, _RUN_FLIP), (spec.run_keep_ids, _RUN_KEEP))
    if not spec.run_start_ids:
        return None
    n = 1 + max(max(ids, default=0) for ids, _ in lists)
    codes = np.zeros(n, dtype=np.uint8)
    for ids, bit in lists:
        if ids:
            codes[np.asarray(ids, dtype=np.int64)] |= bit
    return codes


class RowFilter:
    """The keep rule of one capture, with its per-request state (reasoning closed, newline
    run parity) and caches (parsed ids, the last step's row keys)."""

    def __init__(self, spec: CaptureSpec) -> None:
        self.spec = spec
        self._lut: np.ndarray | None = None
        self._codes = _run_codes(spec)  # None: no split boundaries
        self._odd: dict[str, list[int]] = {}  # external id -> recent positions after which
        # its text ends in an odd newline run (absent: even or unknown)
        self._parsed: dict[str, ReqKey | None] = {}
        self._meta_of: list[str] | None = None  # the id list _meta was computed for
        self._meta: tuple[list[ReqKey], np.ndarray, np.ndarray, np.ndarray] | None = None
        self._closed: dict[str, bool] = {}  # external id -> reasoning closed

    def parse(self, internal_id: str) -> ReqKey | None:
        """:func:`parse_request_id`, cached."""
        try:
            return self._parsed[internal_id]
        except KeyError:
            if len(self._parsed) > 65536:  # a cache: bound it
                self._parsed.clear()
            p = self._parsed[internal_id] = parse_request_id(internal_id)
            return p

    def _boundary_lut(self, size: int) -> np.ndarray:
        if self._lut is None or self._lut.shape[0] < size:
            n = max(size, 1 + max(self.spec.boundary_ids, default=0))
            lut = np.zeros(n, dtype=bool)
            if self.spec.boundary_ids:
                lut[np.asarray(self.spec.boundary_ids, dtype=np.int64)] = True
            self._lut = lut
        return self._lut

    def select(self, req_ids: list[str], pos: np.ndarray, tok: np.ndarray
               ) -> tuple[list[ReqKey], np.ndarray, np.ndarray, np.ndarray]:
        """``(keys, trace, incarnation, kept indices)`` of one step's Gambit rows: row i is
        ``req_ids[i]`` (Gambit ids only) at position ``pos[i]`` with input token ``tok[i]``.
        Rows must come in step order (the reasoning and newline-run state carry over).
        Passing the same list object as the step before reuses its parsed keys."""
        spec = self.spec
        think = {t for t in (spec.think_start, spec.think_end) if t is not None}
        if req_ids is not self._meta_of:  # else the same rows as the last filtered step
            keys = [self.parse(r) for r in req_ids]
            n = len(keys)
            self._meta = (keys, np.fromiter((k.prompt_len for k in keys), dtype=np.int64, count=n),
                          np.fromiter((k.trace for k in keys), dtype=np.int64, count=n),
                          np.fromiter((k.incarnation for k in keys), dtype=np.int64, count=n))
            self._meta_of = req_ids
        keys, plen, trace, inc = self._meta  # type: ignore[misc]
        n = len(keys)
        j = pos - plen  # output index of the row's input token
        mask = np.zeros(n, dtype=bool)
        if spec.boundary_ids:
            lut = self._boundary_lut(int(tok.max()) + 1 if n else 1)
            mask |= lut[np.clip(tok, 0, lut.shape[0] - 1)] & (tok >= 0)
        if self._codes is not None:
            self._split_boundaries(keys, pos, tok, mask)
        if spec.stride:
            mask |= (j + 1) % spec.stride == 0
        mask &= j >= 0
        if think:
            closed = self._closed
            visit = mask | np.isin(tok, list(think))  # other rows neither keep nor switch
            for i in np.flatnonzero(visit).tolist():
                k = keys[i]
                if mask[i] and closed.get(k.ext, k.closed):
                    mask[i] = False
                t = int(tok[i])
                if t in think and j[i] >= -1:
                    if len(closed) > 65536:
                        closed.clear()
                    closed[k.ext] = t == spec.think_end
        return keys, trace, inc, np.nonzero(mask)[0]

    def _split_boundaries(self, keys: list, pos: np.ndarray, tok: np.ndarray,
                          mask: np.ndarray) -> None:
        """Mark rows whose input token starts with "\\n" after an odd newline run, and carry
        each request's run parity (from the position and parity its id gives, then row by
        row: a row at p uses the parity after p-1 when that row was seen, else even). Only
        rows of tokens with a newline at an end are visited (a per-id code table; no
        detokenization): every other token ends the run."""
        codes = self._codes
        c = codes[np.clip(tok, 0, codes.shape[0] - 1)]
        c[(tok < 0) | (tok >= codes.shape[0])] = 0
        state = self._odd
        for i in np.flatnonzero(c).tolist():
            k = keys[i]
            p = int(pos[i])
            first = k.run_from if k.run_from >= 0 else k.prompt_len
            if p < first:  # a prompt row (or a re-prefilled one): state from the id
                continue
            ci = int(c[i])
            odd = state.get(k.ext)
            if odd is None and k.run_odd:
                odd = state[k.ext] = [first - 1]
            prev = odd is not None and (p - 1) in odd
            if prev and ci & _RUN_START:
                mask[i] = True
            if ci & _RUN_ODD:
                after = True
            elif ci & _RUN_FLIP:
                after = not prev
            elif ci & _RUN_KEEP:
                after = prev
            else:
                after = False
            if after:
                if odd is None:
                    if len(state) > 65536:  # a cache: bound it
                        state.clear()
                    odd = state[k.ext] = []
                if p not in odd:
                    odd.append(p)
                    if len(odd) > 4:
                        del odd[0]
