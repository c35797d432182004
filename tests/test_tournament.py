"""The tournament's invariants, property-based, on the scripted fake engine.

Hypothesis draws the search parameters, memory limits (small KV pools force vLLM-style
preemption and so ghosts), finish times (the fake policy's thought counts per seed) and
random scores; a checking wrapper asserts the invariants after every event.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gambit_search.driver import Driver, DriverConfig
from gambit_search.engine import SamplingSpec
from gambit_search.fake_engine import FIRST_TEXT, FakeEngine, FakeEngineConfig
from gambit_search.methods import Method
from gambit_search.methods.gambit import GambitParams
from gambit_search.policy import (
    Evict,
    Finished,
    Fork,
    MemoryPressure,
    NodeDelta,
    NodeState,
    Progress,
    Prune,
    Revive,
    Scored,
    Spawn,
    Stop,
)
from gambit_search.tournament import Tournament
from gambit_search.tournament_config import TournamentConfig, TournamentConfigError
from tests.doubles import RandomScorer
from tests.test_bookkeeping import assert_index_consistent


class Checked(Tournament):
    """A tournament that asserts its invariants after every event."""

    def handle(self, event):
        before = {n.id: n.state for n in self.nodes.values()}
        acts = super().handle(event)
        forks = [a for a in acts if isinstance(a, Fork)]
        prunes = {a.node for a in acts if isinstance(a, Prune)}
        for f in forks:
            # a parent was running before the event (never a ghost), and is no victim
            assert before.get(f.parent) is NodeState.RUNNING, (f, before.get(f.parent))
            assert f.parent not in prunes
            assert self.nodes[f.parent].state is NodeState.RUNNING
            # every child samples at T x m: the engine multiplies the parent's temperature
            want = self.config.child_temperature if self.nodes[f.parent].depth == 0 else 1.0
            assert f.temperature_multiplier == want
        for a in acts:
            if isinstance(a, Evict):
                assert self.nodes[a.node].state is NodeState.GHOST
        assert len(self.active()) <= self.limit <= self.config.capacity
        if self.config.drain:  # never more in play than the budget
            assert self.counts["completions"] + len(self.active()) <= self.budget
        if self.done:
            assert not self.active()
        else:
            assert self.running(), "a live question always has a trace running"
            if isinstance(event, Finished) and event.last:  # the finish refilled the pool
                assert self.room() == 0, (self.room(), self.limit, len(self.active()))
        assert_index_consistent(self)  # the index by state and the parent heap equal a scan
        return acts


@dataclass
class Params:
    n: int
    capacity: int | None
    swap: int
    interval: int
    warmup: int
    floor: float
    child_temperature: float = 1.0
    branch_point: str = "boundary"
    ghosts: bool = True
    revive: bool = True
    max_tokens: int = 60
    drain: bool = True
    interval_unit: str = "steps"
    max_children: int = 0
    prune_budget: float = math.inf
    lineage_share: float = 0.0


def _gambit_params(p: Params) -> GambitParams:
    return GambitParams(capacity=p.capacity, swap=p.swap, interval=p.interval, warmup=p.warmup,
                        floor=p.floor, child_temperature=p.child_temperature,
                        branch_point=p.branch_point, ghosts=p.ghosts, revive=p.revive,
                        drain=p.drain, interval_unit=p.interval_unit,
                        max_children=p.max_children, prune_budget=p.prune_budget,
                        lineage_share=p.lineage_share)


def _method() -> Method:
    from gambit_search.methods.gambit import tournament_config

    return Method("checked", "test",
                  lambda p, n, ctx: Checked(tournament_config(p, n, ctx.max_tokens)),
                  lambda p, n: min(int(p.capacity or n), n), params=GambitParams,
                  needs_scorer=True, scores_traces=True, uses_memory=True, vote="weighted")


@dataclass
class Q:
    id: str
    question: str
    answer: str


def _prompt(q) -> list[int]:
    return [1] + [FIRST_TEXT + (ord(c) % 50) for c in q.question]


def drv_prompts(n_questions: int, seed: int) -> dict[str, tuple[int, ...]]:
    return {f"q{i}": tuple(_prompt(Q(f"q{i}", f"question {i} {seed}", "")))
            for i in range(n_questions)}


def _run(params: Params, num_blocks: int, seed: int, n_questions: int, max_live: int,
         score_every: int = 1, queue: int = 0):
    """``queue`` > 0: the engine runs at most ``max_live`` and the driver queues that many
    more in its waiting queue (gambit-solve's ``--queue``)."""
    eng = FakeEngine(FakeEngineConfig(num_blocks=num_blocks, block_size=4, seed=seed,
                                      max_model_len=256,
                                      max_num_seqs=max_live if queue else 64))
    qs = [Q(f"q{i}", f"question {i} {seed}", "") for i in range(n_questions)]
    drv = Driver(eng, _method().bind(_gambit_params(params), params.n),
                 prompt_ids=_prompt,
                 decode=eng.decode, spec=SamplingSpec(temperature=1.0, max_tokens=params.max_tokens),
                 scorer=RandomScorer(seed), config=DriverConfig(max_live=max_live, seed=seed,
                                                                release=False, queue=queue,
                                                                score_every=score_every))
    return eng, drv, list(drv.run(qs))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    k=st.integers(1, 3),
    extra=st.integers(0, 4),
    more=st.sampled_from([0, 0, 3, 9]),
    interval=st.integers(1, 6),
    warmup=st.integers(1, 20),
    floor=st.sampled_from([0.0, 0.1, 0.3]),
    branch=st.sampled_from(["boundary", "current", "best", "drop"]),
    unit=st.sampled_from(["steps", "steps", "thoughts"]),
    max_children=st.sampled_from([0, 0, 1, 2]),
    prune_budget=st.sampled_from([math.inf, math.inf, 0.0, 0.3, 1.0]),
    lineage_share=st.sampled_from([0.0, 0.0, 0.25, 0.5]),
    ghosts=st.booleans(),
    revive=st.booleans(),
    num_blocks=st.sampled_from([24, 48, 4096]),
    seed=st.integers(0, 10_000),
    n_questions=st.integers(1, 3),
    score_every=st.sampled_from([1, 3]),
    drain=st.booleans(),
    queue=st.sampled_from([0, 0, 3]),
)
def test_invariants_hold_on_the_fake_engine(k, extra, more, interval, warmup, floor, branch,
                                            unit, max_children, prune_budget, lineage_share,
                                            ghosts, revive, num_blocks, seed, n_questions,
                                            score_every, drain, queue):
    """C = N and C < N (``more``), with and without a small KV pool, drain on and off, with
    and without traces queued beyond the engine's limit, every branch point, rounds in steps
    or thoughts, with and without a cap on children, on lineages and on prunes: every
    question votes on exactly N completed traces unless it records the token cap, every
    refill comes with the event that opened room (``Checked``), ghosts leave, all ends."""
    cap = 2 * k + extra
    params = Params(n=cap + more, capacity=cap, swap=k, interval=interval, warmup=warmup,
                    floor=floor, branch_point=branch, ghosts=ghosts, revive=revive, drain=drain,
                    child_temperature=0.8, interval_unit=unit, max_children=max_children,
                    prune_budget=prune_budget, lineage_share=lineage_share)
    eng, drv, results = _run(params, num_blocks, seed, n_questions, max_live=2 * cap,
                             score_every=score_every, queue=queue)
    assert len(results) == n_questions  # every run terminates, every question is reported
    assert not eng.has_unfinished()
    infos = {t: eng.trace_info(t) for t in eng.trace_ids()}
    for r in results:
        nodes = r["tree"]
        st_ = r["tree_stats"]
        completed = [n for n in nodes if n["state"] == "completed"]
        # every completed trace votes exactly once
        assert sum(v["count"] for v in r["votes"]) == sum(1 for n in completed if n["answer"])
        assert st_["completions"] == len(completed)
        # the budget: exactly N votes, unless the question says why not
        if st_["end_reason"] == "budget":
            assert len(completed) == params.n
        else:
            assert st_["end_reason"] == "token_cap", st_
            assert r["unique_tokens"] >= 4 * params.n * params.max_tokens
        if drain and st_["end_reason"] == "budget":  # nothing stopped: every trace kept voted
            assert st_["stopped"] == 0
            assert st_["started"] == len(completed) + st_["prunes"] + st_["failures"]
        if lineage_share:  # no fork took its root's lineage above the cap
            lin_cap = max(1, math.ceil(lineage_share * cap - 1e-9))
            roots: dict[int, int] = {}
            for n in nodes:  # a parent is created before its child: listed first
                roots[n["id"]] = n["id"] if n["parent"] is None else roots[n["parent"]]
            for c in nodes:
                if c["parent"] is None:
                    continue
                t = c["created_at"]  # members active right after the fork (ties: ended before)
                members = [n for n in nodes if roots[n["id"]] == roots[c["id"]]
                           and n["created_at"] <= t
                           and (n["ended_at"] is None or n["ended_at"] > t)]
                assert len(members) <= lin_cap, (c, lin_cap)
        if prune_budget < math.inf:  # the prune budget holds, ghosts' prunes included
            assert st_["prunes"] <= math.ceil(prune_budget * params.n - 1e-9), st_
        # nothing is left active: ghosts left (pruned or revived and finished)
        assert all(n["state"] not in ("running", "ghost") for n in nodes)
        assert st_["started"] == len(nodes)
    # unique tokens: tokens each engine trace generated itself (its own output), pruned
    # traces included, equal the tournament's accounting, question by question
    by_q: dict[str, list[int]] = {}
    for t, info in infos.items():
        (qid,) = [q for q, p in drv_prompts(n_questions, seed).items()
                  if tuple(info.prompt_ids[: len(p)]) == p]
        by_q.setdefault(qid, []).append(t)
    recount = {q: sum(len(infos[t].output_ids) for t in ts) for q, ts in by_q.items()}
    assert recount == {r["id"]: r["unique_tokens"] for r in results}
    assert drv.tokens == sum(recount.values())


