"""Bookkeeping that scales (issue 19) changes no result.

- The policies' index by state (``NodeBook.running()`` ..., ``num_active`` ...) equals a scan
  of the tree after every event of random streams, for every method's policy, and the
  tournament's indexed eligible parents equal a full ranking of the running nodes.
- The fake engine's ordered-set queues schedule exactly as the list-based engine did: a
  reference engine below keeps the old lists (and the old scripted policy and block
  hashing), and random programs on both give the same stream, step by step.

Run: .venv/bin/python -m pytest -q tests/test_bookkeeping.py
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import replace

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gambit_search.driver import Driver, DriverConfig
from gambit_search.engine import SamplingSpec, StepOutput, TokenLogprobs, TraceStatus
from gambit_search.fake_engine import (
    BOUNDARY,
    EOS,
    FIRST_TEXT,
    THINK_END,
    FakeEngine,
    FakeEngineConfig,
    thought_policy,
)
from gambit_search.fake_kv import block_hashes
from gambit_search.methods import Method
from gambit_search.methods.deepconf import DeepConf, DeepConfParams
from gambit_search.methods.gambit import GambitParams, tournament_config
from gambit_search.methods.sc import SelfConsistency
from gambit_search.methods.slim_sc import SlimParams, SlimSC
from gambit_search.methods.step import Step
from gambit_search.policy import (
    Finished,
    MemoryPressure,
    NodeBook,
    NodeDelta,
    NodeState,
    Progress,
    Scored,
)
from gambit_search.tournament import Tournament
from gambit_search.tournament_config import TournamentConfig
from tests.doubles import RandomScorer

# ----------------------------------------------------------------------------- the index


def assert_index_consistent(book: NodeBook) -> None:
    """The book's index by state equals a scan of its nodes (lists in id order)."""
    nodes = list(book.nodes.values())
    assert [n.id for n in nodes] == sorted(book.nodes)
    for s in NodeState:
        want = [n for n in nodes if n.state is s]
        assert book.in_state(s) == want, s
        assert book.num_in(s) == len(want), s
    active = [n for n in nodes if n.state in (NodeState.RUNNING, NodeState.GHOST)]
    assert book.active() == active
    assert book.running() == [n for n in nodes if n.state is NodeState.RUNNING]
    assert book.ghosts() == [n for n in nodes if n.state is NodeState.GHOST]
    assert book.completed() == [n for n in nodes if n.state is NodeState.COMPLETED]
    assert book.num_active == len(active)
    assert book.num_running == len(book.running())
    assert book.num_ghosts == len(book.ghosts())
    assert book.num_completed == len(book.completed())
    if isinstance(book, Tournament) and book.config.parents == "top":
        full = book._parents(set())
        for k in (1, 2, 3, len(full) + 1):
            assert book._top_parents(k) == full[:k], k


class Indexed:
    """Mixin: checks the index after every start, event and stop."""

    def start(self, *a, **kw):
        acts = super().start(*a, **kw)
        assert_index_consistent(self)
        return acts

    def handle(self, event):
        acts = super().handle(event)
        assert_index_consistent(self)
        return acts

    def stop(self):
        acts = super().stop()
        assert_index_consistent(self)
        return acts


class ITournament(Indexed, Tournament):
    sweep_slack = 0  # sweep the parent heap often


class IStep(Indexed, Step):
    pass


class ISC(Indexed, SelfConsistency):
    pass


class IDeepConf(Indexed, DeepConf):
    pass


class ISlim(Indexed, SlimSC):
    pass


def _decode(ids: Sequence[int]) -> str:
    return "".join("\n\n" if i == BOUNDARY else f"t{i % 3} " for i in ids)


def _embed(texts: Sequence[str]) -> np.ndarray:
    """Equal text: cosine 1; a few distinct thoughts, so pairs above the threshold occur."""
    out = np.zeros((len(texts), 16), dtype=np.float32)
    for r, t in enumerate(texts):
        out[r, sum(map(ord, t)) % 16] = 1.0
    return out


def _lps(k: int, rng: random.Random) -> tuple[TokenLogprobs, ...]:
    return tuple(TokenLogprobs(9, -1.0, (9,) * 4, tuple(-rng.uniform(0.2, 3.0)
                                                        for _ in range(4)))
                 for _ in range(k))


