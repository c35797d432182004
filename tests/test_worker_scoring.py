"""Scoring where the hidden states are: :class:`~gambit_search.scoring.ScoreBook` (the
worker's per-trace scorer states) against the offline scorer, on synthetic states (fast) and
inside the real vLLM worker on the toy policy (slow: the session engine scores with the
shipped SeqScorer and ships the states too, so both can be compared).

    .venv/bin/python -m pytest -q tests/test_worker_scoring.py
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from gambit_search.engine import SamplingSpec, TraceStatus
from gambit_search.scoring import ScoreBook

REPO = Path(__file__).resolve().parents[1]
CKPT = {k: REPO / "checkpoints" / f"toy-scorer-{k}" / "ckpt.pt" for k in ("mlp", "seq")}


def _scorer(kind: str):
    from gambit_scorer.checkpoint import load_scorer

    return load_scorer(CKPT[kind])


def _offline(sc, states: list[np.ndarray]) -> np.ndarray:
    """The trace score after each step, from the whole history at once."""
    with torch.inference_mode():
        return sc.scorer_kind.score_trace(sc.model, sc.make_features(np.stack(states)))


@pytest.mark.parametrize("kind", ["mlp", "seq"])
def test_a_branch_and_a_revive_start_from_the_prefix_their_prompt_holds(kind):
    sc = _scorer(kind)
    rng = np.random.default_rng(0)
    d = sc.hidden_size
    book = ScoreBook(sc)
    # trace 0: boundaries at positions 10, 20, 30, 40 (two of them in one step)
    h0 = [rng.standard_normal(d).astype(np.float32) for _ in range(4)]
    book.start(0, 0)
    a = book.score([0], [10], np.stack(h0[:1]))
    b = book.score([0, 0], [20, 30], np.stack(h0[1:3]))
    c = book.score([0], [40], np.stack(h0[3:]))
    np.testing.assert_allclose(np.r_[a, b, c], _offline(sc, h0), rtol=1e-5, atol=1e-6)
    # a recomputed row (a prefill at a position already scored) is not scored again
    assert np.isnan(book.score([0], [30], np.stack(h0[2:3]))[0])
    # a branch cut at 25 inherits the boundaries at 10 and 20 only
    h1 = [rng.standard_normal(d).astype(np.float32) for _ in range(2)]
    book.start(1, 0, src=0, cut=25)
    got = book.score([1, 1], [26, 35], np.stack(h1))
    np.testing.assert_allclose(got, _offline(sc, h0[:2] + h1)[2:], rtol=1e-5, atol=1e-6)
    # the parent is untouched by its branch
    np.testing.assert_allclose(book.score([0], [50], np.stack(h1[:1])),
                               _offline(sc, h0 + h1[:1])[-1:], rtol=1e-5, atol=1e-6)
    # a revive of trace 0 cut at 31 (its tokens after 30 were dropped): 10, 20, 30 remain
    book.start(0, 1, src=0, cut=31)
    np.testing.assert_allclose(book.score([0], [33], np.stack(h1[1:])),
                               _offline(sc, h0[:3] + h1[1:])[-1:], rtol=1e-5, atol=1e-6)
    # forgetting a source: a later branch of it starts fresh
    book.forget([0])
    book.start(2, 0, src=0, cut=99)
    np.testing.assert_allclose(book.score([2], [5], np.stack(h1[:1])),
                               _offline(sc, h1[:1]), rtol=1e-5, atol=1e-6)
    assert book.current(2) == 0 and book.current(0) is None and len(book) == 2


def test_a_scorer_with_confidence_features_is_refused():
    class Conf:
        needs_confidence = True

    with pytest.raises(ValueError, match="confidence"):
        ScoreBook(Conf())


def test_scores_left_on_the_device_equal_the_host_ones():
    """A pooled book's ``on_device`` answer (what the CUDA worker copies back behind an event)
    equals its numpy answer row for row, through branches, revives, recomputed rows (NaN)
    and several boundaries of one trace in one step."""
    sc = _scorer("seq")
    host, dev = ScoreBook(sc), ScoreBook(sc)
    assert dev.pooled
    rng = np.random.default_rng(1)
    d = sc.hidden_size
    at: dict[int, int] = {}
    for step in range(40):
        if step % 7 == 3:  # a branch of a live trace, cut somewhere in it
            src = int(rng.choice(list(at)))
            new, cut = max(at) + 1, int(rng.integers(0, at[src] + 2))
            for b in (host, dev):
                b.start(new, 0, src=src, cut=cut)
            at[new] = cut
        traces = [int(t) for t in rng.choice(list(at) or [0], size=int(rng.integers(1, 6)))]
        pos = []
        for t in traces:  # increasing per trace; sometimes a row at a position already seen
            at[t] = at.get(t, 0) + int(rng.integers(-1, 3))
            pos.append(at[t])
        h = rng.standard_normal((len(traces), d)).astype(np.float32)
        want = host.score(traces, pos, h)
        got = dev.score(traces, pos, torch.from_numpy(h), on_device=True)
        assert isinstance(got, torch.Tensor)
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-6, equal_nan=True)
    assert host.rows_scored == dev.rows_scored > 40
    with pytest.raises(ValueError, match="pooled"):
        ScoreBook(_scorer("mlp")).score([0], [1], np.zeros((1, d), np.float32), on_device=True)


def test_a_step_whose_scores_are_not_back_waits_and_keeps_the_message_order(monkeypatch):
    """The worker encodes a step's message only once its scores are on the host (a CUDA
    event, faked here): later steps queue behind it, in order, and a flush waits for it."""
    from gambit_search._vllm_internals import (
        CaptureSpec,
        RowCapture,
        decode_message,
        make_request_id,
    )

    class Event:
        done = False

        def query(self):
            return self.done

        def synchronize(self):
            self.done = True

    events: list[Event] = []
    cap = RowCapture(CaptureSpec(boundary_ids=[4]), _scorer("seq"))
    real = RowCapture._score

    def late(self, st, keys, trace, pos, sel):
        scores, _ = real(self, st, keys, trace, pos, sel)
        events.append(Event())
        return scores, events[-1]

    monkeypatch.setattr(RowCapture, "_score", late)
    rid = make_request_id(0, 0, 1, True) + "-0a1b2c3d"
    d = cap._book._rs.scorer.hidden_size
    for p in (1, 2, 3):  # boundary tokens at 1 and 3
        cap.record([rid], torch.randn(1, d), torch.tensor([p]), torch.tensor([4 if p != 2 else 5]))
    assert len(events) == 3 and cap.messages == 0  # nothing encoded: step 1's scores are out
    events[1].done = events[2].done = True
    cap.record([rid], torch.randn(1, d), torch.tensor([4]), torch.tensor([5]))
    assert cap.messages == 0  # steps 2 and 3 are back, but wait behind step 1
    events[0].done = events[3].done = True
    cap.record([rid], torch.randn(1, d), torch.tensor([5]), torch.tensor([5]))
    assert cap.messages == 4  # steps 1-4 in order; step 5's event is not done
    sent, rest = cap.flush()  # the barrier waits for it
    msgs = [decode_message(m) for m in rest]
    assert [m.seq for m in msgs] == [1, 2, 3, 4, 5] and cap.messages == 5
    scored = [m for m in msgs if len(m.keep)]
    assert [m.pos[m.keep].tolist() for m in scored] == [[1], [3]]
    assert all(np.isfinite(m.score).all() for m in scored)


def test_request_ids_carry_the_scorer_source_and_cut():
    from gambit_search._vllm_internals import make_request_id, parse_request_id

    rid = make_request_id(5, 1, 30, False, 31, True, src=3, cut=45)
    k = parse_request_id(rid + "-0a1b2c3d")
    assert (k.trace, k.incarnation, k.run_from, k.run_odd, k.src, k.cut) == (5, 1, 31, True, 3, 45)
    assert parse_request_id(make_request_id(5, 0, 30, True)).src == -1
    assert parse_request_id(make_request_id(5, 0, 30, True, quiet=True) + "-0a1b2c3d").quiet
    assert not parse_request_id(make_request_id(5, 0, 30, True)).quiet


@pytest.mark.slow
def test_the_worker_scores_nothing_for_a_trace_nobody_reads_scores_of(engine, toy_tokenizer):
    from gambit_core.prompts import build_prompt_ids

    prompt = build_prompt_ids("Start 3. Ops: +3 -2 +5. Mod 100.", toy_tokenizer)
    before = engine.capture_stats()["rows_scored"]
    loud = engine.add_trace(prompt, SamplingSpec(temperature=0.8, max_tokens=200), seed=1)
    quiet = engine.add_trace(prompt, SamplingSpec(temperature=0.8, max_tokens=200, score=False),
                             seed=2)
    ev: dict[int, list] = {}
    while engine.has_unfinished():
        for b in engine.step().boundaries:
            ev.setdefault(b.trace, []).append(b)
    engine.step()
    assert ev[loud] and ev[quiet]  # both deliver their boundaries (and states)
    assert all(b.score == b.score for b in ev[loud])
    assert all(b.score != b.score for b in ev[quiet])  # NaN: not scored
    assert engine.capture_stats()["rows_scored"] - before == len(ev[loud])


@pytest.mark.slow
def test_worker_scores_equal_the_offline_scorer_across_forks_and_revives(engine,
                                                                         toy_tokenizer):
    """The session engine's worker scores with the SeqScorer; every event also carries its
    state, so the offline scorer can score each trace's whole history (a branch's: its
    parent's boundaries before its prompt ends, then its own) and must agree to fp32."""
    check_worker_scores(engine, toy_tokenizer)


