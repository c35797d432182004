"""gambit-serve on the fake engine, in process (FastAPI's TestClient): the OpenAI shapes,
usage accounting, streaming, bad input, admission timeouts, cancellation and the
data-parallel rank choice. The real-engine server: tests/test_serve_vllm.py."""

from __future__ import annotations

import json
import threading
import time

import pytest

from gambit_search.serve.cli import ServeConfig, build_state

fastapi = pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

Q = "Start 3. Ops: +1 +2. Mod 100."


@pytest.fixture()
def server(fake_scorer):
    """A fake-engine server (2 ranks) and its state; the services stop afterwards."""
    made = []

    def make(**kw):
        from gambit_search.serve.app import build_app

        base = dict(engine="fake", scorer=fake_scorer, n=8, max_tokens=60,
                    params={"capacity": 4})
        state, engines = build_state(ServeConfig(**(base | kw)))
        for s in state.services:
            s.start()
        made.append((state, engines))
        return TestClient(build_app(state)), state

    yield make
    for state, engines in made:
        for s in state.services:
            s.close(timeout=30)
        for e in engines:
            e.close()


def _chat(client, body: dict):
    return client.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": Q}]} | body)


def test_chat_answer_has_openai_shape_and_honest_usage(server):
    client, state = server()
    r = _chat(client, {"gambit": {"method": "sc", "n": 5}})
    assert r.status_code == 200, r.text
    b = r.json()
    assert b["object"] == "chat.completion" and b["model"] == "toy-policy"
    assert b["choices"][0]["message"]["role"] == "assistant"
    g, u = b["gambit"], b["usage"]
    assert g["method"] == "sc" and g["tree_stats"]["completions"] == 5
    assert u["traces_completed"] == 5 and sum(v["count"] for v in g["votes"]) <= 5
    # the unique tokens of the search, and the prompt the engine was given
    assert u["completion_tokens"] == g["tree_stats"]["unique_tokens"] > 0
    assert u["prompt_tokens"] == len(state.prompt_ids(Q))
    assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"]
    # the message is one of the completed traces' texts (the best voter's)
    assert b["choices"][0]["message"]["content"].strip()


def test_completions_endpoint_and_method_parameters(server):
    client, _ = server()
    r = client.post("/v1/completions", json={"prompt": Q, "max_tokens": 40,
                                             "gambit": {"method": "gambit", "n": 8,
                                                        "capacity": 4, "swap": 1}})
    assert r.status_code == 200, r.text
    b = r.json()
    assert b["object"] == "text_completion" and b["choices"][0]["text"]
    assert b["gambit"]["method"] == "gambit" and b["usage"]["traces_completed"] == 8


def test_many_concurrent_requests_each_get_their_own_search(server):
    client, state = server(data_parallel_size=1)
    out: list = []

    def ask(i: int) -> None:
        out.append(_chat(client, {"gambit": {"method": "sc", "n": 3 + i % 3}}).json())

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(out) == 12 and len({b["id"] for b in out}) == 12
    assert sorted(b["usage"]["traces_completed"] for b in out) == sorted(3 + i % 3 for i in range(12))
    st = state.services[0].stats
    assert st.completed == 12 and st.traces == sum(3 + i % 3 for i in range(12))


def test_stream_sends_progress_then_the_message_and_done(server):
    client, _ = server()
    with client.stream("POST", "/v1/chat/completions", json={
            "messages": [{"role": "user", "content": Q}], "stream": True,
            "gambit": {"method": "sc", "n": 4}}) as r:
        assert r.status_code == 200
        lines = [ln for ln in r.iter_lines() if ln]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(ln[len("data: "):]) for ln in lines[:-1]]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    last = chunks[-1]
    assert last["choices"][0]["finish_reason"] == "stop" and last["choices"][0]["delta"]["content"]
    assert last["gambit"]["usage"]["traces_completed"] == 4


@pytest.mark.parametrize("body, status, fragment", [
    ({"gambit": {"method": "nope"}}, 400, "unknown method 'nope'"),
    ({"gambit": {"n": 0}}, 400, "gambit.n must be >= 1"),
    ({"gambit": {"method": "sc", "swap": 2}}, 400, "unknown parameters ['swap']"),
    ({"gambit": {"rule": "best"}}, 400, "gambit.rule must be one of"),
    ({"max_tokens": 100000}, 400, "exceeds the model's context"),
    ({"top_p": 0}, 400, "top_p in (0, 1]"),
    ({"messages": [{"role": "system", "content": "x"}]}, 400, "no user message"),
    ({"messages": [{"role": "user", "content": "   "}]}, 400, "the question is empty"),
    ({"messages": "nope"}, 400, "messages"),
])
def test_bad_input_is_a_400_with_an_openai_error_and_nothing_else_breaks(server, body, status,
                                                                         fragment):
    client, _ = server()
    r = client.post("/v1/chat/completions",
                    json={"messages": [{"role": "user", "content": Q}]} | body)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert fragment in err["message"] and err["type"] == "invalid_request_error"
    assert _chat(client, {"gambit": {"method": "sc", "n": 2}}).status_code == 200


