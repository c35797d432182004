"""gambit-solve on the real vLLM engine with the shipped toy policy and SeqScorer (slow).

Shares the session's one engine (tests/conftest.py)."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest

from gambit_search.solve.config import REPO

TOY_SEQ = REPO / "checkpoints" / "toy-scorer-seq" / "ckpt.pt"
"""The session engine's worker scorer (tests/conftest.py)."""

pytestmark = pytest.mark.slow


@pytest.fixture
def decode(toy_tokenizer):
    return lambda ids: toy_tokenizer.decode(ids, skip_special_tokens=True)


def test_dataset_solves_end_to_end_with_gambit_and_sc(engine, decode, tmp_path):
    from gambit_search.solve import make_config, solve

    runs = {}
    for method in ("gambit", "sc"):
        cfg = make_config(dataset="toy:test:4", method=method, n=8, capacity=4, swap=2,
                          interval=4, warmup=24, out=str(tmp_path / method))
        runs[method] = solve(cfg, engine=engine, decode=decode, progress=False)
    for method, s in runs.items():
        assert s["questions"] == 4 and s["failed"] == 0
        rows = [json.loads(x) for x in (tmp_path / method / "results.jsonl").read_text().split("\n") if x]
        for r in rows:
            # one budget: both vote on exactly 8 (Gambit at C=4 < N refills as traces end)
            assert r["tree_stats"]["completions"] == 8
            assert sum(v["count"] for v in r["votes"]) <= 8
            if method == "gambit":
                assert r["tree_stats"]["end_reason"] == "budget"
                assert r["tree_stats"]["stopped"] == 0  # every trace kept voted
            assert r["answer"] is not None and r["answer"].isdigit()  # the toy boxes an integer
            assert r["correct"] == (r["answer"] == r["gold"] or int(r["answer"]) == int(r["gold"]))
    g = runs["gambit"]
    assert sum(r["tree_stats"]["branches"] for r in g["results"]) > 0
    assert sum(r["tree_stats"]["branches"] for r in runs["sc"]["results"]) == 0
    # forks read their parent's prefix from vLLM's prefix cache: all full blocks but at most one
    pc = g["prefix_cache"]
    assert pc["forks"] > 0
    assert pc["cached_tokens"] >= pc["prompt_tokens"] - pc["forks"] * 2 * engine.block_size
    # Gambit spent its budget on traces the scorer ranks: the weighted vote uses scores
    assert all(any(v["weight"] > 0 for v in r["votes"]) for r in g["results"])
    assert not engine.has_unfinished()


@dataclass
class _P:
    n: int = 16
    capacity: int = 16
    swap: int = 4
    interval: int = 8
    warmup: int = 32
    floor: float = 0.0
    child_temperature: float = 1.0
    branch_point: str = "boundary"
    ghosts: bool = True
    revive: bool = True
    max_tokens: int = 380
    drain: bool = True


@pytest.fixture(scope="module")
def small_engine():
    """A second engine whose KV cache holds 64 blocks of 32 tokens (2,048 tokens)."""
    from dataclasses import replace

    from gambit_search.vllm_engine import VLLMEngine
    from tests.conftest import _toy_engine_config

    eng = VLLMEngine(replace(_toy_engine_config(), kv_cache_memory_bytes=8 << 20,
                             max_num_seqs=64))
    yield eng
    eng.close()


def _small_run(eng, decode, method: str, params, n_questions: int = 2):
    from gambit_core.prompts import build_prompt_ids
    from gambit_core.questions import load_questions
    from gambit_scorer.checkpoint import load_scorer
    from gambit_search.driver import Driver, DriverConfig
    from gambit_search.engine import SamplingSpec
    from gambit_search.methods import get_method
    from gambit_search.scoring import RuntimeScorer
    from tests.conftest import REPO

    tok = eng.tokenizer
    scorer = RuntimeScorer(load_scorer(REPO / "checkpoints/toy-scorer-seq/ckpt.pt",
                                       expected_hidden_size=eng.hidden_size))
    from dataclasses import asdict

    from gambit_search.solve import params_from_flat

    m = get_method(method)
    drv = Driver(eng, m.bind(params_from_flat(m, asdict(params)), params.n),
                 prompt_ids=lambda q: build_prompt_ids(q.question, tok), decode=decode,
                 spec=SamplingSpec(temperature=1.0, top_p=1.0, top_k=0, max_tokens=380),
                 scorer=scorer, config=DriverConfig(max_live=64))
    before = eng.memory().num_preemptions
    results = list(drv.run(load_questions(f"toy:val:{n_questions}")))
    return drv, results, eng.memory().num_preemptions - before


