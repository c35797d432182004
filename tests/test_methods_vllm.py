"""The baselines on the real vLLM engine with the shipped toy policy (slow).

Shares the session's one engine (tests/conftest.py); a few toy questions, small N."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow


@pytest.fixture
def decode(toy_tokenizer):
    return lambda ids: toy_tokenizer.decode(ids, skip_special_tokens=True)


def _solve(engine, decode, tmp_path, method: str, **kw):
    from gambit_search.solve import make_config, solve

    base = dict(dataset="toy:val:3", method=method, n=8)  # no --out: rows keep their tree
    return solve(make_config(**(base | kw)), engine=engine, decode=decode, progress=False)


def _rows_ok(s, n: int) -> None:
    assert s["questions"] == 3 and s["failed"] == 0
    for r in s["results"]:
        assert r["tree_stats"]["nodes"] <= n
        assert r["answer"] is not None and r["answer"].isdigit()  # the toy boxes an integer
        assert sum(v["count"] for v in r["votes"]) <= r["tree_stats"]["completions"]


def test_bon_scores_every_trace_and_reports_weighted_and_top1(engine, decode, tmp_path):
    s = _solve(engine, decode, tmp_path, "bon")
    _rows_ok(s, 8)
    for r in s["results"]:
        assert r["tree_stats"]["completions"] == 8 and r["tree_stats"]["prunes"] == 0
        assert r["rule"] == "weighted" and r["answer"] == r["answer_weighted"]
        assert r["answer_top1"] is not None
        assert all(n["scores"] for n in r["tree"])  # every trace was scored at boundaries
        assert any(v["weight"] > 0 for v in r["votes"])
    assert not engine.has_unfinished()


def test_step_aborts_the_lowest_scored_traces_on_memory_pressure(engine, decode):
    """The driver's KV-usage trigger set to 0 (every memory read is pressure), so STEP aborts
    one real vLLM request per read, always the lowest-scored, down to one per question."""
    from gambit_core.prompts import build_prompt_ids
    from gambit_core.questions import load_questions
    from gambit_scorer.checkpoint import load_scorer
    from gambit_search.driver import Driver, DriverConfig
    from gambit_search.engine import SamplingSpec
    from gambit_search.methods import get_method
    from gambit_search.methods.step import Step
    from gambit_search.scoring import RuntimeScorer
    from tests.conftest import REPO

    seen: list[tuple[list[float], list[float]]] = []

    class Watched(Step):
        def _on_memory(self, e):
            before = {n.id: (n.score or 0.0) for n in self.running()}
            acts = super()._on_memory(e)
            gone = [before[a.node] for a in acts]
            seen.append((gone, [s for i, s in before.items() if i not in
                                {a.node for a in acts}]))
            return acts

    from dataclasses import replace

    m = replace(get_method("step"), make_policy=lambda p, n, ctx: Watched(n))
    scorer = RuntimeScorer(load_scorer(REPO / "checkpoints/toy-scorer-seq/ckpt.pt",
                                       expected_hidden_size=engine.hidden_size))
    tok = engine.tokenizer
    drv = Driver(engine, m.bind(n=8), prompt_ids=lambda q: build_prompt_ids(q.question, tok),
                 decode=decode, spec=SamplingSpec(temperature=1.0, top_p=1.0, top_k=0,
                                                  max_tokens=400),
                 scorer=scorer, config=DriverConfig(max_live=16, evict_above=0.0))
    results = list(drv.run(load_questions("toy:val:2")))
    assert len(results) == 2
    for r in results:
        s = r["tree_stats"]
        assert s["nodes"] == 8 and s["prunes"] > 0 and s["completions"] >= 1
        assert s["completions"] + s["prunes"] == 8
        assert r["answer"] is not None
    assert seen and all(max(g) <= min(k) for g, k in seen if g and k)
    assert not engine.has_unfinished()


@pytest.mark.parametrize("name", ["deepconf-low", "deepconf-high"])
def test_deepconf_reads_the_engines_top_k_log_probs(engine, decode, tmp_path, name):
    s = _solve(engine, decode, tmp_path, name, n=12, deepconf_warmup=4, deepconf_window=16)
    _rows_ok(s, 12)
    stops = 0
    for r in s["results"]:
        dc = r["tree_stats"]["deepconf"]
        assert dc["warmup"] == 4 and dc["threshold"] is not None and dc["threshold"] > 0
        stops += dc["early_stops"]
        warm = [n for n in r["tree"] if n["warmup"]]
        assert len(warm) == 4 and all(n["state"] == "completed" for n in warm)
        assert all(n["confidence"] is not None and n["confidence"] > 0 for n in r["tree"]
                   if n["generated"])
        # every stop came after the warmup, on a trace with at least a full window
        for n in r["tree"]:
            if n["state"] == "pruned":
                assert not n["warmup"] and n["generated"] >= 16
                assert n["created_at"] >= max(w["ended_at"] for w in warm)
        assert 1 <= dc["voters"] <= r["tree_stats"]["completions"]
    if name == "deepconf-low":  # its bar is the warmup's 90th percentile: most traces stop
        assert stops > 0
    assert not engine.has_unfinished()


def test_slim_sc_embeds_thoughts_offline_and_prunes_duplicates(engine, decode, tmp_path,
                                                               monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    s = _solve(engine, decode, tmp_path, "slim-sc", slim_warmup=16, slim_interval=8)
    _rows_ok(s, 8)
    assert s["results"][0]["rule"] == "plain"
    assert sum(r["tree_stats"]["slim_sc"]["checks"] for r in s["results"]) > 0
    # the toy's traces repeat each other's early thoughts ("47+8=55"): some are pruned
    assert sum(r["tree_stats"]["prunes"] for r in s["results"]) > 0
    for r in s["results"]:
        assert r["tree_stats"]["completions"] >= 1
    assert not engine.has_unfinished()