def test_a_question_in_a_pool_of_a_few_traces_still_votes_on_n():
    """Regression (H200, toy, 12 MiB, N=64, C=32): a question spawned 32 traces, 31 became
    ghosts that could never leave, and it was answered by 1 completed trace. Here the KV
    pool holds ~5 traces of C = 16: the question starts only what fits, never ends with
    ghosts waiting, and votes on all N."""
    params = Params(n=24, capacity=16, swap=2, interval=2, warmup=4, floor=0.0, max_tokens=60)
    eng, drv, results = _run(params, num_blocks=40, seed=5, n_questions=2, max_live=32)
    for r in results:
        assert r["tree_stats"]["end_reason"] == "budget"
        assert r["tree_stats"]["completions"] == 24
    first = results[0]["tree"]
    started_at_0 = [n for n in first if n["created_at"] == 0 and n["parent"] is None]
    assert len(started_at_0) < 16  # admission by KV share, not C


def _run_long(method, num_blocks: int, n_questions: int = 2, queue: int = 0):
    """Traces of 1-14 thoughts: lengths vary more than the driver's size estimate, so a
    small pool comes under pressure after admission (``queue``: as in :func:`_run`)."""
    from gambit_search.fake_engine import thought_policy

    params = Params(n=12, capacity=8, swap=2, interval=2, warmup=4, floor=0.0, max_tokens=120)
    eng = FakeEngine(FakeEngineConfig(num_blocks=num_blocks, block_size=4, seed=1,
                                      max_model_len=256, max_num_seqs=16 if queue else 64,
                                      policy=thought_policy(num_thoughts=(1, 14))))
    qs = [Q(f"q{i}", f"question {i}", "") for i in range(n_questions)]
    bound = method.bind(_gambit_params(params) if method.params is GambitParams else None,
                        params.n)
    drv = Driver(eng, bound, prompt_ids=_prompt, decode=eng.decode,
                 spec=SamplingSpec(temperature=1.0, max_tokens=params.max_tokens),
                 scorer=RandomScorer(1), config=DriverConfig(max_live=16, seed=1, queue=queue))
    return eng, list(drv.run(qs))