def _stream(p: NodeBook, rng: random.Random, *start: int | None, events: int = 160) -> None:
    """Random plausible events for policy ``p`` (started with ``start``): boundaries scored,
    finishes (some in batches, some errors), tokens and memory pressure."""
    p.start(*start)  # type: ignore[attr-defined]
    out_idx: dict[int, int] = {}
    for _ in range(events):
        if p.done:
            break
        run = p.running()
        r = rng.random()
        if r < 0.25 and run:
            n = rng.choice(run)
            out_idx[n.id] = out_idx.get(n.id, 0) + rng.randint(1, 3)
            p.handle(Scored(n.id, min(out_idx[n.id], n.generated), rng.random()))
        elif r < 0.40 and run:
            fin = rng.sample(run, rng.randint(1, min(3, len(run))))
            for j, n in enumerate(fin):
                reason = rng.choice(["stop", "stop", "length", "error"])
                p.handle(Finished(n.id, reason, answer=str(rng.randrange(3)),
                                  error="boom" if reason == "error" else None,
                                  last=j == len(fin) - 1))
        elif r < 0.50:
            p.handle(MemoryPressure(evict=rng.randint(0, 3), revive=rng.randint(0, 3)))
        else:
            ds = {}
            for n in run:
                k = rng.choice([0, 1, 1, 2])
                toks = tuple(rng.choice([BOUNDARY, 9, 10, 11]) for _ in range(k))
                ds[n.id] = NodeDelta(toks, _lps(k, rng))
            p.handle(Progress(ds))
    if not p.done:
        p.stop()


TOURNAMENTS = st.builds(
    TournamentConfig, capacity=st.integers(4, 12), swap=st.integers(1, 2),
    interval=st.integers(1, 4), warmup=st.integers(1, 6),
    floor=st.sampled_from([0.0, 0.1, 0.4]), budget=st.sampled_from([None, 6, 20]),
    ghosts=st.booleans(), revive=st.booleans(),
    branch_point=st.sampled_from(["boundary", "current"]),
    parents=st.sampled_from(["top", "top", "random"]), drain=st.booleans())


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cfg=TOURNAMENTS, seed=st.integers(0, 10_000), limit=st.sampled_from([None, 2]))
def test_the_tournaments_index_matches_a_scan_after_every_event(cfg, seed, limit):
    rng = random.Random(seed)
    t = ITournament(cfg)
    _stream(t, rng, limit)
    assert t.done


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kind=st.sampled_from(["sc", "step", "deepconf", "slim"]), n=st.integers(1, 10),
       seed=st.integers(0, 10_000))
