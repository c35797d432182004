"""One engine serving many searches at once: the driver on a thread of its own, fed by an
:class:`~gambit_search.jobs.Intake`, each request its own tree.

    svc = SearchService(engine, decode, prompt_ids, scorer=scorer, max_live=256)
    svc.start()
    fut = svc.submit(job, on_progress=print)     # concurrent.futures.Future of the result
    svc.cancel(job.question.id)                  # a client went away: abort its traces
    svc.close()                                  # drain what is in flight, then stop

Admission is the driver's (live-trace slots and free KV); a request not admitted within
``admit_timeout_s`` is cancelled with :class:`NotAdmitted` (the server answers 503). An
engine error fails the requests in flight on it, not the service's future ones.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from gambit_search.driver import Driver, DriverConfig
from gambit_search.jobs import Intake, Job

__all__ = ["NotAdmitted", "SearchService", "ServiceStats"]


class NotAdmitted(RuntimeError):
    """The request waited longer than the admission timeout for room on the engine."""


@dataclass
class ServiceStats:
    """Running totals for /metrics."""

    requests: int = 0
    completed: int = 0
    failed: int = 0
    cancelled: int = 0
    rejected: int = 0
    traces: int = 0
    tokens: int = 0
    kv_usage: float = 0.0
    running: int = 0
    queued: int = 0
    in_flight: int = 0
    search_overhead: float = 0.0
    by_method: dict[str, int] = field(default_factory=dict)


@dataclass
class _Req:
    job: Job
    future: Future
    on_progress: Callable[[dict], None] | None
    t0: float
    admitted: bool = False
    timed_out: bool = False
    last_progress: float = 0.0


class SearchService:
    """See the module docstring."""

    def __init__(self, engine: Any, decode: Callable[[Sequence[int]], str],
                 prompt_ids: Callable[[Any], list[int]], *, scorer: Any = None,
                 max_live: int = 256, seed: int = 0, admit_timeout_s: float = 60.0,
                 progress_every_s: float = 0.5, rank: int = 0,
                 admit_on_live: bool = True) -> None:
        from gambit_search.engine import SamplingSpec
        from gambit_search.methods import get_method

        self.engine, self.rank = engine, rank
        self.admit_timeout_s, self.progress_every_s = admit_timeout_s, progress_every_s
        self.stats = ServiceStats()
        self._intake = Intake()
        self._reqs: dict[str, _Req] = {}
        self._lock = threading.Lock()
        # the driver's own method is a placeholder: every request is a Job with its own
        self._driver = Driver(engine, get_method("sc").bind(n=1), prompt_ids=prompt_ids,
                              decode=decode, spec=SamplingSpec(), scorer=scorer,
                              config=DriverConfig(max_live=max_live, seed=seed,
                                                  admit_on_live=admit_on_live,
                                                  keep_texts=True))
        self._driver.on_step = self._on_step
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None

    # -- public ----------------------------------------------------------------------------------
    def start(self) -> None:
        """Run the driver on its thread."""
        self._thread = threading.Thread(target=self._run, name=f"gambit-driver-{self.rank}",
                                        daemon=True)
        self._thread.start()

    def submit(self, job: Job, on_progress: Callable[[dict], None] | None = None) -> Future:
        """Queue ``job`` (its question id must be unique among those in flight); the future
        holds the driver's result dict (with ``texts``)."""
        fut: Future = Future()
        key = str(job.question.id)
        with self._lock:
            if self.error is not None:
                fut.set_exception(RuntimeError(self.failure()))
                return fut
            if key in self._reqs:
                raise ValueError(f"question id {key!r} is already in flight")
            self._reqs[key] = _Req(job, fut, on_progress, time.perf_counter())
            self.stats.requests += 1
            self.stats.queued += 1
            m = job.bound.method.name
            self.stats.by_method[m] = self.stats.by_method.get(m, 0) + 1
        self._intake.put(job)
        return fut

    def cancel(self, qid: str) -> None:
        """Abort question ``qid``'s traces (a client disconnected)."""
        self._intake.cancel(str(qid))

    def in_flight(self) -> int:
        with self._lock:
            return len(self._reqs)

    def load(self) -> float:
        """Share of the engine's live-trace slots this service has promised (queued included):
        the data-parallel router sends a request to the least loaded rank."""
        with self._lock:
            slots = sum(r.job.bound.slots for r in self._reqs.values())
        return slots / max(1, self._driver.cfg.max_live)

    def close(self, timeout: float | None = None) -> None:
        """Stop taking requests, finish those in flight, stop the thread (the engine is left
        to its owner)."""
        self._intake.close()
        if self._thread is not None:
            self._thread.join(timeout)

    # -- the driver's thread ---------------------------------------------------------------------
    def _run(self) -> None:
        try:
            for r in self._driver.serve(self._intake):
                self._deliver(r)
        except BaseException as e:  # noqa: BLE001 - an engine error fails what is in flight
            self.error = e
            with self._lock:
                reqs, self._reqs = list(self._reqs.values()), {}
            for q in reqs:
                if not q.future.done():
                    q.future.set_exception(RuntimeError(self.failure()))

    def failure(self) -> str:
        """One line on why this rank's engine stopped (its :attr:`error`)."""
        from gambit_search.data_parallel import one_line

        return f"rank {self.rank}'s engine failed: {one_line(self.error)}"

    def _deliver(self, r: dict) -> None:
        if not self._driver.engine.has_unfinished():
            self.stats.running, self.stats.kv_usage = 0, 0.0
        with self._lock:
            q = self._reqs.pop(r["id"], None)
            if q is None:
                return
            if not q.admitted:
                self.stats.queued -= 1
            else:
                self.stats.in_flight -= 1
            self.stats.traces += r.get("tree_stats", {}).get("completions", 0)
            self.stats.tokens += r.get("unique_tokens", 0)
            if q.timed_out:
                self.stats.rejected += 1
            elif r.get("error") == "cancelled":
                self.stats.cancelled += 1
            elif r.get("error"):
                self.stats.failed += 1
            else:
                self.stats.completed += 1
        if q.timed_out:
            q.future.set_exception(NotAdmitted(
                f"not admitted within {self.admit_timeout_s:g} s: the engine is full"))
            return
        q.future.set_result(r)

    def _on_step(self, active: dict) -> None:
        """Called by the driver after each engine step: admissions, timeouts, progress."""
        now = time.perf_counter()
        d = self._driver
        tm = d.timing
        if tm["wall_s"] or tm["engine_s"]:
            busy = tm["scoring_s"] + tm["policy_s"] + tm["memory_s"] + tm["other_s"]
            self.stats.search_overhead = busy / max(1e-9, now - d._t_start)
        if d.trace_log:
            self.stats.running, self.stats.kv_usage = d.trace_log[-1][1], d.trace_log[-1][3]
        with self._lock:
            reqs = list(self._reqs.items())
        for key, q in reqs:
            st = active.get(key)
            if st is not None and not q.admitted:
                q.admitted = True
                with self._lock:
                    self.stats.queued -= 1
                    self.stats.in_flight += 1
            if st is None and not q.admitted and not q.timed_out \
                    and now - q.t0 > self.admit_timeout_s:
                q.timed_out = True
                self._intake.cancel(key)
            if (st is not None and q.on_progress is not None
                    and now - q.last_progress >= self.progress_every_s):
                q.last_progress = now
                s = st.policy.stats()
                q.on_progress({"completions": s.get("completions", 0),
                               "running": len(st.policy.running()),
                               "unique_tokens": s.get("unique_tokens", 0),
                               "elapsed_s": round(now - q.t0, 3)})