def test_ghosts_appear_under_memory_pressure_and_leave():
    eng, results = _run_long(_method(), num_blocks=40)
    assert sum(r["tree_stats"]["ghosts"] for r in results) > 0
    for r in results:
        assert r["tree_stats"]["end_reason"] == "budget" and r["tree_stats"]["completions"] == 12
        assert not [n for n in r["tree"] if n["state"] == "ghost"]
    assert eng.memory().num_preemptions == 0  # evicted before vLLM-style preemption


def test_traces_queued_by_choice_are_not_memory_pressure():
    """With ``queue`` = 2 and max_live = 4, two waiting requests are the driver's own: a ghost
    may be revived (KV is low); a third waiting one means vLLM lacks memory: no revive.
    Those two also keep their blocks promised, so the free KV is not handed out twice."""
    from gambit_search.driver import _Q
    from gambit_search.engine import MemorySnapshot
    from gambit_search.fake_engine import thought_policy

    eng = FakeEngine(FakeEngineConfig(num_blocks=400, block_size=4, seed=1, max_num_seqs=4,
                                      policy=thought_policy(num_thoughts=(1, 14))))
    params = Params(n=6, capacity=6, swap=2, interval=2, warmup=4, floor=0.0)
    drv = Driver(eng, _method().bind(_gambit_params(params), params.n), prompt_ids=_prompt,
                 decode=eng.decode, spec=SamplingSpec(temperature=1.0, max_tokens=60),
                 scorer=RandomScorer(1), config=DriverConfig(max_live=4, queue=2, seed=1))
    asked = []

    class Wants:
        done = False

        def wants(self):
            return 1

        def running(self):
            return [0]

        def handle(self, event):
            asked.append(event)
            return []

    st = _Q(Q("q", "x", ""), Wants(), [1] * 8, 0.0, bound=drv.bound)
    drv._owner = {t: (st, t) for t in range(6)}  # 6 live traces: 4 running, 2 queued
    assert drv._queued() == 2

    def snap(waiting):
        return MemorySnapshot(kv_usage=0.1, total_blocks=400, free_blocks=360, block_size=4,
                              num_running=4, num_waiting=waiting, num_preemptions=0,
                              prefix_cache_queries=0, prefix_cache_hits=0)

    for waiting, revived in ((2, True), (3, False), (0, True)):
        asked.clear()
        eng.memory = lambda w=waiting: snap(w)
        drv._memory({"q": st})
        assert [isinstance(e, MemoryPressure) and e.revive > 0 for e in asked] == \
            ([True] if revived else []), waiting
        # no prompt admitted yet: a trace of the shortest prompt, max_tokens / 2
        assert drv._reserved == min(waiting, 2) * drv._trace_blocks(1), waiting


