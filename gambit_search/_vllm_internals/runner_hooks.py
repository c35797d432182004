"""The model-runner hooks: where Gambit reaches into vLLM's worker to see each step's rows.

:func:`install_capture` wraps the model runner's sampling entry point (bound-method
attributes on the runner instance, no vLLM file patched) so that, each step, the rows the
sampler sees (one post-final-norm last-layer state per scheduled request) go to a
:class:`~gambit_search._vllm_internals.capture.RowCapture` with their request ids, token
positions and input tokens; :func:`uninstall_capture` restores the runner. Called in the
worker by :class:`~gambit_search._vllm_internals.extension.GambitWorkerExtension`.

- Model Runner V1 (``vllm/v1/worker/gpu_model_runner.py``; the CPU build always uses it;
  run on 0.32.0): the bound ``runner.execute_model`` is wrapped to arm a flag and
  ``runner.model.compute_logits`` to record its input on the first call of the step. Rows
  line up with ``runner.input_batch.req_ids``; row i sits at token index
  ``runner.query_start_loc[i+1]-1`` of the flattened batch, whose position and input id are
  ``runner.positions`` and ``runner.input_ids.gpu`` at that index.
- Model Runner V2 (``vllm/v1/worker/gpu/model_runner.py``; GPU default; run on 0.26.0 on an
  H200, same ``sample`` signature and ``InputBatch`` fields in the 0.32 source): the bound
  ``runner.sample(hidden_states, input_batch, grammar_output)`` is wrapped; the rows are
  ``hidden_states[input_batch.logits_indices]`` with ``input_batch.req_ids``,
  ``input_batch.positions`` and ``input_batch.input_ids`` at the same indices.

With ``CaptureSpec.logprobs`` the rows' logits are read too, from the return value of
``runner.model.compute_logits`` (wrapped in both runners; MRV2's ``sample`` calls it on the
unsharded path), before the sampler sees them
(:class:`~gambit_search._vllm_internals.logprobs.SampledLogprobs`). Both call sites run
eagerly (outside CUDA graphs and torch.compile).

Unsupported (capture is skipped for those steps, with one warning): speculative decoding
(more than one sampled row per request). Tensor/pipeline parallel: only the worker with TP
rank 0 on the last pipeline stage records (:func:`records_rows`).

``install_capture`` with an explicit ``kind`` needs no vLLM: the tests run both paths on
stand-in runners and pin the runners' source-level contract on the installed vLLM.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from gambit_search._vllm_internals.capture import RowCapture

__all__ = ["install_capture", "records_rows", "runner_kind", "uninstall_capture"]

logger = logging.getLogger(__name__)


def runner_kind(runner: Any) -> str:
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
    kind = kind or runner_kind(runner)
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


def records_rows() -> bool:
    """Only TP rank 0 of the last pipeline stage records (all TP ranks hold equal rows)."""
    try:
        from vllm.distributed.parallel_state import get_pp_group, get_tp_group

        return get_tp_group().rank_in_group == 0 and get_pp_group().is_last_rank
    except Exception:  # not initialised (tests)
        return True
