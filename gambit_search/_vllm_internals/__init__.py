"""Every vLLM internal Gambit touches, in one package: hidden-state capture inside the worker,
the row channel to the driver, and the version differences.

Stock vLLM (run on 0.26.0 (GPU, MRV2, H200) and 0.32.0 (CPU, MRV1), read from the 0.26 and
0.32/0.33 source) returns no per-token hidden states during generation. This package adds
them without patching vLLM's files. The driver (:mod:`gambit_search.vllm_engine`) uses it as
``from gambit_search import _vllm_internals as vi``; the names below are re-exported here.

One job per module:

* :mod:`.compat`: the checked version range (:data:`SUPPORTED`, :data:`CHECKED_ON`) and every
  version difference (``SamplingParams`` keywords, ``vllm.LLM`` workarounds, shutdown).
* :mod:`.extension`: :class:`GambitWorkerExtension`, mixed into every vLLM worker through
  ``LLM(worker_extension_cls=WORKER_EXTENSION)`` (the worker imports it by that dotted
  path); the driver calls it with ``llm.collective_rpc("gambit_...")``.
* :mod:`.runner_hooks`: wraps the model runner (V1 or V2) so that each step's sampler rows
  reach the capture (:func:`install_capture`).
* :mod:`.capture`: :class:`RowCapture` records those rows without synchronising the device,
  keeps the boundary rows (:mod:`.row_filter`: the keep rule) and ships them
  (:class:`CaptureSpec`: what the driver asks for); :mod:`.logprobs`:
  :class:`SampledLogprobs`, the sampled tokens' log-probs from the same logits.
* :mod:`.channel`: the row channel, both ends (ZMQ PUSH in the worker, PULL in the driver,
  polled after each step; ``gambit_flush`` is the barrier) and the message format
  (:class:`RowMessage`).
* :mod:`.request_ids`: the request ids that carry each request's capture state
  (:func:`make_request_id`); requests with other ids are never captured.
* :mod:`.metrics`: engine facts and metrics (:func:`engine_facts`, :func:`engine_metrics`);
  :mod:`.outputs`: reading vLLM's log-probs of a delta (:func:`token_logprobs`).
* :mod:`.liveness`: a dead EngineCore makes ``step()`` raise instead of hang
  (:func:`fail_fast_on_death`, :func:`is_engine_death`); :mod:`.placement`: the environment that pins a
  data-parallel rank's engine to its devices (:func:`rank_envs`).

Only boundary rows cross the process boundary, and neither the engine core nor the driver
ever waits for them. The row channel is an ipc socket: the recording worker must run on the
driver's host. Pure-Python pieces (:class:`RowCapture`, :func:`install_capture` with an
explicit ``kind``) run without vLLM, which is how the MRV2 path is unit tested on a stand-in
runner. No module here imports vLLM at import time.
"""

from __future__ import annotations

from gambit_search._vllm_internals import (
    capture,
    channel,
    compat,
    extension,
    liveness,
    logprobs,
    metrics,
    outputs,
    placement,
    request_ids,
    row_filter,
    runner_hooks,
)
from gambit_search._vllm_internals.capture import CaptureSpec, RowCapture
from gambit_search._vllm_internals.channel import (
    RowMessage,
    RowSink,
    decode_message,
    decode_rows,
)
from gambit_search._vllm_internals.compat import (
    CHECKED_ON,
    SUPPORTED,
    check_version,
    llm_workaround_kwargs,
    on_cpu,
    request_params,
    sampling_params,
    sampling_params_support,
    shutdown_llm,
    vllm_version_supported,
)
from gambit_search._vllm_internals.extension import WORKER_EXTENSION, GambitWorkerExtension
from gambit_search._vllm_internals.liveness import fail_fast_on_death, is_engine_death
from gambit_search._vllm_internals.logprobs import SampledLogprobs
from gambit_search._vllm_internals.metrics import engine_facts, engine_metrics
from gambit_search._vllm_internals.outputs import outputs_waiting, token_logprobs
from gambit_search._vllm_internals.placement import RANK_ENV, pinned, rank_envs
from gambit_search._vllm_internals.request_ids import ReqKey, make_request_id, parse_request_id
from gambit_search._vllm_internals.runner_hooks import (
    install_capture,
    runner_kind,
    uninstall_capture,
)

__all__ = [
    "CHECKED_ON",
    "RANK_ENV",
    "SUPPORTED",
    "WORKER_EXTENSION",
    "CaptureSpec",
    "GambitWorkerExtension",
    "ReqKey",
    "RowCapture",
    "RowMessage",
    "RowSink",
    "SampledLogprobs",
    "capture",
    "channel",
    "check_version",
    "compat",
    "decode_message",
    "decode_rows",
    "engine_facts",
    "engine_metrics",
    "extension",
    "fail_fast_on_death",
    "install_capture",
    "is_engine_death",
    "liveness",
    "llm_workaround_kwargs",
    "logprobs",
    "make_request_id",
    "metrics",
    "on_cpu",
    "outputs",
    "outputs_waiting",
    "parse_request_id",
    "pinned",
    "placement",
    "rank_envs",
    "request_ids",
    "request_params",
    "row_filter",
    "runner_hooks",
    "runner_kind",
    "sampling_params",
    "sampling_params_support",
    "shutdown_llm",
    "token_logprobs",
    "uninstall_capture",
    "vllm_version_supported",
]