def test_the_run_does_not_depend_on_the_string_hash_seed():
    """Questions share the engine's memory, so the order their events are applied in is
    part of the result: it is the admission order, the same under every PYTHONHASHSEED
    (it was a set's order: the same run gave 11 or 23 ghosts)."""
    import os
    import subprocess
    import sys

    code = ("from tests.test_tournament import _run_long, _method\n"
            "eng, res = _run_long(_method(), num_blocks=40, n_questions=4)\n"
            "print([(r['tree_stats']['ghosts'], r['unique_tokens'], r['votes']) for r in res])")
    outs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           check=True, env=os.environ | {"PYTHONHASHSEED": str(seed)},
                           cwd=os.path.dirname(os.path.dirname(__file__))).stdout
            for seed in (1, 2, 3, 4)}
    assert len(outs) == 1, outs


def test_step_aborts_before_the_engine_preempts():
    from gambit_search.methods import get_method

    eng, results = _run_long(get_method("step"), num_blocks=48)
    assert sum(r["tree_stats"]["prunes"] for r in results) > 0  # it was under pressure
    assert eng.memory().num_preemptions == 0
    for r in results:  # at most N started, each completed one votes
        assert r["tree_stats"]["started"] <= 12
        assert r["tree_stats"]["completions"] + r["tree_stats"]["prunes"] == 12


def test_an_unscored_ghost_is_ranked_lowest_and_pruned_by_the_swap():
    t = _tour(capacity=4, swap=1, warmup=2)
    t.start()
    t.handle(MemoryPressure(evict=1))  # node 0 (unscored) becomes a ghost
    for n, s in [(1, 0.3), (2, 0.8), (3, 0.6)]:
        t.handle(Scored(n, 1, s))
    acts = _tick(t, [1, 2, 3], 2)  # the round: the ghost is the bottom-1, not node 1 (0.3)
    assert Prune(0) in acts and Prune(1) not in acts
    assert [a.parent for a in acts if isinstance(a, Fork)] == [2]


def test_without_pressure_there_are_no_ghosts():
    params = Params(n=8, capacity=8, swap=2, interval=2, warmup=4, floor=0.0)
    _, _, (r,) = _run(params, num_blocks=4096, seed=3, n_questions=1, max_live=8)
    assert r["tree_stats"]["ghosts"] == 0
    assert r["tree_stats"]["branches"] > 0 and r["tree_stats"]["prunes"] > 0


# ----------------------------------------------------------------------------- pure, by hand


def _tour(**kw) -> Tournament:
    base = dict(capacity=4, swap=2, interval=1, warmup=2, floor=0.0)
    return Tournament(TournamentConfig(**(base | kw)))


def _tick(t: Tournament, nodes, k: int = 1):
    return t.handle(Progress({n: NodeDelta((9,) * k) for n in nodes}))


