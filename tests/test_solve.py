"""gambit-solve on the scripted fake engine: outputs, resume, rescore, and what a user sees
for bad input (the command's stderr)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gambit_search.solve import SolveConfig, SolveInputError, make_config, rescore, solve

REPO = Path(__file__).resolve().parents[1]



def _cfg(tmp_path: Path, scorer: str, **kw) -> SolveConfig:
    base = dict(engine="fake", dataset="toy:val:6", n=6, swap=2, interval=2, warmup=4,
                scorer=scorer, out=str(tmp_path / "run"), max_tokens=60)
    return make_config(**(base | kw))


def test_dataset_run_writes_results_trees_and_summary(tmp_path, fake_scorer):
    s = solve(_cfg(tmp_path, fake_scorer), progress=False)
    out = tmp_path / "run"
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert len(rows) == 6 == s["questions"]
    for r in rows:
        assert {"answer_weighted", "answer_plain", "votes", "unique_tokens", "wall_s",
                "tree_stats", "correct"} <= set(r)
        tree = json.loads((out / "trees" / f"{r['id']}.json").read_text())
        assert len(tree["nodes"]) == r["tree_stats"]["nodes"]
        assert sum(n["generated"] for n in tree["nodes"]) == r["unique_tokens"]
        assert r["tree_stats"]["branches"] > 0
    summary = json.loads((out / "results.json").read_text())
    assert summary["config"]["method"] == "gambit" and "versions" in summary
    assert summary["unique_tokens"] == sum(r["unique_tokens"] for r in rows)


def test_rerun_skips_finished_questions_and_other_config_is_refused(tmp_path, fake_scorer):
    cfg = _cfg(tmp_path, fake_scorer, max_questions=3)
    first = solve(cfg, progress=False)
    assert len(first["results"]) == 3
    # a crash cut the last line: that question is redone, the others are not
    res = tmp_path / "run" / "results.jsonl"
    lines = res.read_text().splitlines()
    res.write_text("\n".join(lines[:2]) + "\n" + lines[2][:40])
    again = solve(cfg, progress=False)
    assert [r["id"] for r in again["results"]] == [json.loads(lines[2])["id"]]
    assert again["questions"] == 3
    with pytest.raises(SolveInputError, match="another config"):
        solve(_cfg(tmp_path, fake_scorer, max_questions=3, swap=1), progress=False)


def test_rescore_revotes_without_a_model(tmp_path, fake_scorer):
    solve(_cfg(tmp_path, fake_scorer), progress=False)
    rows = [json.loads(x) for x in (tmp_path / "run" / "results.jsonl").read_text().splitlines()]
    for rule, key in (("plain", "answer_plain"), ("weighted", "answer_weighted"),
                      ("top1", "answer_top1"), ("lineage", "answer_lineage")):
        r = rescore(str(tmp_path / "run"), rule)
        assert r["questions"] == 6
        want = sum(x[key] != x["answer"] for x in rows)
        assert r["answers_changed"] == want


def test_sc_votes_every_trace_once(tmp_path):
    s = solve(_cfg(tmp_path, "none", method="sc", n=5), progress=False)
    for r in s["results"]:
        assert r["tree_stats"]["completions"] == 5
        assert r["tree_stats"]["branches"] == 0
        nodes = json.loads((tmp_path / "run" / "trees" / f"{r['id']}.json").read_text())["nodes"]
        answered = [n for n in nodes if n["state"] == "completed" and n["answer"]]
        assert sum(v["count"] for v in r["votes"]) == len(answered)
        by_answer: dict = {}
        for n in answered:
            by_answer[n["answer"]] = by_answer.get(n["answer"], 0) + 1
        assert {v["answer"]: v["count"] for v in r["votes"]} == by_answer


def test_gambit_below_capacity_votes_on_exactly_n_and_reports_it(tmp_path, fake_scorer):
    s = solve(_cfg(tmp_path, fake_scorer, n=9, capacity=4, swap=2), progress=False)
    assert s["completions_per_question"] == 9
    assert s["started_per_question"] >= 9
    for r in s["results"]:
        assert r["tree_stats"]["completions"] == 9 and r["tree_stats"]["end_reason"] == "budget"
        assert r["tree_stats"]["stopped"] == 0
    again = rescore(str(tmp_path / "run"), "plain")
    assert again["completions_per_question"] == 9
    assert again["started_per_question"] == s["started_per_question"]


def test_live_admission_fills_the_engine_and_leaves_sc_unchanged(tmp_path):
    """--admit-on-live (the default) admits the next question as soon as the live traces
    leave room for its slots, so SC's run takes fewer engine steps at the same max_live; on
    the fake engine every SC trace is the same either way (seeded per trace)."""
    kw = dict(method="sc", n=4, max_live=8, dataset="toy:val:8")
    live = solve(_cfg(tmp_path / "a", "none", **kw), progress=False)
    slots = solve(_cfg(tmp_path / "b", "none", admit_on_live=False, **kw), progress=False)
    keys = ("id", "answer", "answer_plain", "unique_tokens", "votes")
    assert ([{k: r[k] for k in keys} for r in live["results"]]
            == [{k: r[k] for k in keys} for r in slots["results"]])
    assert live["timing"]["steps"] < slots["timing"]["steps"]
    assert SolveConfig().admit_on_live  # the setting the H200 tables measured


def test_a_queue_keeps_the_engine_full_and_leaves_sc_unchanged(tmp_path, fake_scorer):
    """--queue K admits K traces beyond max_live (vLLM's max_num_seqs) to wait in the
    engine's queue: SC's traces are the same, its run takes fewer engine steps (a finished
    trace's place is taken at once), and Gambit still votes on exactly n per question."""
    kw = dict(method="sc", n=4, max_live=8, dataset="toy:val:8")
    queued = solve(_cfg(tmp_path / "a", "none", queue=4, **kw), progress=False)
    plain = solve(_cfg(tmp_path / "b", "none", **kw), progress=False)
    keys = ("id", "answer", "answer_plain", "unique_tokens", "votes")
    assert (sorted([{k: r[k] for k in keys} for r in queued["results"]], key=str)
            == sorted([{k: r[k] for k in keys} for r in plain["results"]], key=str))
    assert queued["timing"]["steps"] < plain["timing"]["steps"]
    g = solve(_cfg(tmp_path / "c", fake_scorer, queue=6, max_live=6, dataset="toy:val:4"),
              progress=False)
    assert g["completions_per_question"] == 6
    assert all(r["tree_stats"]["completions"] == 6 for r in g["results"])


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gambit_search.solve", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=120)


def test_help_imports_nothing_heavy():
    p = _cli("--help")
    assert p.returncode == 0 and "--swap" in p.stdout and "[paper 16]" in p.stdout
    code = ("import sys; from gambit_search.solve import main\n"
            "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
            "bad = [m for m in ('vllm', 'torch', 'transformers') if m in sys.modules]\n"
            "print('HEAVY', bad)")
    q = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert "HEAVY []" in q.stdout, q.stdout


def test_a_failing_question_is_recorded_and_the_others_go_on(tmp_path, fake_scorer):
    """A question too long for the context (every trace errors) gets an error row; the rest
    are solved. (A blank question in a file is refused up front by the loader, with its line;
    one handed to the driver directly is recorded: see the next test.)"""
    ds = tmp_path / "qs.jsonl"
    rows = [{"question": "Start 3. Ops: +1. Mod 100.", "answer": "4"},
            {"question": "x" * 600, "answer": "2"},  # > the fake engine's 512-token context
            {"question": "Start 5. Ops: +2. Mod 100.", "answer": "7"}]
    ds.write_text("".join(json.dumps(r) + "\n" for r in rows))
    s = solve(_cfg(tmp_path, fake_scorer, dataset=str(ds)), progress=False)
    by_q = {r["question"]: r for r in s["results"]}
    assert len(by_q) == 3 and s["failed"] == 1
    assert by_q["x" * 600]["error"].startswith("all traces errored: prompt of")
    ok = [r for r in s["results"] if not r["error"]]
    assert len(ok) == 2 and all(r["tree_stats"]["completions"] >= 6 for r in ok)  # drain: more


def test_driver_records_an_empty_question():
    from gambit_core.questions import Question
    from gambit_search.driver import Driver
    from gambit_search.engine import SamplingSpec
    from gambit_search.fake_engine import FakeEngine
    from gambit_search.methods import get_method

    eng = FakeEngine()
    drv = Driver(eng, get_method("sc").bind(n=3), prompt_ids=lambda q: [1, 5, 6], decode=eng.decode,
                 spec=SamplingSpec(max_tokens=30))
    res = list(drv.run([Question("a", " ", "1", "t"), Question("b", "ok", "1", "t")]))
    assert [(r["id"], r["error"]) for r in res] == [("a", "empty question"), ("b", None)]


def test_one_question_prints_answer_votes_and_tree(fake_scorer):
    p = _cli("--engine", "fake", "--scorer", fake_scorer, "--n", "6", "--swap", "2",
             "--interval", "2", "--warmup", "4", "Start 3. Ops: +1. Mod 100.")
    assert p.returncode == 0, p.stderr
    assert "answer:" in p.stdout and "votes" in p.stdout
    assert re.search(r"tree: \d+ nodes, \d+ branches, \d+ pruned, \d+ ghosts, \d+ completed", p.stdout)


def test_dataset_summary_prints_the_search_diagnostics(tmp_path, fake_scorer):
    p = _cli("--engine", "fake", "--scorer", fake_scorer, "--method", "gambit,sc", "--n", "6",
             "--swap", "2", "--interval", "2", "--warmup", "4", "--dataset", "toy:val:3",
             "--out", str(tmp_path / "run"))
    assert p.returncode == 0, p.stderr
    assert "search diagnostics" in p.stdout
    for col in ("coverage", "correct/q", "distinct/q", "inherited", "depth mean", "depth max"):
        assert col in p.stdout, col
    gambit = next(line for line in p.stdout.splitlines()
                  if line.strip("│┃ ").startswith("gambit") and "%" in line
                  and line.count("%") == 2)  # the diagnostics row: coverage and inherited
    assert re.search(r"\d+\.\d%.*\d+\.\d\d.*\d+\.\d\d.*\d+\.\d%.*\d+\.\d\d\D+\d+", gambit), gambit
