"""Search diagnostics (gambit_search.diagnostics) on a hand-built tree, pooled, and as they
reach results.jsonl, the run summary and gambit-bench's table on the fake engine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gambit_search.diagnostics import (
    QuestionDiagnostics,
    Totals,
    completion_correct,
    question_diagnostics,
    row_diagnostics,
)


def _node(i, parent, depth, state, inherited, generated, answer=None) -> dict:
    return {"id": i, "parent": parent, "depth": depth, "state": state, "inherited": inherited,
            "generated": generated, "answer": answer}


# root 0 (right) -> 2 (right) -> 3 (wrong) -> 6 (wrong, " 46 ": the same answer as 3) -> 4
# (stopped, depth 4: not a completion); root 1 pruned; root 5 completed without an answer.
TREE = [
    _node(0, None, 0, "completed", 0, 100, "36"),
    _node(1, None, 0, "pruned", 0, 40),
    _node(2, 0, 1, "completed", 60, 40, "36"),
    _node(3, 2, 2, "completed", 80, 20, "46"),
    _node(4, 6, 4, "stopped", 110, 5),
    _node(5, None, 0, "completed", 0, 120, None),
    _node(6, 3, 3, "completed", 90, 30, " 46 "),
]


def test_a_hand_built_tree():
    d = question_diagnostics(TREE, "36")
    assert d.completions == 5  # 0, 2, 3, 5, 6: not the pruned 1 nor the stopped 4
    assert d.correct == 2 and d.covered is True
    assert d.distinct_answers == 2  # "36", "46" (" 46 " is "46"; no answer is none)
    assert d.forked == 3  # 2, 3, 6
    # inherited / (inherited + own): 60/100, 80/100, 90/120 (inherited/own would be
    # 1.5, 4, 3; a share of the parent's length instead would differ too)
    assert d.inherited_share == pytest.approx((0.6 + 0.8 + 0.75) / 3)
    assert d.depth_mean == pytest.approx((0 + 1 + 2 + 0 + 3) / 5)
    assert d.depth_max == 3  # the stopped node 4 at depth 4 is no completion
    assert completion_correct(TREE, "36") == {0: True, 2: True, 3: False, 5: False, 6: False}


def test_ungraded_uncovered_and_empty():
    d = question_diagnostics(TREE, None)
    assert d.correct is None and d.covered is None and d.completions == 5
    wrong = question_diagnostics(TREE, "99")
    assert wrong.correct == 0 and wrong.covered is False
    roots = question_diagnostics([_node(0, None, 0, "completed", 0, 9, "1")], "1")
    assert roots.forked == 0 and roots.inherited_share is None and roots.depth_max == 0
    none = question_diagnostics([_node(0, None, 0, "pruned", 0, 9)], "1")
    assert none.completions == 0 and none.depth_mean is None and none.covered is False


def test_totals_pool_by_completion_not_by_question():
    a = question_diagnostics(TREE, "36")  # covered, 3 forks of share 0.7167, depth sum 6 / 5
    b = question_diagnostics(TREE[:1] + [_node(7, 0, 1, "completed", 10, 90, "5")], "5")
    c = question_diagnostics(TREE, None)  # ungraded: not in coverage nor correct / q
    t = Totals.of([a, b, c, None])
    assert (t.questions, t.graded, t.covered, t.correct) == (3, 2, 2, 3)
    m = t.means()
    assert m["coverage"] == 1.0
    assert m["correct_per_question"] == pytest.approx(3 / 2)
    assert m["distinct_per_question"] == pytest.approx((2 + 2 + 2) / 3)
    # 7 forks: 3 of a, 1 of b (0.1), 3 of c; a mean of per-question means would be different
    assert m["inherited_share"] == pytest.approx((2 * (0.6 + 0.8 + 0.75) + 0.1) / 7)
    assert m["fork_depth_mean"] == pytest.approx((6 + 1 + 6) / (5 + 2 + 5))
    assert m["fork_depth_max"] == 3
    # sums add (seeds pool), and survive JSON
    both = Totals.from_json(json.loads(json.dumps(t.to_json()))) + Totals.of([b])
    assert both.questions == 4 and both.covered == 3 and both.forked == 8
    assert Totals().means()["coverage"] is None


def test_row_diagnostics_prefers_the_written_ones():
    d = question_diagnostics(TREE, "36")
    assert row_diagnostics({"diagnostics": d.to_json(), "tree": []}) == d
    assert row_diagnostics({"gold": "36", "tree": TREE}) == d
    assert row_diagnostics({"gold": "36"}) is None
    assert QuestionDiagnostics.from_json(d.to_json()) == d


def test_results_rows_summary_and_bench_agree(tmp_path, fake_scorer):
    """On the fake engine: every results.jsonl row's diagnostics equal a recount from its
    saved tree; the summary and the gambit-bench row pool them (over completions). The fake
    engine's traces carry no answer, so correctness is the hand-built tree's test above."""
    from gambit_search.bench import BenchConfig, bench
    from gambit_search.solve.outputs import safe_name

    res = bench(BenchConfig(out=str(tmp_path / "b"), engine="fake", methods="sc,gambit",
                            datasets="toy:val:4", n="6", scorer=fake_scorer),
                {"gambit": {"interval": 3, "warmup": 4}}, progress=False, figures=False)
    for run in res["runs"]:
        rows = [json.loads(x) for x in Path(run["dir"], "results.jsonl").read_text().splitlines()]
        shares, depths = [], []
        for r in rows:
            nodes = json.loads(Path(run["dir"], "trees", f"{safe_name(r['id'])}.json")
                               .read_text())["nodes"]
            done = [n for n in nodes if n["state"] == "completed"]
            forks = [n for n in done if n["parent"] is not None]
            shares += [n["inherited"] / (n["inherited"] + n["generated"]) for n in forks]
            depths += [n["depth"] for n in done]
            assert r["diagnostics"]["completions"] == len(done) == r["tree_stats"]["completions"]
            assert r["diagnostics"]["forked"] == len(forks)
            assert r["diagnostics"]["correct"] == 0 and r["diagnostics"]["covered"] is False
        summary = json.loads(Path(run["dir"], "results.json").read_text())
        diag = summary["diagnostics"]
        assert diag["coverage"] == 0.0
        assert diag["fork_depth_mean"] == pytest.approx(sum(depths) / len(depths))
        assert diag["fork_depth_max"] == max(depths)
        row = next(t for t in res["table"] if t["method"] == run["method"])
        for k in ("coverage", "correct_per_question", "distinct_per_question",
                  "inherited_share", "fork_depth_mean", "fork_depth_max"):
            assert row[k] == pytest.approx(diag[k]) if diag[k] is not None else row[k] is None
        if run["method"] == "sc":  # SC never forks
            assert not shares and diag["inherited_share"] is None and max(depths) == 0
        else:
            assert max(depths) >= 1 and diag["inherited_share"] == pytest.approx(
                sum(shares) / len(shares))