def test_round_prunes_bottom_k_and_forks_top_k():
    t = _tour()
    assert [type(a) for a in t.start()] == [Spawn] * 4
    for n, s in enumerate([0.9, 0.1, 0.8, 0.2]):
        t.handle(Scored(n, 1, s))
    t.handle(Progress({n: NodeDelta((9, 9)) for n in range(4)}))  # 2 tokens each: past warmup
    acts = t.round_log[-1]
    assert acts["pruned"] == 2
    assert sorted(acts["parents"]) == [0, 2]
    assert t.nodes[1].state is NodeState.PRUNED and t.nodes[3].state is NodeState.PRUNED
    children = [n for n in t.nodes.values() if n.parent is not None]
    assert len(children) == 2 and len(t.active()) == 4
    # a child inherits its parent's score history up to the branch point
    for c in children:
        assert c.scores == t.nodes[c.parent].scores and c.inherited == 2


def test_branch_point_boundary_cuts_at_the_last_scored_boundary():
    t = _tour()
    t.start()
    for n in range(4):
        t.handle(Scored(n, 0, 0.5 + n / 10))
    acts = t.handle(Progress({n: NodeDelta((9, 9, 9)) for n in range(4)}))
    forks = [a for a in acts if isinstance(a, Fork)]
    assert forks and all(f.at == 1 for f in forks)  # boundary at output index 0 -> cut after it
    t2 = _tour(branch_point="current")
    t2.start()
    for n in range(4):
        t2.handle(Scored(n, 0, 0.5 + n / 10))
    acts = t2.handle(Progress({n: NodeDelta((9, 9, 9)) for n in range(4)}))
    assert all(f.at is None for f in acts if isinstance(f, Fork))


def test_hard_floor_prunes_and_refills():
    t = _tour(floor=0.3, swap=1)
    t.start()
    for n, s in enumerate([0.9, 0.05, 0.8, 0.7]):
        t.handle(Scored(n, 1, s))
    acts = _tick(t, range(4), 2)
    assert Prune(1) in acts
    assert len(t.active()) == 4


def test_young_traces_are_neither_ranked_nor_parents():
    t = _tour(warmup=10)
    t.start()
    for n in range(4):
        t.handle(Scored(n, 0, n / 4))
    acts = _tick(t, range(4), 3)
    assert not [a for a in acts if isinstance(a, Prune | Fork)]


def test_ghosts_count_toward_capacity_and_are_never_parents():
    t = _tour(swap=1, interval=3)
    t.start()
    for n, s in enumerate([0.9, 0.1, 0.8, 0.2]):
        t.handle(Scored(n, 1, s))
    _tick(t, range(4), 2)  # every node past warmup; no round yet
    acts = t.handle(MemoryPressure(evict=2))
    assert [a.node for a in acts] == [1, 3]  # lowest scored first
    t.handle(Scored(0, 2, 0.95))
    _tick(t, [0, 2], 2)
    acts = _tick(t, [0, 2], 2)  # the round
    assert len(t.active()) == 4
    assert all(f.parent in (0, 2) for f in acts if isinstance(f, Fork))
    # the worst (a ghost) is the swap victim
    assert Prune(1) in acts


def test_memory_pressure_keeps_one_trace_running():
    t = _tour()
    t.start()
    acts = t.handle(MemoryPressure(evict=10))
    assert len(acts) == 3 and len(t.running()) == 1


@pytest.mark.parametrize("kw, msg", [
    (dict(capacity=6, swap=4), "2K"), (dict(interval=0), "interval"), (dict(warmup=0), "warmup"),
    (dict(warmup=-3), "warmup"), (dict(swap=0), "swap"), (dict(branch_point="x"), "branch_point"),
    (dict(parents="best"), "parents"), (dict(interval_unit="tokens"), "interval_unit"),
    (dict(max_children=-1), "max_children"),
])
def test_bad_parameters_are_one_line_errors(kw, msg):
    with pytest.raises(TournamentConfigError, match=msg) as e:
        TournamentConfig(**kw)
    assert "\n" not in str(e.value)


