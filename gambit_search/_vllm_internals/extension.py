"""The worker extension: Gambit's entry point inside every vLLM worker process.

vLLM mixes :class:`GambitWorkerExtension` into its worker class when the engine is started
with ``LLM(worker_extension_cls=WORKER_EXTENSION)``: each worker process imports this module
by the dotted path in :data:`WORKER_EXTENSION` (``resolve_obj_by_qualname`` in
``WorkerWrapperBase.init_worker``, read in 0.32.0; run on 0.26.0 and 0.32.0) and appends the
class to its worker class's bases, refusing any attribute the worker already has. The driver then calls its methods with ``llm.collective_rpc("gambit_...")``:
``gambit_install`` (start capturing with a spec, loading its scorer onto the model's device
when it names one), ``gambit_uninstall``, ``gambit_flush`` (the row barrier),
``gambit_forget`` (drop ended traces' scorer states) and ``gambit_stats``. Arguments and answers are plain types (they are
pickled across processes).

Only the worker with TP rank 0 on the last pipeline stage records; the others answer
``None`` to the flush and the stats.
"""

from __future__ import annotations

from typing import Any

from gambit_search._vllm_internals.capture import CaptureSpec, RowCapture
from gambit_search._vllm_internals.runner_hooks import (
    install_capture,
    records_rows,
    runner_kind,
    uninstall_capture,
)

__all__ = ["WORKER_EXTENSION", "GambitWorkerExtension"]

WORKER_EXTENSION = "gambit_search._vllm_internals.extension.GambitWorkerExtension"
"""Import path to pass as ``worker_extension_cls`` (the worker imports it by this path: keep
it in step with this module's location)."""


class GambitWorkerExtension:
    """Mixed into vLLM's worker class; every method is reached via ``collective_rpc``.

    Names carry a ``gambit_`` prefix: vLLM refuses an extension whose attributes collide
    with the worker's.
    """

    def gambit_install(self, spec: dict[str, Any]) -> dict[str, Any]:
        """Start capturing with ``spec`` (a :class:`CaptureSpec` as dict). Returns the runner
        kind, the model's hidden size and whether this worker records rows."""
        runner = self.model_runner  # type: ignore[attr-defined]
        records = records_rows()
        kind = runner_kind(runner)
        old = getattr(self, "_gambit_capture", None)
        if old is not None:
            old.close()
        cs = CaptureSpec.from_dict(spec)
        scorer = None
        if cs.scorer is not None and records:
            from gambit_scorer.checkpoint import load_scorer

            # on the model's device, right where the rows are (worker.device: read in
            # 0.32.0 MRV1 and 0.26.0 MRV2)
            device = getattr(self, "device", None) or getattr(runner, "device", "cpu")
            scorer = load_scorer(cs.scorer, device=device,
                                 expected_hidden_size=int(self.model_config.get_hidden_size()))  # type: ignore[attr-defined]
        cap = RowCapture(cs, scorer)
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

    def gambit_forget(self, traces: list[int]) -> None:
        """Drop the worker-side scorer states of ``traces`` (ended for good)."""
        cap = getattr(self, "_gambit_capture", None)
        if cap is not None:
            cap.forget(traces)

    def gambit_stats(self) -> dict[str, float] | None:
        """Counters of the recording worker: steps recorded, rows seen, rows kept, messages
        sent and seconds spent capturing."""
        cap = getattr(self, "_gambit_capture", None)
        if cap is None:
            return None
        return {"steps": cap.steps_recorded, "rows_seen": cap.rows_seen,
                "rows_kept": cap.rows_kept, "messages": cap.messages,
                "capture_s": cap.seconds, "capture_cpu_s": cap.cpu_seconds,
                "rows_scored": cap.rows_scored, "score_s": cap.score_seconds}