def test_every_baselines_index_matches_a_scan_after_every_event(kind, n, seed):
    rng = random.Random(seed)
    p: NodeBook
    if kind == "sc":
        p = ISC(n)
    elif kind == "step":
        p = IStep(n)
    elif kind == "deepconf":
        p = IDeepConf(DeepConfParams(warmup=max(1, n // 3), window=2), n)
    else:
        p = ISlim(SlimParams(interval=2, warmup=2, threshold=0.5), n, _decode, _embed)
    _stream(p, rng)


def test_state_is_read_only_and_a_revived_ghost_is_listed_in_id_order():
    t = ITournament(TournamentConfig(capacity=4, swap=1, interval=100, warmup=1))
    t.start()
    try:
        t.nodes[0].state = NodeState.GHOST  # type: ignore[misc]
    except AttributeError:
        pass
    else:
        raise AssertionError("Node.state must be read-only (the book keeps the index)")
    for i in range(4):
        t.handle(Scored(i, 0, 0.1 * (i + 1)))
    t.handle(MemoryPressure(evict=2))  # nodes 0 and 1, the lowest scored, become ghosts
    assert [n.id for n in t.ghosts()] == [0, 1] and [n.id for n in t.running()] == [2, 3]
    t.handle(MemoryPressure(revive=1))  # the best ghost (1) comes back after 2 and 3
    assert [n.id for n in t.running()] == [1, 2, 3]
    assert [n.id for n in t.active()] == [0, 1, 2, 3] and t.num_ghosts == 1


def _method() -> Method:
    return Method("indexed", "test",
                  lambda p, n, ctx: ITournament(tournament_config(p, n, ctx.max_tokens)),
                  lambda p, n: min(int(p.capacity or n), n), params=GambitParams,
                  needs_scorer=True, scores_traces=True, uses_memory=True, vote="weighted")


def test_the_index_holds_through_the_driver_under_memory_pressure():
    """Gambit on the fake engine with a KV pool that forces ghosts, revivals and refills."""
    eng = FakeEngine(FakeEngineConfig(num_blocks=32, block_size=4, seed=1, max_model_len=256,
                                      max_num_seqs=64, policy=thought_policy(num_thoughts=(1, 14))))
    params = GambitParams(capacity=8, swap=2, interval=2, warmup=4, floor=0.2)
    drv = Driver(eng, _method().bind(params, 12),
                 prompt_ids=lambda q: [1, FIRST_TEXT, FIRST_TEXT + len(q.question)],
                 decode=eng.decode, spec=SamplingSpec(max_tokens=120),
                 scorer=RandomScorer(1), config=DriverConfig(max_live=16, seed=1))

    class Q:
        def __init__(self, i: int) -> None:
            self.id, self.question, self.answer = f"q{i}", "x" * (i + 1), ""

    results = list(drv.run([Q(i) for i in range(2)]))
    assert len(results) == 2
    assert sum(r["tree_stats"]["ghosts"] for r in results) > 0
    assert sum(r["tree_stats"]["revivals"] for r in results) > 0


# ----------------------------------------------------------------------------- the fake engine


def reference_thought_policy(vocab_size: int = 64, thought_len=(3, 8), num_thoughts=(2, 6),
                             think_end: bool = False):
    """:func:`thought_policy` as it was: one scan of the sequence per token."""

    def policy(seq, seed):
        rng = random.Random(hash((seed, len(seq))))
        n_b = 0
        since = 0
        for t in seq:
            if t == BOUNDARY:
                n_b += 1
                since = 0
            else:
                since += 1
        goal = random.Random(seed).randint(*num_thoughts)
        if n_b >= goal:
            if think_end and THINK_END not in seq:
                return THINK_END
            return EOS if since >= 1 else rng.randrange(FIRST_TEXT, vocab_size)
        if since >= rng.randint(*thought_len):
            return BOUNDARY
        return rng.randrange(FIRST_TEXT, vocab_size)

    return policy


class ListEngine(FakeEngine):
    """The fake engine as it was: plain lists as run queues (``list.remove``, ``insert(0)``,
    ``pop(0)``, ``max`` over the running ones) and every full block's hash recomputed."""

    def __init__(self, config: FakeEngineConfig) -> None:
        super().__init__(config)
        self._running = []  # type: ignore[assignment]
        self._waiting = []  # type: ignore[assignment]

    def _enqueue(self, req) -> None:
        self._waiting.append(req)

    def _retire(self, req) -> None:
        self._running.remove(req)
        self._release(req)

    def _unlink(self, req) -> None:
        if req in self._running:
            self._running.remove(req)
            self._release(req)
        elif req in self._waiting:
            self._waiting.remove(req)

    def _commit_full(self, req) -> None:
        size = self._pool.size
        n = len(req.seq)
        if n % size == 0:
            i = n // size - 1
            self._pool.commit(req.blocks[i], block_hashes(req.seq, size)[i])

    def step(self) -> StepOutput:
        out = StepOutput(deltas=self._errors)
        self._errors = []
        if not self._running and not self._waiting:
            return out
        self.steps += 1
        ready = []
        for req in sorted(self._running, key=lambda r: r.arrival):
            if req not in self._running:
                continue
            while not self._grow(req):
                victim = max(self._running, key=lambda r: r.arrival)
                self._running.remove(victim)
                self._release(victim)
                victim.first = False
                self._waiting.insert(0, victim)
                self._preemptions += 1
                if victim is req:
                    break
            if req in self._running:
                ready.append(req)
        while self._waiting and len(self._running) < self.config.max_num_seqs:
            req = self._waiting[0]
            if not self._admit(req):
                if not self._running:
                    self._waiting.pop(0)
                    t = req.trace
                    t.req = None
                    need = -(-(len(req.seq) + 1) // self._pool.size)
                    self._fail(t, "error", f"needs {need} KV blocks, the engine has "
                               f"{self._pool.total}")
                    out.deltas.extend(self._errors)
                    self._errors = []
                    continue
                break
            self._waiting.pop(0)
            self._running.append(req)
            ready.append(req)
        for req in ready:
            self._advance(req, out)
        return out


def _rows(out: StepOutput) -> tuple[list, list]:
    ds = [(d.trace, d.token_ids, d.text, d.finish_reason, d.num_cached_tokens, d.error,
           None if d.logprobs is None else [(x.token_id, x.logprob, x.top_ids, x.top_logprobs)
                                            for x in d.logprobs]) for d in out.deltas]
    bs = [(b.trace, b.position, b.output_index, b.token_id, b.hidden.tobytes())
          for b in out.boundaries]
    return ds, bs


def _assert_hashes(eng: FakeEngine) -> None:
    """A running request's incremental block hashes are those of its whole sequence."""
    for req in eng._running:
        assert req.hashes == block_hashes(req.seq, eng._pool.size)


PROGRAMS = st.lists(st.tuples(st.sampled_from(["step"] * 4 + ["add", "fork", "evict", "revive",
                                                               "abort"]),
                              st.integers(0, 10_000)), max_size=70)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=PROGRAMS, num_blocks=st.sampled_from([10, 24, 60, 400]),
       max_num_seqs=st.sampled_from([2, 5, 64]), seed=st.integers(0, 5),
       logprobs=st.sampled_from([None, 3]))
def test_the_fake_engine_schedules_as_the_list_based_reference(ops, num_blocks, max_num_seqs,
                                                               seed, logprobs):
    """Same deltas, boundaries, statuses and memory, step by step, under preemption, a
    short queue, evictions, revivals and aborts."""
    cfg = FakeEngineConfig(num_blocks=num_blocks, block_size=4, seed=seed,
                           max_num_seqs=max_num_seqs, max_model_len=120)
    new = FakeEngine(cfg)
    ref = ListEngine(replace(cfg, policy=reference_thought_policy()))
    spec = SamplingSpec(max_tokens=50, logprobs=logprobs)
    for eng in (new, ref):
        for q in range(3):
            eng.add_trace([1] + [FIRST_TEXT + (q * 7 + i) % 50 for i in range(8)], spec)
    for op, k in ops + [("step", 0)] * 200:
        ids = new.trace_ids()
        assert ids == ref.trace_ids()
        tid = ids[k % len(ids)] if ids else None
        status = new.trace_info(tid).status if tid is not None else None
        if op == "step":
            assert _rows(new.step()) == _rows(ref.step())
            _assert_hashes(new)
        elif op == "add":
            for eng in (new, ref):
                eng.add_trace([1] + [FIRST_TEXT + (k + i) % 50 for i in range(3 + k % 9)], spec,
                              seed=k)
        elif op == "fork" and status in (TraceStatus.RUNNING, TraceStatus.EVICTED):
            at = None if k % 3 else k % (len(new.trace_info(tid).output_ids) + 1)
            for eng in (new, ref):
                eng.fork(tid, temperature_multiplier=0.5, seed=k, at=at)
        elif op == "evict" and status is TraceStatus.RUNNING:
            new.evict(tid)
            ref.evict(tid)
        elif op == "revive" and status is TraceStatus.EVICTED:
            new.revive(tid)
            ref.revive(tid)
        elif op == "abort" and tid is not None:
            new.abort(tid)
            ref.abort(tid)
        assert new.memory() == ref.memory()
        assert new.has_unfinished() == ref.has_unfinished()
        if not new.has_unfinished() and op == "step":
            break
    assert [new.trace_info(t) for t in new.trace_ids()] == \
        [ref.trace_info(t) for t in ref.trace_ids()]


@settings(max_examples=200, deadline=None)
@given(seq=st.lists(st.sampled_from([1, BOUNDARY, BOUNDARY, THINK_END, EOS, 7, 9, 30]),
                    max_size=40),
       seed=st.integers(0, 1 << 31), think_end=st.booleans())
def test_the_scripted_policy_is_the_reference_one(seq, seed, think_end):
    assert thought_policy(think_end=think_end)(seq, seed) == \
        reference_thought_policy(think_end=think_end)(seq, seed)
