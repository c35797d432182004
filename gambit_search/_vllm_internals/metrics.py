"""What the driver reads from a started vLLM engine: its facts and its metrics.

Used by :class:`~gambit_search.vllm_engine.VLLMEngine` at start-up (:func:`engine_facts`:
block size, KV blocks, context length, hidden size) and in ``memory()``
(:func:`engine_metrics`: KV usage, running and waiting requests, preemptions, prefix-cache
counters). Both read vLLM's engine objects (``LLMEngine.vllm_config``, the stat loggers),
checked on 0.26.0 and 0.32.0.
"""

from __future__ import annotations

import logging
from typing import Any

__all__ = ["engine_facts", "engine_metrics"]

logger = logging.getLogger(__name__)


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
