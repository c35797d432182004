"""gambit-solve on the real vLLM engine with the shipped toy policy and SeqScorer (slow).

Shares the session's one engine (tests/conftest.py)."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest

pytestmark = pytest.mark.slow


@pytest.fixture
def decode(toy_tokenizer):
    return lambda ids: toy_tokenizer.decode(ids, skip_special_tokens=True)


def test_dataset_solves_end_to_end_with_gambit_and_sc(engine, decode, tmp_path):
    from gambit_search.solve import SolveConfig, solve

    runs = {}
    for method in ("gambit", "sc"):
        cfg = SolveConfig(dataset="toy:test:4", method=method, n=8, swap=2, interval=4,
                          warmup=24, out=str(tmp_path / method))
        runs[method] = solve(cfg, engine=engine, decode=decode, progress=False)
    for method, s in runs.items():
        assert s["questions"] == 4 and s["failed"] == 0
        rows = [json.loads(x) for x in (tmp_path / method / "results.jsonl").read_text().split("\n") if x]
        for r in rows:
            # SC: exactly its 8; Gambit drains: the traces running at its 8th completion vote too
            done = r["tree_stats"]["completions"]
            assert done == 8 if method == "sc" else 8 <= done < 16
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
    revive: bool = False
    max_tokens: int = 380


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


def test_ghosts_appear_and_are_pruned_when_the_kv_cache_is_small(small_engine, decode):
    """2 questions x 16 toy traces (~160 tokens, 5 blocks each) want ~160 KV blocks of the 64
    there are: vLLM preempts, the driver evicts the lowest-scored traces to ghosts, and
    rounds prune them."""
    from data_pipelines.prompts import build_prompt_ids
    from data_pipelines.questions import load_questions
    from gambit_scorer.checkpoint import load_scorer
    from gambit_search.driver import Driver, DriverConfig
    from gambit_search.engine import SamplingSpec
    from gambit_search.methods import get_method
    from gambit_search.scoring import RuntimeScorer
    from tests.conftest import REPO

    eng = small_engine
    assert eng.memory().total_blocks <= 80
    tok = eng.tokenizer
    scorer = RuntimeScorer(load_scorer(REPO / "checkpoints/toy-scorer-seq/ckpt.pt",
                                       expected_hidden_size=eng.hidden_size))
    qs = load_questions("toy:val:2")
    drv = Driver(eng, get_method("gambit"), _P(),
                 prompt_ids=lambda q: build_prompt_ids(q.question, tok), decode=decode,
                 spec=SamplingSpec(temperature=1.0, top_p=1.0, top_k=0, max_tokens=380),
                 scorer=scorer, config=DriverConfig(max_live=64))
    results = list(drv.run(qs))
    assert len(results) == 2
    top_kv = max(x[3] for x in drv.trace_log)
    ghosts = sum(r["tree_stats"]["ghosts"] for r in results)
    assert ghosts > 0, f"no ghosts; highest KV usage {top_kv:.2f}"
    evicted = [n for r in results for n in r["tree"] if n["evictions"]]
    assert any(n["state"] == "pruned" for n in evicted)
    # a ghost holds no KV and still counted toward C: every round left 16 active
    for r in results:
        assert r["rounds"] and all(x["active"] == 16 for x in r["rounds"])
    assert not eng.has_unfinished()