def test_random_parents_ablation_picks_other_parents():
    picks = {"top": set(), "random": set()}
    for mode in picks:
        for trial in range(6):
            t = _tour(capacity=8, swap=1, parents=mode, floor=0.0)
            t.start()
            for n in range(8):
                t.handle(Scored(n, 1, 0.1 + n / 10 + trial / 1000))
            # node 7 scores best; give everyone tokens past warmup, one round
            t.handle(Progress({n: NodeDelta((9, 9)) for n in range(8)}))
            picks[mode] |= {c.parent for c in t.nodes.values() if c.parent is not None}
    assert picks["top"] == {7}
    assert len(picks["random"]) > 1
    st = t.stats()
    assert st["rounds"] == 1 and st["distinct_parents_per_round"] == 1.0


def test_without_drain_the_budget_stops_and_active_traces_do_not_vote():
    t = _tour(budget=2, drain=False)
    t.start()
    t.handle(Finished(0, "stop", "5"))
    t.handle(Finished(0, "stop", "5"))  # a repeated finish votes once
    acts = t.handle(Finished(1, "length", None))
    assert acts == [Stop((2, 3, 4))]  # 4 refilled the first finish; the second ends it
    assert t.done and [v[0] for v in t.votes()] == [0, 1] and t.end_reason == "budget"
    assert t.handle(Finished(2, "stop", "7")) == []


def test_a_finish_refills_at_once_and_a_failure_gives_its_place_back():
    t = _tour(budget=6)
    t.start()
    for n, s_ in enumerate([0.9, 0.1, 0.8, 0.2]):
        t.handle(Scored(n, 1, s_))
    _tick(t, range(4), 2)  # past warmup: parents exist (the round swapped 2)
    acts = t.handle(Finished(0, "stop", "5"))
    assert [type(a) for a in acts] == [Fork]  # the same event refills from the best parent
    acts = t.handle(Finished(2, "error", error="boom"))
    assert len(acts) == 1 and isinstance(acts[0], Fork | Spawn)
    assert len(t.active()) == 4 and t.room() == 0


def test_drain_keeps_the_budget_and_every_kept_trace_votes():
    t = _tour(budget=5, interval=100)
    t.start()  # 4 in play
    assert [type(a) for a in t.handle(Finished(0, "stop", "5"))] == [Spawn]  # 1 + 4: full
    assert t.handle(Finished(1, "stop", "5")) == []  # 2 done + 3 active = 5: no refill
    assert t.draining
    for n in (2, 3):
        assert t.handle(Finished(n, "stop", "6")) == []
    assert not t.done
    t.handle(Finished(4, "stop", "6"))
    assert t.done and len(t.votes()) == 5 and t.counts["stopped"] == 0


def test_steps_of_one_engine_step_refill_at_the_last_finish():
    t = _tour(budget=8, interval=100)
    t.start()
    assert t.handle(Finished(0, "stop", "5", last=False)) == []
    acts = t.handle(Finished(1, "stop", "5"))
    assert [type(a) for a in acts] == [Spawn, Spawn]


def test_the_best_ghost_comes_back_when_nothing_runs():
    """A question never ends with ghosts waiting: when its last running trace finishes,
    the best ghost is revived, and it votes on all N."""
    t = _tour(budget=4)
    t.start()
    for n, s_ in enumerate([0.2, 0.9, 0.5, 0.7]):
        t.handle(Scored(n, 1, s_))
    _tick(t, [], 0)
    t.handle(MemoryPressure(evict=3))  # 0, 2, 3 become ghosts; 1 keeps running
    assert [n.id for n in t.running()] == [1]
    assert t.handle(Finished(1, "stop", "5")) == [Revive(3)]  # no room: drain, the best ghost
    assert t.handle(Finished(3, "stop", "5")) == [Revive(2)]
    assert t.handle(Finished(2, "stop", "5")) == [Revive(0)]
    t.handle(Finished(0, "stop", "6"))
    assert t.done and len(t.votes()) == 4 and t.end_reason == "budget"


def test_free_kv_revives_ghosts_first_then_grows_a_question_admitted_below_c():
    t = _tour(budget=8)
    assert len(t.start(limit=2)) == 2 and t.wants() == 2
    t.handle(MemoryPressure(evict=1))  # node 0 becomes a ghost
    assert t.wants() == 3
    acts = t.handle(MemoryPressure(revive=3))
    assert acts[0] == Revive(0) and [type(a) for a in acts[1:]] == [Spawn, Spawn]
    assert t.limit == 4 and len(t.running()) == 4 and t.wants() == 0