def test_under_kv_pressure_gambit_at_c_below_n_votes_on_exactly_n(small_engine, decode):
    """2 questions x C=16 of N=24 toy traces (~160 tokens, 5 blocks each) want ~160 KV
    blocks of the 64 there are. Each question starts what its KV share holds, refills as
    traces end, evicts only the shortfall, and votes on exactly N; none ends with ghosts."""
    eng = small_engine
    assert eng.memory().total_blocks <= 80
    drv, results, _ = _small_run(eng, decode, "gambit", _P(n=24, capacity=16))
    assert len(results) == 2
    assert max(x[3] for x in drv.trace_log) > 0.5  # the cache did fill
    for r in results:
        st = r["tree_stats"]
        assert st["end_reason"] == "budget" and st["completions"] == 24, st
        assert st["stopped"] == 0 and not [n for n in r["tree"] if n["state"] == "ghost"]
        assert all(x["active"] <= 16 for x in r["rounds"])
    first = [n for n in results[0]["tree"] if n["parent"] is None and n["created_at"] == 0]
    assert len(first) < 16  # admitted with what its KV share holds, not C
    assert not eng.has_unfinished()


def test_step_aborts_before_vllm_preempts(small_engine, decode):
    """STEP at N=24 on the same 64 blocks: it aborts its lowest-scored traces when the KV
    shortfall appears, and vLLM's preemption counter does not move."""
    drv, results, preempted = _small_run(small_engine, decode, "step", _P(n=24, capacity=24))
    assert sum(r["tree_stats"]["prunes"] for r in results) > 0  # it was under pressure
    assert preempted == 0
    for r in results:
        assert r["tree_stats"]["started"] <= 24
        assert r["tree_stats"]["completions"] + r["tree_stats"]["prunes"] == 24


@pytest.mark.slow
@pytest.mark.parametrize("in_engine", [True, False])
def test_gambit_scores_in_the_worker_or_in_the_driver(engine, decode, tmp_path, in_engine):
    """The session engine scores in its worker (and ships the states): with
    --score-in-engine the driver runs no scorer and the tournament ranks on the worker's
    scores; without, the driver scores the shipped states. Both keep the budget."""
    from gambit_search.solve import make_config, solve

    # the session engine's worker scorer (conftest), not gambit-solve's default since fccda3f:
    # a run whose scorer is not the worker's is scored in the driver
    cfg = make_config(dataset="toy:test:3", method="gambit", n=8, capacity=4, swap=2,
                      interval=4, warmup=24, score_in_engine=in_engine, out=str(tmp_path),
                      scorer=str(TOY_SEQ))
    s = solve(cfg, engine=engine, decode=decode, progress=False)
    assert s["questions"] == 3 and s["failed"] == 0
    assert (s["timing"]["scoring_s"] == 0) == in_engine  # who ran the scorer
    rows = [json.loads(x) for x in (tmp_path / "results.jsonl").read_text().split("\n") if x]
    for r in rows:
        assert r["tree_stats"]["completions"] == 8
    trees = [json.loads(f.read_text()) for f in (tmp_path / "trees").glob("*.json")]
    assert len(trees) == 3
    for t in trees:  # the tournament saw scores either way
        nodes = t["nodes"] if isinstance(t, dict) else t
        assert any(n["scores"] for n in nodes)


def test_catch_up_reaches_the_engine_for_the_run_and_leaves_sc_unchanged(engine, decode,
                                                                          tmp_path, monkeypatch):
    """--catch-up sets the engine's catch_up for the run only (one engine serves several
    runs), and SC's traces do not depend on it (each trace's tokens follow its own seed)."""
    from gambit_search.solve import make_config, solve

    seen: list[bool] = []
    step = engine.step
    monkeypatch.setattr(engine, "step", lambda: (seen.append(engine.catch_up), step())[1])
    keys = ("id", "answer", "answer_plain", "unique_tokens", "votes")
    runs = {}
    for on in (False, True):
        seen.clear()
        cfg = make_config(dataset="toy:test:3", method="sc", n=8, catch_up=on,
                          out=str(tmp_path / str(on)))
        s = solve(cfg, engine=engine, decode=decode, progress=False)
        assert seen and set(seen) == {on}, "the run's steps see its setting"
        assert engine.catch_up is False, "put back after the run"
        assert s["timing"]["caught_up"] >= 0 and (on or s["timing"]["caught_up"] == 0)
        runs[on] = sorted(({k: r[k] for k in keys} for r in s["results"]), key=str)
    assert runs[True] == runs[False]
