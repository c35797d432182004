"""The scripted FakeEngine's own behaviour (fast; hypothesis property tests).

The engine contract both engines share is checked in tests/test_engine_contract.py; this file
keeps what is particular to the fake: its scripted policy and timing, its vLLM-like block
manager (exact prefix-cache hits, preemption), stride and ``</think>`` modes, its config
errors, and hypothesis programs over random operation mixes (checked by the contract's
recorder, plus the fake's own hidden-state rule).

Run: .venv/bin/python -m pytest -q tests/test_engine_fake.py
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_engine_contract import Recorder

from gambit_search.engine import EngineError, SamplingSpec, TraceStatus
from gambit_search.fake_engine import BOUNDARY, EOS, THINK_END, FakeEngine, FakeEngineConfig

SPEC = SamplingSpec(temperature=1.0, max_tokens=60)


class FakeRecorder(Recorder):
    """The contract's recorder, plus the fake's rule for states: the state at a position is
    a function of the sequence up to it (so a fork sees exactly its parent's states)."""

    def check_event(self, ev, seq) -> None:
        np.testing.assert_array_equal(ev.hidden, self.eng.hidden_at(seq, ev.position))


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
    rec = FakeRecorder(eng)
    for p in prompts(3):
        rec.add(p, SPEC)
    for op, k in ops:
        ids = eng.trace_ids()
        tid = ids[k % len(ids)]
        st_ = eng.trace_info(tid).status
        if op == "step":
            rec.step()
        elif op == "add":
            rec.add(prompts(1, 5 + k % 7)[0], SPEC, seed=k)
        elif op == "fork" and st_ in (TraceStatus.RUNNING, TraceStatus.EVICTED):
            at = None if k % 3 else k % (len(rec.tokens[tid]) + 1)
            rec.fork(tid, temperature_multiplier=0.5, seed=k, at=at)
        elif op == "evict" and st_ is TraceStatus.RUNNING:
            rec.evict(tid)
        elif op == "revive" and st_ is TraceStatus.EVICTED:
            rec.revive(tid)
        elif op == "abort":
            rec.abort(tid)
    for tid in eng.trace_ids():
        if eng.trace_info(tid).status is TraceStatus.EVICTED:
            rec.revive(tid)
    rec.drain()
    for tid in eng.trace_ids():
        info = eng.trace_info(tid)
        assert info.status in (TraceStatus.FINISHED, TraceStatus.ABORTED)
    mem = eng.memory()
    assert mem.free_blocks == mem.total_blocks and mem.num_running == 0


@settings(max_examples=40, deadline=None)
@given(cut=st.integers(1, 40), bs=st.sampled_from([2, 4, 8, 16]))
def test_fork_recomputes_at_most_one_block(cut, bs):
    eng = FakeEngine(FakeEngineConfig(block_size=bs, num_blocks=2000))
    rec = FakeRecorder(eng)
    p = rec.add(prompts(1, 11)[0], SamplingSpec(max_tokens=200, ignore_eos=True))
    for _ in range(cut):
        rec.step()
    c = rec.fork(p, seed=99)
    rec.step()
    plen = len(eng.trace_info(c).prompt_ids)
    # exactly every full block but the one holding the last prompt token
    assert rec.first[c] == [(plen - 1) // bs * bs]


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


def test_revive_hits_the_freed_blocks_still_in_the_lru_queue():
    eng = FakeEngine(FakeEngineConfig(block_size=4, num_blocks=200))
    rec = FakeRecorder(eng)
    t = rec.add(prompts(1, 10)[0], SamplingSpec(max_tokens=40, ignore_eos=True))
    for _ in range(15):
        rec.step()
    free = eng.memory().free_blocks
    rec.evict(t)
    assert eng.memory().free_blocks > free  # at once: the fake's memory is live
    rec.revive(t)
    rec.drain()
    seq_len = len(eng.trace_info(t).prompt_ids) + 15
    assert rec.first[t] == [0, (seq_len - 1) // 4 * 4]  # every freed full block was reused


def test_memory_pressure_preempts_and_everything_still_completes():
    eng = FakeEngine(FakeEngineConfig(block_size=4, num_blocks=24))
    rec = FakeRecorder(eng)
    ts = [rec.add(p, SamplingSpec(max_tokens=30, ignore_eos=True)) for p in prompts(6)]
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


def test_bad_inputs_and_configs_fail_with_clear_errors():
    eng = FakeEngine(FakeEngineConfig(max_model_len=32, num_blocks=100))
    bad = eng.add_trace([5] * 40, SPEC)
    out_of_vocab = eng.add_trace([1, 64], SPEC)
    out = eng.step()
    errs = {d.trace: d.error for d in out.deltas}
    assert "context" in errs[bad] and "out of range" in errs[out_of_vocab]
    tiny = FakeEngine(FakeEngineConfig(block_size=4, num_blocks=3))
    lone = tiny.add_trace([5] * 6, SamplingSpec(max_tokens=30, ignore_eos=True))
    tiny.run_to_completion(max_steps=100)
    info = tiny.trace_info(lone)
    assert info.finish_reason == "error" and "KV blocks" in info.error
    off = FakeEngine(FakeEngineConfig(capture_hidden=False))
    t = off.add_trace(prompts(1)[0], SPEC)
    with pytest.raises(EngineError, match="capture_hidden=False"):
        off.last_boundary(t)
    with pytest.raises(EngineError, match="stride"):
        FakeEngine(FakeEngineConfig(boundary_ids=(), stride=None))
    with pytest.raises(EngineError, match="max_tokens"):
        SamplingSpec(max_tokens=0)


def test_sampled_logprobs_match_the_deltas_exactly():
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