def test_a_child_samples_at_the_base_temperature_times_m_at_every_depth():
    t = _tour(capacity=4, swap=1, child_temperature=0.5)
    t.start()
    for n in range(4):
        t.handle(Scored(n, 1, 0.9 if n == 3 else 0.1 + n / 10))
    acts = _tick(t, range(4), 2)
    (f,) = [a for a in acts if isinstance(a, Fork)]
    assert f.parent == 3 and f.temperature_multiplier == 0.5  # a root's child: T x 0.5
    child = f.node
    t.handle(Scored(child, 5, 0.99))
    acts = _tick(t, [child], 3)
    grand = [a for a in acts if isinstance(a, Fork) and a.parent == child]
    assert grand and grand[0].temperature_multiplier == 1.0  # (T x 0.5) x 1: not T x 0.25


def _scored_pool(t: Tournament, history: dict[int, list[float]]) -> None:
    """Give node n the scores ``history[n]`` at boundaries 0, 2, 4 ... of its output."""
    for n, scores in history.items():
        for j, s_ in enumerate(scores):
            t.handle(Scored(n, 2 * j, s_))


def test_branch_point_best_forks_at_the_best_scored_boundary():
    t = _tour(capacity=4, swap=1, interval=100, branch_point="best")
    t.start()
    _scored_pool(t, {0: [0.5, 0.9, 0.6], 1: [0.1], 2: [0.2], 3: [0.3]})
    _tick(t, range(4), 6)  # 6 tokens each: boundaries at 0, 2, 4 are delivered
    (f,) = [a for a in t.round() if isinstance(a, Fork)]
    assert f.parent == 0 and f.at == 3  # the best boundary (index 2, score 0.9), not index 4
    child = t.nodes[f.node]
    assert child.inherited == 3 and child.scores == [(0, 0.5), (2, 0.9)] and child.score == 0.9


def test_branch_point_drop_forks_before_the_last_fall():
    t = _tour(capacity=4, swap=1, interval=100, branch_point="drop")
    t.start()
    _scored_pool(t, {0: [0.5, 0.7, 0.6, 0.8, 0.75], 1: [0.1], 2: [0.2], 3: [0.3]})
    _tick(t, range(4), 10)
    (f,) = [a for a in t.round() if isinstance(a, Fork)]
    assert f.parent == 0 and f.at == 7  # falls after index 2 and index 6: the last is at 6
    t2 = _tour(capacity=4, swap=1, interval=100, branch_point="drop")
    t2.start()
    _scored_pool(t2, {0: [0.5, 0.7, 0.9], 1: [0.1], 2: [0.2], 3: [0.3]})
    _tick(t2, range(4), 6)
    (f2,) = [a for a in t2.round() if isinstance(a, Fork)]
    assert f2.at == 5  # the score never fell: the last boundary, as "boundary"


def test_a_child_can_be_cut_back_to_its_own_branch_point():
    """The child's inherited branch-point boundary is a candidate (at 0): when every own
    boundary scores lower, "best" forks the grandchild at the child's start."""
    t = _tour(capacity=4, swap=1, interval=100, warmup=2, branch_point="best")
    t.start()
    _scored_pool(t, {0: [0.9], 1: [0.1], 2: [0.2], 3: [0.3]})
    _tick(t, range(4), 2)
    (f,) = [a for a in t.round() if isinstance(a, Fork)]
    assert f.at == 1
    c = f.node
    for j, s_ in enumerate([0.8, 0.7]):  # the child's own boundaries score below 0.9
        t.handle(Scored(c, 2 * j, s_))
    _tick(t, [c], 4)
    assert t._branch_at(t.nodes[c]) == 0


def test_rounds_in_thoughts_come_every_d_boundaries_per_running_trace():
    t = _tour(capacity=4, swap=1, interval=2, interval_unit="thoughts")
    t.start()
    for j in range(2):
        for n in range(4):
            t.handle(Scored(n, j, 0.5))
            assert t.rounds == 0
        _tick(t, range(4), 1)
        assert t.rounds == (1 if j == 1 else 0)  # 8 boundaries = 2 x 4 running traces
    _tick(t, range(4), 1)
    assert t.rounds == 1  # tokens alone hold no round


def test_max_children_spreads_forks_over_parents():
    t = _tour(capacity=8, swap=1, interval=100, floor=0.5, max_children=1)
    t.start()
    for n in range(8):
        t.handle(Scored(n, 1, 0.9 if n == 7 else (0.8 if n == 6 else 0.1)))
    _tick(t, range(8), 2)
    acts = t.round()  # the floor prunes 6 traces: 6 refills, one from each parent at most
    parents = [a.parent for a in acts if isinstance(a, Fork)]
    assert sorted(parents) == [6, 7]
    assert sum(isinstance(a, Spawn) for a in acts) == 4
    assert not t._eligible(t.nodes[7])