def check_worker_scores(engine, toy_tokenizer, rtol: float = 1e-4, atol: float = 1e-5) -> dict:
    """The comparison above on any engine that scores with the shipped SeqScorer and ships
    the states (the GPU suite runs it on MRV2); returns the compared count and max error."""
    from gambit_core.prompts import build_prompt_ids

    assert engine.scores_boundaries
    prompt = build_prompt_ids("Start 12. Ops: +3 -2 +5 *2 -7. Mod 100.", toy_tokenizer)
    spec = SamplingSpec(temperature=0.9, max_tokens=300)
    ts = [engine.add_trace(prompt, spec, seed=i) for i in range(6)]
    events: dict[int, list] = {}
    parent: dict[int, int] = {}
    for step in range(400):
        if not engine.has_unfinished():
            break
        for b in engine.step().boundaries:
            events.setdefault(b.trace, []).append(b)
        if step == 12:
            for t in ts[:2]:  # branches: at the parent's tip, and at an earlier token
                parent[engine.fork(t, seed=100 + t)] = t
                out = engine.trace_info(t).output_ids
                parent[engine.fork(t, seed=200 + t, at=max(1, len(out) // 2))] = t
        if step == 20 and engine.trace_info(ts[3]).status is TraceStatus.RUNNING:
            engine.evict(ts[3])
        if step == 24 and engine.trace_info(ts[3]).status is TraceStatus.EVICTED:
            engine.revive(ts[3])
    engine.step()
    sc = _scorer("seq")

    def history(t: int) -> list:
        if t not in parent:
            return events.get(t, [])
        cut = len(engine.trace_info(t).prompt_ids)
        return [b for b in history(parent[t]) if b.position < cut] + events.get(t, [])

    compared, worst = 0, 0.0
    for t, own in events.items():
        h = history(t)
        off = _offline(sc, [np.asarray(b.hidden, dtype=np.float32) for b in h])[len(h) - len(own):]
        got = np.array([b.score for b in own])
        assert not np.isnan(got).any()
        np.testing.assert_allclose(got, off, rtol=rtol, atol=atol)
        compared += len(own)
        worst = max(worst, float(np.abs(got - off).max()))
    assert compared > 50 and any(t in events for t in parent)
    assert engine.trace_info(ts[3]).incarnation == 1
    stats = engine.capture_stats()
    assert stats["rows_scored"] >= compared
    return {"n": compared, "max_abs": worst}
