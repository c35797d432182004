"""The engine contract on the scripted FakeEngine (fast; hypothesis property tests).

Run: .venv/bin/python -m pytest -q tests/test_engine_fake.py
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gambit_search.engine import EngineError, SamplingSpec, TraceStatus
from gambit_search.fake_engine import BOUNDARY, EOS, THINK_END, FakeEngine, FakeEngineConfig

SPEC = SamplingSpec(temperature=1.0, max_tokens=60)


class Recorder:
    """Drives an engine and checks the stream invariants on every step."""

    def __init__(self, eng: FakeEngine) -> None:
        self.eng = eng
        self.tokens: dict[int, list[int]] = {}
        self.events: dict[int, list] = {}
        self.finished: dict[int, str] = {}
        self.cached: dict[int, int] = {}
        self.fork_prompt: dict[int, tuple[int, ...]] = {}

    def step(self) -> None:
        out = self.eng.step()
        seen = set()
        for d in out.deltas:
            assert d.trace not in seen, "at most one delta per trace per step"
            seen.add(d.trace)
            assert d.trace not in self.finished, "no delta after the finishing one"
            self.tokens.setdefault(d.trace, []).extend(d.token_ids)
            if d.num_cached_tokens is not None:
                self.cached[d.trace] = d.num_cached_tokens
            if d.finish_reason is not None:
                self.finished[d.trace] = d.finish_reason
        for ev in out.boundaries:
            info = self.eng.trace_info(ev.trace)
            got = self.tokens.get(ev.trace, [])
            assert ev.output_index < len(got), "event before the delta of its token"
            assert ev.position == len(info.prompt_ids) + ev.output_index
            assert got[ev.output_index] == ev.token_id
            assert ev.hidden.dtype == np.float32 and ev.hidden.shape == (self.eng.hidden_size,)
            seq = list(info.prompt_ids) + list(info.output_ids)
            np.testing.assert_array_equal(ev.hidden, self.eng.hidden_at(seq, ev.position))
            prev = self.events.setdefault(ev.trace, [])
            assert not prev or prev[-1].output_index < ev.output_index
            prev.append(ev)
        mem = self.eng.memory()
        assert 0.0 <= mem.kv_usage <= 1.0
        assert 0 <= mem.free_blocks <= mem.total_blocks

    def drain(self, max_steps: int = 10_000) -> None:
        n = 0
        while self.eng.has_unfinished():
            self.step()
            n += 1
            assert n < max_steps


def prompts(n: int, length: int = 9) -> list[list[int]]:
    return [[1] + [5 + (q * 7 + i) % 50 for i in range(length - 1)] for q in range(n)]


# --------------------------------------------------------------------------- properties

OPS = st.lists(
    st.tuples(st.sampled_from(["step", "step", "step", "fork", "evict", "revive", "abort",
                               "add"]), st.integers(0, 10_000)),
    max_size=80,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=OPS, num_blocks=st.sampled_from([12, 40, 400]), seed=st.integers(0, 5))
def test_random_programs_keep_the_stream_consistent(ops, num_blocks, seed):
    eng = FakeEngine(FakeEngineConfig(num_blocks=num_blocks, block_size=4, seed=seed))
    rec = Recorder(eng)
    for p in prompts(3):
        eng.add_trace(p, SPEC)
    for op, k in ops:
        ids = eng.trace_ids()
        tid = ids[k % len(ids)]
        st_ = eng.trace_info(tid).status
        if op == "step":
            rec.step()
        elif op == "add":
            eng.add_trace(prompts(1, 5 + k % 7)[0], SPEC, seed=k)
        elif op == "fork" and st_ in (TraceStatus.RUNNING, TraceStatus.EVICTED):
            parent = eng.trace_info(tid)
            child = eng.fork(tid, temperature_multiplier=0.5, seed=k)
            cinfo = eng.trace_info(child)
            # a child's prompt is exactly the parent's prompt + output so far
            assert cinfo.prompt_ids == parent.prompt_ids + parent.output_ids
            assert cinfo.parent == tid
            assert cinfo.spec.temperature == parent.spec.temperature * 0.5
            rec.fork_prompt[child] = cinfo.prompt_ids
        elif op == "evict" and st_ is TraceStatus.RUNNING:
            eng.evict(tid)
        elif op == "revive" and st_ is TraceStatus.EVICTED:
            before = eng.trace_info(tid).output_ids
            eng.revive(tid)
            assert eng.trace_info(tid).output_ids == before
        elif op == "abort":
            eng.abort(tid)
    for tid in eng.trace_ids():
        if eng.trace_info(tid).status is TraceStatus.EVICTED:
            eng.revive(tid)
    rec.drain()
    for tid in eng.trace_ids():
        info = eng.trace_info(tid)
        # deltas reassemble to exactly the engine's final token ids
        assert rec.tokens.get(tid, []) == list(info.output_ids)
        if info.status is TraceStatus.FINISHED:
            assert rec.finished[tid] == info.finish_reason
        else:
            assert info.status is TraceStatus.ABORTED
    mem = eng.memory()
    assert mem.free_blocks == mem.total_blocks and mem.num_running == 0


@settings(max_examples=40, deadline=None)
@given(cut=st.integers(1, 40), bs=st.sampled_from([2, 4, 8, 16]))
def test_fork_recomputes_at_most_one_block(cut, bs):
    eng = FakeEngine(FakeEngineConfig(block_size=bs, num_blocks=2000))
    rec = Recorder(eng)
    p = eng.add_trace(prompts(1, 11)[0], SamplingSpec(max_tokens=200, ignore_eos=True))
    for _ in range(cut):
        rec.step()
    c = eng.fork(p, seed=99)
    rec.step()
    plen = len(eng.trace_info(c).prompt_ids)
    assert rec.cached[c] >= plen - bs
    assert rec.cached[c] <= plen - 1


# --------------------------------------------------------------------------- examples


def test_boundary_state_arrives_one_step_after_its_token_and_never_after_the_last():
    def policy(seq, seed):  # a b \n\n c \n\n EOS? no: ends right after a boundary
        script = [10, 11, BOUNDARY, 12, BOUNDARY]
        k = len(seq) - 3
        return script[k] if k < len(script) else EOS

    eng = FakeEngine(FakeEngineConfig(policy=policy, num_blocks=64))
    t = eng.add_trace([1, 7, 8], SamplingSpec(max_tokens=5))
    outs = eng.run_to_completion()
    assert [d.token_ids for o in outs for d in o.deltas] == [(10,), (11,), (BOUNDARY,), (12,),
                                                            (BOUNDARY,)]
    steps_of = [[e.output_index for e in o.boundaries] for o in outs]
    # the boundary sampled in step 3 (index 2) is fed in step 4; the final one (index 4,
    # where max_tokens stops the trace) is never fed, so never emitted
    assert steps_of == [[], [], [], [2], []]
    assert eng.trace_info(t).finish_reason == "length"
    assert eng.last_boundary(t).output_index == 2


def test_evict_then_revive_continues_the_same_trace_and_reports_the_cache_hit():
    eng = FakeEngine(FakeEngineConfig(block_size=4, num_blocks=200))
    rec = Recorder(eng)
    t = eng.add_trace(prompts(1, 10)[0], SamplingSpec(max_tokens=40, ignore_eos=True))
    for _ in range(15):
        rec.step()
    before = eng.trace_info(t).output_ids
    used = eng.memory().free_blocks
    eng.evict(t)
    assert eng.memory().free_blocks > used
    assert eng.trace_info(t).status is TraceStatus.EVICTED
    with pytest.raises(EngineError, match="cannot evict"):
        eng.evict(t)
    eng.revive(t)
    rec.drain()
    info = eng.trace_info(t)
    assert info.output_ids[: len(before)] == before and len(info.output_ids) == 40
    assert info.incarnation == 1
    seq_len = len(info.prompt_ids) + len(before)
    assert rec.cached[t] >= seq_len - 4  # the freed blocks were still in the LRU cache
    assert rec.tokens[t] == list(info.output_ids)


def test_abort_frees_kv_and_stops_the_stream():
    eng = FakeEngine(FakeEngineConfig(num_blocks=100))
    rec = Recorder(eng)
    a, b = (eng.add_trace(p, SamplingSpec(max_tokens=30, ignore_eos=True)) for p in prompts(2))
    for _ in range(5):
        rec.step()
    free = eng.memory().free_blocks
    eng.abort(a)
    assert eng.memory().free_blocks > free
    eng.abort(a)  # idempotent
    rec.drain()
    assert len(rec.tokens[a]) == 5 and eng.trace_info(a).status is TraceStatus.ABORTED
    assert len(rec.tokens[b]) == 30


def test_memory_pressure_preempts_and_everything_still_completes():
    eng = FakeEngine(FakeEngineConfig(block_size=4, num_blocks=24))
    rec = Recorder(eng)
    ts = [eng.add_trace(p, SamplingSpec(max_tokens=30, ignore_eos=True)) for p in prompts(6)]
    peak_wait = 0
    while eng.has_unfinished():
        rec.step()
        peak_wait = max(peak_wait, eng.memory().num_waiting)
    assert eng.memory().num_preemptions > 0 and peak_wait > 0
    assert all(len(rec.tokens[t]) == 30 for t in ts)


def test_stride_mode_and_think_end():
    eng = FakeEngine(FakeEngineConfig(boundary_ids=(), stride=5, num_blocks=100))
    t = eng.add_trace(prompts(1)[0], SamplingSpec(max_tokens=23, ignore_eos=True))
    evs = [e for o in eng.run_to_completion() for e in o.boundaries]
    assert [e.output_index for e in evs] == [4, 9, 14, 19]
    assert all(e.trace == t for e in evs)

    eng = FakeEngine(FakeEngineConfig(think_end_id=THINK_END, num_blocks=400))
    ts = [eng.add_trace(p, SamplingSpec(max_tokens=200)) for p in prompts(5)]
    outs = eng.run_to_completion()
    for t in ts:
        out = eng.trace_info(t).output_ids
        end = out.index(THINK_END)
        idx = [e.output_index for o in outs for e in o.boundaries if e.trace == t]
        assert idx and all(i < end for i in idx)


def test_bad_inputs_fail_one_trace_with_clear_errors():
    eng = FakeEngine(FakeEngineConfig(max_model_len=32, num_blocks=100))
    ok = eng.add_trace(prompts(1)[0], SamplingSpec(max_tokens=10, ignore_eos=True))
    bad = eng.add_trace([5] * 40, SPEC)
    out = eng.step()
    err = [d for d in out.deltas if d.trace == bad]
    assert err and err[0].finish_reason == "error" and "context" in err[0].error
    eng.run_to_completion()
    assert eng.trace_info(ok).finish_reason == "length"
    tiny = FakeEngine(FakeEngineConfig(block_size=4, num_blocks=3))
    lone = tiny.add_trace([5] * 6, SamplingSpec(max_tokens=30, ignore_eos=True))
    tiny.run_to_completion(max_steps=100)
    info = tiny.trace_info(lone)
    assert info.finish_reason == "error" and "KV blocks" in info.error
    with pytest.raises(EngineError, match="unknown trace 99"):
        eng.last_boundary(99)
    with pytest.raises(EngineError, match="empty"):
        eng.add_trace([], SPEC)
    with pytest.raises(EngineError, match="cannot fork"):
        eng.fork(bad)
    off = FakeEngine(FakeEngineConfig(capture_hidden=False))
    t = off.add_trace(prompts(1)[0], SPEC)
    with pytest.raises(EngineError, match="capture_hidden=False"):
        off.last_boundary(t)
    with pytest.raises(EngineError, match="stride"):
        FakeEngine(FakeEngineConfig(boundary_ids=(), stride=None))
    with pytest.raises(EngineError, match="max_tokens"):
        SamplingSpec(max_tokens=0)


def test_fork_child_budget_and_logprobs():
    eng = FakeEngine(FakeEngineConfig(num_blocks=200))
    p = eng.add_trace(prompts(1)[0], SamplingSpec(max_tokens=20, ignore_eos=True, logprobs=3))
    for _ in range(8):
        out = eng.step()
    lp = out.deltas[0].logprobs
    assert lp is not None and len(lp[0].top_logprobs) == 3
    c = eng.fork(p, seed=5)
    eng.run_to_completion()
    assert len(eng.trace_info(c).output_ids) == 20 - 8  # the parent's remaining budget


def test_sampled_logprobs_match_the_deltas_and_release_forgets_a_done_trace():
    eng = FakeEngine(FakeEngineConfig(num_blocks=200))
    t = eng.add_trace(prompts(1)[0], SamplingSpec(max_tokens=12, ignore_eos=True, logprobs=0))
    got = []
    while eng.has_unfinished():
        with pytest.raises(EngineError, match="cannot release"):
            eng.release(t)  # a live trace
        got += [lp.logprob for d in eng.step().deltas for lp in d.logprobs]
    lps = eng.sampled_logprobs(t)
    assert lps.dtype == np.float32 and len(lps) == len(eng.trace_info(t).output_ids) == 12
    np.testing.assert_allclose(lps, got, rtol=1e-6)
    eng.release(t)
    assert t not in eng.trace_ids()
    with pytest.raises(EngineError, match="unknown trace"):
        eng.trace_info(t)
