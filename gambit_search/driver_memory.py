"""The driver's memory handling (methods that act on memory: Gambit, STEP), as a mixin of
:class:`~gambit_search.driver.Driver`: KV size estimates, admission by free KV, and each
step's evictions and revivals (the rules are in the driver's module docstring).
"""

from __future__ import annotations

import math
import time
from typing import Any

from gambit_search.engine import EngineError
from gambit_search.jobs import bound_of
from gambit_search.policy import Evict, MemoryPressure, Prune


class MemoryMixin:
    """Reads and acts on the engine's KV memory; uses the driver's state (``engine``, ``cfg``,
    ``spec``, ``bound``, the size and reservation counters) and ``_apply``."""

    def _trace_blocks(self, prompt_len: int) -> int:
        """KV blocks one trace of a prompt this long is expected to hold when it ends."""
        total, count = self._done_len
        out = total / count if count else self.spec.max_tokens / 2
        return max(1, math.ceil((prompt_len + out) / self.engine.block_size))

    def _blocks_needed_soon(self, bs: int) -> int:
        """New KV blocks the running traces need in the next three steps: one for each whose
        sequence is within three tokens past a block's end. Traces that started together
        cross block boundaries in the same step, so an average would underestimate it."""
        return sum(1 for t, n in self._seq_len.items()
                   if t not in self._evicted and n % bs < 3)

    def _read_memory(self) -> Any:
        try:
            snap = self.engine.memory()
        except EngineError:  # an engine without stats (log_stats=False): nothing to read
            self._can_read_memory = False
            return None
        # traces waiting by choice (DriverConfig.queue) hold no KV yet but will: their blocks
        # stay promised, or admission would hand the same free KV out twice
        self._snap = snap
        self._reserved = (min(snap.num_waiting, self.cfg.queue)
                          * self._trace_blocks(max(1, self._mean_prompt())))
        if self._preempt0 is None:
            self._preempt0 = snap.num_preemptions
        self.preemptions = snap.num_preemptions - self._preempt0
        return snap

    def _queued(self) -> int:
        """Traces waiting in vLLM's queue by the driver's choice (``DriverConfig.queue``):
        those on the engine beyond ``max_live``. More waiting than these means vLLM lacks the
        memory to run them."""
        on_engine = len(self._owner) - len(self._evicted)
        return min(self.cfg.queue, max(0, on_engine - self.cfg.max_live))

    def _kv_admits(self, item: Any) -> bool:
        """Whether the free KV holds half the slots of one more question (memory methods)."""
        bound = bound_of(item, self.bound)
        if not bound.method.uses_memory or self._snap is None:
            return True
        per = self._trace_blocks(max(1, self._mean_prompt()))
        want = max(1, bound.slots // 2)
        return (self._snap.free_blocks - self._reserved) // per >= want

    def _mean_prompt(self) -> int:
        total, count = self._prompt_len
        return total // count if count else 0

    def _memory(self, active: dict[str, Any]) -> None:
        t0 = time.perf_counter()
        snap = self._read_memory()
        if snap is None:
            return
        self.trace_log.append((round(t0 - self._t_start, 4), snap.num_running,
                               snap.num_waiting, round(snap.kv_usage, 4)))
        if not self.uses_memory:
            self.timing["memory_s"] += time.perf_counter() - t0
            return
        preempted = snap.num_preemptions - self._last_preempt
        self._last_preempt = snap.num_preemptions
        live = [st for st in active.values()
                if not st.policy.done and st.bound.method.uses_memory]
        total, bs = snap.total_blocks, max(1, snap.block_size)
        reserve = math.ceil((1 - self.cfg.evict_above) * total) + self._blocks_needed_soon(bs)
        short = reserve - snap.free_blocks
        per_running = max(1, (total - snap.free_blocks) // max(1, snap.num_running))
        evict = max(preempted, math.ceil(short / per_running) if short > 0 else 0)
        if evict and live:
            # the questions with the most running traces give them up first
            for st in sorted(live, key=lambda s: len(s.policy.running()), reverse=True):
                if evict <= 0:
                    break
                n = min(evict, len(st.policy.running()) - 1)
                if n <= 0:
                    continue
                acts = st.policy.handle(MemoryPressure(evict=n))
                self._apply(st, acts)
                evict -= sum(isinstance(a, Evict | Prune) for a in acts)
        elif snap.kv_usage < self.cfg.revive_below and snap.num_waiting <= self._queued():
            spare = int((self.cfg.revive_below - snap.kv_usage) * total) - self._reserved
            wanting = [(st, st.policy.wants()) for st in live if hasattr(st.policy, "wants")]
            wanting = [(st, w) for st, w in wanting if w > 0]
            for st, w in sorted(wanting, key=lambda x: x[1], reverse=True):
                k = min(w, spare // self._trace_blocks(len(st.prompt)))
                if k <= 0:
                    break
                acts = st.policy.handle(MemoryPressure(revive=k))
                self._apply(st, acts)
                spare -= k * self._trace_blocks(len(st.prompt))
        self.timing["memory_s"] += time.perf_counter() - t0