def test_malformed_json_is_a_400(server):
    client, _ = server()
    r = client.post("/v1/chat/completions", content=b"{bad",
                    headers={"content-type": "application/json"})
    assert r.status_code == 400 and "JSON" in r.json()["error"]["message"]


def test_a_method_that_needs_a_scorer_is_refused_without_one(server):
    client, _ = server(scorer="none", method="sc")
    r = _chat(client, {"gambit": {"method": "bon"}})
    assert r.status_code == 400 and "needs a scorer" in r.json()["error"]["message"]


def test_health_models_and_metrics(server):
    client, _ = server()
    assert client.get("/health").json() == {"status": "ok"}
    assert client.get("/v1/models").json()["data"][0]["id"] == "toy-policy"
    _chat(client, {"gambit": {"method": "sc", "n": 3}})
    m = client.get("/metrics").text
    assert 'gambit_requests_total{outcome="completed",rank="0"} 1.0' in m
    assert 'gambit_traces_completed_total{rank="0"} 3.0' in m


# ----------------------------------------------------------------------------- the service


def _job(state, qid: str, method: str = "sc", n: int = 4):
    from gambit_search.serve.app import make_job
    from gambit_search.serve.protocol import CompletionRequest

    return make_job(state, Q, CompletionRequest(prompt=Q, gambit={"method": method, "n": n}), qid)


def test_a_cancelled_request_aborts_all_its_traces(server):
    """A client that disconnects: its question is stopped, its traces aborted, the engine
    runs nothing for it afterwards."""
    _, state = server(max_tokens=400)
    svc = state.services[0]
    eng = svc.engine
    seen = []

    def on_progress(p: dict) -> None:  # the driver's thread, mid-search: the client leaves
        seen.append(p["running"])
        svc.cancel("long")

    fut = svc.submit(_job(state, "long", n=8), on_progress)
    r = fut.result(timeout=30)
    assert seen and seen[0] > 0  # it was running when cancelled
    assert r["error"] == "cancelled"
    assert r["tree_stats"]["completions"] < 8  # it did not run to its budget
    assert not eng.has_unfinished()  # every trace of it was aborted
    assert svc.stats.cancelled == 1 and svc.in_flight() == 0


def test_a_request_not_admitted_in_time_is_rejected(server):
    from gambit_search.serve.service import NotAdmitted

    _, state = server(max_live=4, admit_timeout=0.05, max_tokens=400)
    svc = state.services[0]
    svc.progress_every_s = 0.0  # a slow engine: every step of the first search takes 20 ms
    first = svc.submit(_job(state, "a", n=4), lambda p: time.sleep(0.02))  # fills every slot
    second = svc.submit(_job(state, "b", n=4))  # waits, then times out
    with pytest.raises(NotAdmitted, match="not admitted"):
        second.result(timeout=30)
    assert first.result(timeout=30)["error"] is None
    assert svc.stats.rejected == 1


def test_requests_are_admitted_on_live_traces_by_default(server):
    """As in gambit-solve: the next request starts once the live traces leave room for its
    slots, not once the running requests' slots do, so the same searches take fewer engine
    steps (the fake engine's SC traces are the same either way: seeded per trace)."""
    steps, answers = {}, {}
    for live in (True, False):
        _, state = server(max_live=6, max_tokens=120, admit_on_live=live)
        svc = state.services[0]
        futs = [svc.submit(_job(state, f"q{i}", n=4)) for i in range(4)]
        res = [f.result(timeout=60) for f in futs]
        assert all(r["error"] is None for r in res)
        steps[live] = svc._driver.timing["steps"]
        answers[live] = [(r["answer"], r["unique_tokens"]) for r in res]
    assert answers[True] == answers[False]
    assert steps[True] < steps[False]
    assert ServeConfig().admit_on_live


def test_the_router_keeps_a_search_on_one_rank_and_picks_the_least_loaded(server):
    """Data parallelism on the fake engine: each request goes to the rank with the fewest
    promised slots, and every trace of its search runs on that rank's engine."""
    from gambit_search.serve.app import _pick_rank

    _, state = server(data_parallel_size=2, max_tokens=200)
    a, b = state.services
    started = {a.rank: 0, b.rank: 0}
    for svc in (a, b):  # count every trace and fork each engine is given
        for name in ("add_trace", "fork"):
            real = getattr(svc.engine, name)

            def counted(*args, _real=real, _rank=svc.rank, **kw):
                started[_rank] += 1
                return _real(*args, **kw)

            setattr(svc.engine, name, counted)
    assert _pick_rank(state.services) is a  # a tie: the first rank
    fa = a.submit(_job(state, "x", n=8))
    assert _pick_rank(state.services) is b  # a holds 8 slots now
    fb = b.submit(_job(state, "y", n=2))
    assert _pick_rank(state.services) is b  # 2 promised slots < 8
    ra, rb = fa.result(timeout=30), fb.result(timeout=30)
    # each engine ran exactly its own search's traces
    assert started[a.rank] == ra["tree_stats"]["started"] >= 8
    assert started[b.rank] == rb["tree_stats"]["started"] == 2
