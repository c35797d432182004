"""The multi-question driver: one engine, every question of a dataset at once.

Each question gets its own policy (a method's state machine, :mod:`gambit_search.methods`);
the driver admits questions while their live traces fit a global limit, steps the engine,
turns its output into per-question events (boundaries are scored in one batched forward
for all questions), carries out the actions the policies return, and hands each finished
question's result to ``on_result`` as soon as it is done. A question that fails (empty
prompt, every trace an error) is recorded and the others go on.

    from gambit_search.driver import Driver, DriverConfig
    drv = Driver(engine, get_method("gambit").bind(n=64), scorer=RuntimeScorer(...),
                 prompt_ids=lambda q: build_prompt_ids(q.question, tok), decode=tok.decode)
    for result in drv.run(questions):          # results in completion order
        ...

Scoring and pipelining. An engine that scores boundaries itself
(``engine.scores_boundaries``: vLLM with ``VLLMEngineConfig.scorer``, gambit-solve's
``--score-in-engine``, off by default)
hands over events that carry their trace's score, computed in the worker on the model's
device; the driver then runs no scorer and only scores cross processes. vLLM's engine core
steps in its own process while the driver scores and decides; with ``catch_up`` (gambit-solve's
``--catch-up``) the adapter's ``step`` takes every output already waiting (merged into one
delta per trace), so the driver works on
the newest state and its decisions lag the engine by at most one of its own steps: harmless
for a tournament that acts every D >= 8 boundaries.

Order of events within one engine step, per question: :class:`Scored` (the step's
boundaries), then :class:`Finished`, then :class:`Progress` (which may run a round), so a
policy never forks a trace it has not yet learned is finished.

Memory (methods with ``uses_memory``: Gambit, STEP). The driver reads the engine's KV use
after every step and acts before vLLM has to preempt:

- **Evict the excess only.** The next steps need a free block for every running trace
  that is about to cross a block boundary (traces started together cross in the same
  step), plus a margin of ``1 - evict_above`` of the cache.
  When fewer are free, or vLLM preempted anyway, the questions with the most running
  traces are asked to give up as many traces as cover the shortfall
  (``MemoryPressure(evict=n)``: Gambit makes ghosts, STEP aborts).
- **Revive in batches.** While usage is below ``revive_below`` and nothing waits (beyond
  the traces queued by choice, ``DriverConfig.queue``), the free
  KV is offered in one batch, sized in traces, to the questions that want it
  (``MemoryPressure(revive=n)``: their best ghosts first, then a question admitted below
  its capacity grows), the way vLLM resumes preempted requests when blocks free up.
- **Admission that fits.** A question of such a method starts only as many traces as the
  free KV holds (``policy.start(limit)``), and a second question is admitted only while
  the free KV holds at least half its slots.

Recorder (optional, off by default): ``Driver(..., recorder=r)`` hands ``r`` each boundary
and each trace's end, on the driver's thread (gambit-harvest writes its shards this way, as
SC with a recorder; see :class:`~gambit_search.jobs.Recorder`). Without one nothing changes.

Trace sizes in blocks are estimated from the prompt and the mean length of the traces
completed so far in the run (``max_tokens / 2`` before the first).

Its inputs (questions, :class:`~gambit_search.jobs.Job`, the serving
:class:`~gambit_search.jobs.Intake`) are in
:mod:`gambit_search.jobs`, its settings in :mod:`gambit_search.driver_config`, its memory
handling in :mod:`gambit_search.driver_memory`, its result records in
:mod:`gambit_search.driver_results`. What is left (~450 lines) is one class, the step loop, whose parts (admission, events, actions,
results) share the loop's per-step state.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from gambit_core.grading import extract_boxed
from gambit_core.runio import trace_seed
from gambit_search.driver_config import DriverConfig
from gambit_search.driver_memory import MemoryMixin
from gambit_search.driver_results import failed_result, question_result
from gambit_search.engine import Engine, EngineError, SamplingSpec, TraceStatus
from gambit_search.jobs import Intake, Job, Recorder, bound_of, question_of
from gambit_search.methods import BoundMethod, PolicyContext
from gambit_search.policy import (
    Evict,
    Finished,
    Fork,
    MemoryPressure,
    NodeDelta,
    Progress,
    Prune,
    Revive,
    Scored,
    Spawn,
    Stop,
)

__all__ = ["Driver", "DriverConfig", "trace_seed"]


@dataclass
class _Q:
    """A question in flight."""

    q: Any
    policy: Any
    prompt: list[int]
    t0: float
    bound: Any = None
    spec: Any = None
    rule: str | None = None
    texts: dict[int, str] | None = None  # completed node -> its text (keep_texts)
    trace_of: dict[int, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    slots: int = 0
    fork_prompt: dict[int, int] = field(default_factory=dict)  # forked node -> prompt length
    cache: dict[str, int] = field(default_factory=lambda: {"forks": 0, "prompt_tokens": 0,
                                                           "cached_tokens": 0})


class Driver(MemoryMixin):
    """See the module docstring."""

    def __init__(self, engine: Engine, bound: BoundMethod, *,
                 prompt_ids: Callable[[Any], list[int]], decode: Callable[[Sequence[int]], str],
                 spec: SamplingSpec, scorer: Any = None, config: DriverConfig | None = None,
                 answer_of: Callable[[str], str | None] = extract_boxed,
                 recorder: Recorder | None = None) -> None:
        method = bound.method
        self.recorder = recorder
        """A :class:`Recorder`, or None (the default: nothing recorded)."""
        self.engine, self.bound, self.method = engine, bound, method
        self.prompt_ids, self.decode, self.spec = prompt_ids, decode, spec
        self.scorer = scorer
        self.cfg = config or DriverConfig()
        self.answer_of = answer_of
        # the engine scores where the states are (events carry their scores), unless the
        # driver was handed a scorer of its own
        self._engine_scores = engine.scores_boundaries and scorer is None
        if method.needs_scorer and scorer is None and not self._engine_scores:
            raise ValueError(f"method {method.name!r} needs a scorer (--scorer ckpt.pt)")
        if method.scores_traces and scorer is not None and not engine.captures_hidden:
            raise ValueError(f"method {method.name!r} needs an engine that captures hidden states")
        self.ctx = PolicyContext(decode=decode, block_size=engine.block_size,
                                 max_model_len=engine.max_model_len,
                                 hidden_size=engine.hidden_size, max_tokens=spec.max_tokens)
        self._owner: dict[int, tuple[_Q, int]] = {}  # trace -> (question, node)
        self._live_slots = 0
        self._last_preempt = 0
        self.timing = {"engine_s": 0.0, "scoring_s": 0.0, "policy_s": 0.0, "memory_s": 0.0,
                       "other_s": 0.0, "wall_s": 0.0, "steps": 0}
        self.tokens = 0
        """Unique tokens generated so far (all questions)."""
        self.trace_log: list[tuple[float, int, int, float]] = []
        """(s since run start, running requests, waiting, KV usage) at each memory read."""
        self._can_read_memory = True
        self._snap: Any = None  # the last MemorySnapshot
        self._reserved = 0  # blocks promised to traces added since that read
        self._done_len = [0, 0]  # (sum, count) of completed lineage lengths, for size estimates
        self._prompt_len = [0, 0]  # (sum, count) of admitted questions' prompt lengths
        self._seq_len: dict[int, int] = {}  # live trace on the engine -> its sequence length
        self._evicted: set[int] = set()  # ghosts' traces (no KV)
        self._preempt0: int | None = None
        self.preemptions = 0
        """vLLM preemptions since the run's first memory read (as of the last read)."""
        self._unscored: list = []  # boundary events waiting for the next batched forward
        self._memory_users = 0  # questions in flight whose method acts on memory
        self.on_step: Callable[[dict], None] | None = None
        """Called after every engine step with the questions in flight ({id: state}; read
        only): a server's admission timeouts and progress events."""
        self._t_start = time.perf_counter()

    @property
    def uses_memory(self) -> bool:
        """Whether memory is read and acted on now: the default method's, or any question's
        in flight."""
        return self.method.uses_memory or self._memory_users > 0

    # -- public ----------------------------------------------------------------------------------
    def run(self, questions: Sequence[Any]) -> Iterator[dict]:
        """Solve ``questions`` (questions or :class:`Job` s); yields each result dict as its
        question finishes."""
        return self._loop(deque(questions), None)

    def serve(self, intake: Intake) -> Iterator[dict]:
        """Solve questions as they arrive in ``intake`` until it is closed and they are done;
        yields each result as it finishes (a cancelled one with error "cancelled")."""
        return self._loop(deque(), intake)

    def _loop(self, pending: deque, intake: Intake | None) -> Iterator[dict]:
        t_start = self._t_start = time.perf_counter()
        active: dict[str, _Q] = {}
        if self.uses_memory and self._can_read_memory:
            self._read_memory()
        while True:
            if intake is not None:
                pending.extend(intake.take(block=not pending and not active and not intake.closed))
                for key in intake.cancelled():
                    gone = [j for j in pending if str(question_of(j).id) == key]
                    for j in gone:
                        pending.remove(j)
                        yield self._failed(question_of(j), "cancelled")
                    st = active.pop(key, None)
                    if st is not None:
                        if not st.policy.done:
                            self._apply(st, st.policy.stop())
                        yield self._finish(st, error="cancelled")
            if not pending and not active:
                if intake is None or intake.closed:
                    break
                continue
            t0 = time.perf_counter()
            limit = self.cfg.max_live + self.cfg.queue
            while pending and (not active or self._in_use() + bound_of(pending[0], self.bound).slots
                               <= limit) and (not active or self._kv_admits(pending[0])):
                q = pending.popleft()
                st = self._admit(q)
                if st is None:
                    yield self._failed(question_of(q), "empty question")
                    continue
                active[str(st.q.id)] = st
                if st.policy.done:  # every spawn failed at once
                    yield self._finish(active.pop(str(st.q.id)))
            self.timing["other_s"] += time.perf_counter() - t0
            if not active:
                continue
            if not self.engine.has_unfinished():
                # nothing runs: ghosts come back; policies with nothing left end now
                for key in list(active):
                    st = active[key]
                    ghosts = st.policy.ghosts() if not st.policy.done else []
                    if ghosts:
                        self._apply(st, st.policy.handle(MemoryPressure(revive=len(ghosts))))
                    if self.engine.has_unfinished():
                        continue
                    if not st.policy.done:
                        self._apply(st, st.policy.stop())
                    yield self._finish(active.pop(key))
                continue
            t0 = time.perf_counter()
            out = self.engine.step()
            t1 = time.perf_counter()
            self.timing["engine_s"] += t1 - t0
            self.timing["steps"] += 1
            self._on_step(out, active)
            every = (self.cfg.memory_every if self.uses_memory
                     else self.cfg.log_every if self.cfg.log_memory else 0)
            if every and self._can_read_memory and self.timing["steps"] % every == 0:
                self._memory(active)
            if self.on_step is not None:
                self.on_step(active)
            t0 = time.perf_counter()
            for key in [k for k, st in active.items() if st.policy.done]:
                yield self._finish(active.pop(key))
            self.timing["other_s"] += time.perf_counter() - t0
        self.timing["wall_s"] += time.perf_counter() - t_start

    # -- admission -------------------------------------------------------------------------------
    def _in_use(self) -> int:
        """What admission counts against ``max_live``: the live traces or the slots."""
        return len(self._owner) if self.cfg.admit_on_live else self._live_slots

    def _admit(self, item: Any) -> _Q | None:
        q = question_of(item)
        if not str(q.question).strip():
            return None
        job = item if isinstance(item, Job) else None
        prompt = list(job.prompt) if job is not None and job.prompt is not None \
            else list(self.prompt_ids(q))
        if not prompt:
            return None
        bound = job.bound if job is not None else self.bound
        if bound.method.uses_memory and self._snap is None and self._can_read_memory:
            self._read_memory()  # the first memory-using question of a mixed run (a server)
        policy = bound.policy(self.ctx)
        st = _Q(q, policy, prompt, time.perf_counter(), bound=bound,
                spec=replace(job.spec if job is not None else self.spec,
                             score=bool(bound.method.scores_traces)),
                rule=job.rule if job is not None else None,
                texts={} if self.cfg.keep_texts else None, slots=bound.slots)
        self._live_slots += st.slots
        self._memory_users += bound.method.uses_memory
        self._prompt_len[0] += len(prompt)
        self._prompt_len[1] += 1
        limit = None
        if bound.method.uses_memory and self._snap is not None:
            per = self._trace_blocks(len(prompt))
            limit = max(1, (self._snap.free_blocks - self._reserved) // per)
        acts = policy.start(limit)
        self._apply(st, acts)
        return st

    def _failed(self, q: Any, why: str) -> dict:
        return failed_result(q, self.method.name, why)

    # -- one step --------------------------------------------------------------------------------
    def _on_step(self, out: Any, active: dict[str, _Q]) -> None:
        per_q: dict[str, list] = {}
        rec = self.recorder
        if rec is not None:
            for b in out.boundaries:
                own = self._owner.get(b.trace)
                if own is not None:
                    rec.on_boundary(str(own[0].q.id), own[1], b)
        # 1. boundaries -> one batched scorer forward -> Scored events, every `score_every`
        #    steps, and at once in a step where a trace finishes or memory is read (so votes
        #    and evictions see every score)
        if self._engine_scores:  # scored where the states are: the events carry it
            for b in out.boundaries:
                own = self._owner.get(b.trace)
                if own is not None and b.score is not None and b.score == b.score \
                        and own[0].bound.method.scores_traces:
                    per_q.setdefault(str(own[0].q.id), []).append(
                        Scored(own[1], b.output_index, b.score))
        elif self.scorer is not None:
            self._unscored.extend(b for b in out.boundaries if b.trace in self._owner)
            steps = self.timing["steps"]
            due = (steps % self.cfg.score_every == 0
                   or any(d.finish_reason is not None for d in out.deltas)
                   or (self.uses_memory and steps % self.cfg.memory_every == 0))
            if self._unscored and due:
                self._score(per_q)
        t0 = time.perf_counter()
        # 2. deltas -> Finished + Progress
        finished: dict[str, list] = {}
        progress: dict[str, dict[int, NodeDelta]] = {}
        for d in out.deltas:
            own = self._owner.get(d.trace)
            if own is None:
                continue
            st, node = own
            key = str(st.q.id)
            if d.num_cached_tokens is not None and node in st.fork_prompt:
                st.cache["forks"] += 1
                st.cache["prompt_tokens"] += st.fork_prompt.pop(node)
                st.cache["cached_tokens"] += d.num_cached_tokens
            if d.token_ids:
                progress.setdefault(key, {})[node] = NodeDelta(tuple(d.token_ids), d.logprobs)
                self.tokens += len(d.token_ids)
                if d.trace in self._seq_len:
                    self._seq_len[d.trace] += len(d.token_ids)
            if d.finish_reason is not None:
                finished.setdefault(key, []).append(self._finished_event(st, node, d))
        # in admission order, not a set's: questions share the engine's memory, so the order
        # their events are applied in must not depend on the process's string hash seed
        for key, st in list(active.items()):
            if key not in per_q and key not in finished and key not in progress:
                continue
            fin = finished.get(key, [])
            if len(fin) > 1:  # the policy refills at the step's last finish
                fin = [replace(e, last=False) for e in fin[:-1]] + fin[-1:]
            events = per_q.get(key, []) + fin
            events.append(Progress(progress.get(key, {})))
            for e in events:
                self._apply(st, st.policy.handle(e))
                if isinstance(e, Finished):
                    self._end_trace(st, e.node)
        self.timing["policy_s"] += time.perf_counter() - t0

    def _score(self, per_q: dict[str, list]) -> None:
        t0 = time.perf_counter()
        items, owners = [], []
        for b in self._unscored:
            own = self._owner.get(b.trace)
            if own is None or b.trace not in self.scorer:
                continue  # the trace ended while its boundary waited
            items.append((b.trace, b.hidden, b.output_index))
            owners.append((own, b.output_index))
        self._unscored = []
        if items:
            lps = None
            if self.scorer.needs_confidence:
                lps = {t: self.engine.sampled_logprobs(t) for t, _, _ in items}
            scores = self.scorer.score(items, lps)
            for ((st, node), j), s in zip(owners, scores, strict=True):
                per_q.setdefault(str(st.q.id), []).append(Scored(node, j, s))
        self.timing["scoring_s"] += time.perf_counter() - t0

    def _finished_event(self, st: _Q, node: int, d: Any) -> Finished:
        rec = self.recorder
        if d.finish_reason == "error":
            st.errors.append(d.error or "error")
            if rec is not None:
                rec.on_trace_end(str(st.q.id), node, d.trace, "error", d.error, None)
            return Finished(node, "error", error=d.error)
        info = self.engine.trace_info(d.trace)
        lineage = list(info.prompt_ids[len(st.prompt):]) + list(info.output_ids)
        self._done_len[0] += len(lineage)
        self._done_len[1] += 1
        text = self.decode(lineage)
        if st.texts is not None:
            st.texts[node] = text
        if rec is not None:
            rec.on_trace_end(str(st.q.id), node, d.trace, d.finish_reason, None, text)
        return Finished(node, d.finish_reason, answer=self.answer_of(text))

    # -- actions ---------------------------------------------------------------------------------
    def _apply(self, st: _Q, actions: list) -> None:
        eng = self.engine
        qid = str(st.q.id)
        for a in actions:
            if isinstance(a, Spawn):
                t = eng.add_trace(st.prompt, st.spec, seed=trace_seed(self.cfg.seed, qid, a.node))
                self._bind(st, a.node, t, None)
                self._seq_len[t] = len(st.prompt)
                self._reserved += self._trace_blocks(len(st.prompt))
            elif isinstance(a, Fork):
                parent = st.trace_of[a.parent]
                try:
                    t = eng.fork(parent, a.temperature_multiplier,
                                 seed=trace_seed(self.cfg.seed, qid, a.node), at=a.at)
                except EngineError as e:  # the parent ended under us: the child fails
                    st.errors.append(str(e))
                    self._apply(st, st.policy.handle(Finished(a.node, "error", error=str(e))))
                    continue
                self._bind(st, a.node, t, parent)
                st.fork_prompt[a.node] = self._seq_len[t] = len(eng.trace_info(t).prompt_ids)
            elif isinstance(a, Prune):
                self._kill(st, a.node)
            elif isinstance(a, Evict):
                eng.evict(st.trace_of[a.node])
                self._evicted.add(st.trace_of[a.node])
            elif isinstance(a, Revive):
                eng.revive(st.trace_of[a.node])
                self._evicted.discard(st.trace_of[a.node])
                self._reserved += self._trace_blocks(len(st.prompt))
            elif isinstance(a, Stop):
                for n in a.nodes:
                    self._kill(st, n)
            else:
                raise TypeError(f"unknown action {a!r}")

    def _bind(self, st: _Q, node: int, trace: int, parent_trace: int | None) -> None:
        st.trace_of[node] = trace
        self._owner[trace] = (st, node)
        if self.scorer is not None and st.bound.method.scores_traces:
            self.scorer.add(trace, parent_trace if parent_trace in self.scorer else None)

    def _kill(self, st: _Q, node: int) -> None:
        t = st.trace_of.get(node)
        if t is None or t not in self._owner:
            return
        self.engine.abort(t)
        self._end_trace(st, node)

    def _end_trace(self, st: _Q, node: int) -> None:
        t = st.trace_of.get(node)
        if t is None or t not in self._owner:
            return
        del self._owner[t]
        self._seq_len.pop(t, None)
        self._evicted.discard(t)
        if self.scorer is not None and t in self.scorer:
            self.scorer.drop(t)
        if self.cfg.release:
            info = self.engine.trace_info(t)
            if info.status in (TraceStatus.FINISHED, TraceStatus.ABORTED):
                self.engine.release(t)

    # -- results ---------------------------------------------------------------------------------
    def _finish(self, st: _Q, error: str | None = None) -> dict:
        self._live_slots -= st.slots
        self._memory_users -= st.bound.method.uses_memory
        for node in list(st.trace_of):
            self._kill(st, node)
        return question_result(st, st.rule or self.cfg.vote_rule or st.bound.method.vote, error)


def mean(xs: Sequence[float]) -> float:
    """Mean (NaN for none)."""
    return sum(xs) / len(xs) if xs else math.nan
