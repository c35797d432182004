"""SeqPool (the SeqScorer's batched run-time caches) against the value states it replaces.

Random streams of fresh traces, branches, cuts, drops and batched steps, applied both to a
:class:`SeqPool` and to ``SeqKind``'s immutable :class:`SeqHistory` values (``kind.step``,
``kind.fork``, ``kind.prefix``): every step's probabilities must agree, through slot and
length growth and past the sliding window (a ring in the pool).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from gambit_scorer.kinds import get_kind
from gambit_scorer.models import SeqScorer
from gambit_scorer.seq_pool import SeqPool

KIND = get_kind("seq")


def _model(max_len: int) -> SeqScorer:
    torch.manual_seed(0)
    return SeqScorer(8, d_model=16, nhead=2, num_layers=2, dim_feedforward=32,
                     max_len=max_len).eval()


def _run(model: SeqScorer, ops: list[tuple], seed: int, pool_cls: type = SeqPool) -> float:
    """Apply ``ops`` to a pool and to value states; the largest probability difference."""
    pool = pool_cls(model, slots=1, length=1)
    vals: dict[int, object] = {}
    rng = np.random.default_rng(seed)
    worst = 0.0
    for op in ops:
        kind, a, b = op
        if kind == "new":
            vals[a] = KIND.new_state()
            pool.add(a)
        elif kind == "fork" and b in vals:
            vals[a] = KIND.fork(vals[b])
            pool.add(a, src=b)
        elif kind == "cut" and b in vals:
            have = vals[b].n_steps
            k = int(rng.integers(0, have + 1))
            cut = KIND.prefix(vals[b], k, None)
            if cut is None:  # past the window: the pool refuses too
                if k < have:
                    with pytest.raises(ValueError, match="window"):
                        pool.add(a, src=b, k=k)
                continue
            vals[a] = cut
            pool.add(a, src=b, k=k)
        elif kind == "drop" and a in vals:
            del vals[a]
            pool.drop(a)
        elif kind == "step":
            keys = [k for k in sorted(vals) if rng.random() < 0.7]
            if not keys:
                continue
            x = torch.randn(len(keys), 8, generator=torch.Generator().manual_seed(len(ops)))
            with torch.inference_mode():
                new, want = KIND.step(model, [vals[k] for k in keys], x)
            got = pool.step(keys, x)
            for k, h in zip(keys, new, strict=True):
                vals[k] = h
                assert pool.n_steps(k) == h.n_steps
            worst = max(worst, float(np.abs(got - want).max()))
    assert len(pool) == len(vals)
    return worst


_op = st.tuples(st.sampled_from(["new", "fork", "cut", "drop", "step", "step", "step"]),
                st.integers(0, 7), st.integers(0, 7))


@settings(max_examples=40, deadline=None)
@example(ops=[("new", 0, 0), ("new", 2, 0), ("new", 3, 0)] + [("step", 0, 0)] * 4
         + [("new", 1, 0), ("step", 0, 0), ("cut", 0, 3)],
         seed=0, max_len=3)  # a cut to no step of a trace past its window: a fresh start
@given(ops=st.lists(_op, min_size=1, max_size=60), seed=st.integers(0, 2**16),
       max_len=st.sampled_from([3, 4096]))
def test_pool_matches_value_states(ops: list[tuple], seed: int, max_len: int) -> None:
    assert _run(_model(max_len), ops, seed) < 1e-5


def test_a_long_run_through_the_window_and_growth() -> None:
    """Many steps on a window of 5: the ring wraps several times while slots and length
    grow, then branches and cuts; the probabilities must still match."""
    ops = [("new", i, 0) for i in range(6)] + [("step", 0, 0)] * 30 + [("fork", 6, 2)] \
        + [("step", 0, 0)] * 10
    assert _run(_model(5), ops, 1) < 1e-5


class _CutShort(SeqPool):
    """A planted bug: a cut copies one step too few (its last kept step reads zeros)."""

    def add(self, key, src=None, k=None):
        if src is None or not k:
            return super().add(key, src=src, k=k)
        super().add(key, src=src, k=k - 1)
        self._n[self._slot[key]] = k


def test_the_comparison_catches_a_wrong_cut() -> None:
    ops = [("new", 0, 0)] + [("step", 0, 0)] * 6 + [("cut", 1, 0)] + [("step", 0, 0)] * 4
    assert _run(_model(4096), ops, 3) < 1e-5
    assert _run(_model(4096), ops, 3, _CutShort) > 1e-4