def test_max_lineage_spreads_forks_over_root_lineages():
    """A cap of 2 active traces per root's lineage: the floor prunes 6 of 8, the two good
    roots take one child each, fresh roots fill the rest; a grandchild of a full lineage is
    not forked."""
    t = _tour(capacity=8, swap=1, interval=100, floor=0.5, max_lineage=2)
    t.start()
    for n in range(8):
        t.handle(Scored(n, 1, 0.9 if n == 7 else (0.8 if n == 6 else 0.1)))
    _tick(t, range(8), 2)
    acts = t.round()
    forks = [a for a in acts if isinstance(a, Fork)]
    assert sorted(a.parent for a in forks) == [6, 7]
    assert sum(isinstance(a, Spawn) for a in acts) == 4
    assert {t.root_of(a.node) for a in forks} == {6, 7}
    # a later refill: 7's child scores best, but 7's lineage is full (7 and its child)
    kid7 = next(a.node for a in forks if a.parent == 7)
    fresh = [a.node for a in acts if isinstance(a, Spawn)]
    t.handle(Scored(kid7, 1, 0.99))
    for n in fresh:
        t.handle(Scored(n, 1, 0.6))
    _tick(t, [6, 7, kid7, *fresh, *(a.node for a in forks)], 20)
    t._end(t.nodes[fresh[0]], NodeState.PRUNED)
    (a,) = t._refill()
    assert isinstance(a, Fork) and t.root_of(a.node) not in (6, 7)
    with pytest.raises(TournamentConfigError, match="max_lineage must be >= 0"):
        TournamentConfig(max_lineage=-1)


@pytest.mark.parametrize("share, c, cap", [(0.0, 32, 0), (0.25, 32, 8), (0.1, 8, 1),
                                           (0.01, 8, 1), (1.0, 16, 16)])
def test_the_lineage_share_is_a_share_of_c(share, c, cap):
    from gambit_search.methods.gambit import tournament_config

    assert tournament_config(GambitParams(capacity=c, lineage_share=share), 64).max_lineage == cap
    for bad in (-0.1, 1.5, math.nan, "wide"):
        with pytest.raises(TournamentConfigError, match="lineage_share must be"):
            tournament_config(GambitParams(lineage_share=bad), 64)


def test_the_prune_budget_stops_pruning_and_the_survivors_finish():
    """max_prunes = 3: the floor would prune 6 of 8; the 3 worst go, then no round prunes."""
    t = _tour(capacity=8, swap=1, interval=100, floor=0.5, max_prunes=3, budget=8)
    t.start()
    for n in range(8):
        t.handle(Scored(n, 1, 0.9 if n == 7 else (0.8 if n == 6 else 0.1 + n / 100)))
    _tick(t, range(8), 2)
    acts = t.round()
    assert sorted(a.node for a in acts if isinstance(a, Prune)) == [0, 1, 2]  # worst first
    assert t.counts["prunes"] == 3
    assert not [a for a in t.round() if isinstance(a, Prune)]  # the budget is spent
    t0 = _tour(capacity=8, swap=1, interval=100, floor=0.5, max_prunes=0, budget=8)
    t0.start()
    for n in range(8):
        t0.handle(Scored(n, 1, 0.1))
    _tick(t0, range(8), 2)
    assert t0.round() == []  # a zero budget: BoN's pool, never pruned
    with pytest.raises(TournamentConfigError, match="max_prunes must be >= 0"):
        TournamentConfig(max_prunes=-1)


@pytest.mark.parametrize("x, n, cap", [(math.inf, 8, None), (0.0, 8, 0), (0.5, 8, 4),
                                       (0.3, 8, 3), (1.0, 64, 64)])
def test_the_prune_budget_is_a_share_of_n(x, n, cap):
    from gambit_search.methods.gambit import tournament_config

    assert tournament_config(GambitParams(prune_budget=x), n).max_prunes == cap
    assert tournament_config(GambitParams(), 8).max_prunes == 8  # the default: X = 1
    for bad in (-0.5, math.nan, None, "many"):
        with pytest.raises(TournamentConfigError, match="prune_budget must be a number >= 0"):
            tournament_config(GambitParams(prune_budget=bad), 8)
    assert tournament_config(GambitParams(prune_budget="inf"), 8).max_prunes is None
