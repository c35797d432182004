"""Re-vote a finished gambit-solve run's saved trees with another rule; no model is loaded.

    gambit-solve --rescore runs/solve-gambit --rule plain
"""

from __future__ import annotations

import json
from pathlib import Path

from gambit_core.errors import InputError
from gambit_core.grading import is_equivalent
from gambit_search.solve.outputs import read_results, safe_name
from gambit_search.voting import RULES, lineage_roots, vote


def tree_votes(nodes: list[dict]) -> list[tuple[int, str | None, float | None]]:
    """(node, answer, weight) of every voter of a saved tree. A policy whose votes differ
    from "every completed node, final score" (DeepConf) says so per node: ``votes`` (bool)
    and ``vote_weight``."""
    return [(n["id"], n["answer"], n["vote_weight"] if "vote_weight" in n
             else n["scores"][-1][1] if n["scores"] else None)
            for n in nodes if n.get("votes", n["state"] == "completed")]


def rescore(run_dir: str, rule: str) -> dict:
    """Re-vote a finished run's saved traces with ``rule``; no model is loaded."""
    if rule not in RULES:
        raise InputError(f"--rule must be one of {', '.join(RULES)}, got {rule!r}")
    out = Path(run_dir)
    rows = read_results(out)
    if not rows:
        raise InputError(f"{run_dir}: no results.jsonl with results to rescore")
    right = graded = changed = comps = started = 0
    for r in rows:
        comps += r.get("tree_stats", {}).get("completions", 0)
        started += r.get("tree_stats", {}).get("started", 0)
        path = out / "trees" / f"{safe_name(r['id'])}.json"
        if not path.exists():
            raise InputError(f"{path} is missing: cannot rescore {r['id']!r}")
        nodes = json.loads(path.read_text())["nodes"]
        a = vote(tree_votes(nodes), rule, lineage_roots(nodes))
        changed += a != r.get("answer")
        if r.get("gold"):
            graded += 1
            right += a is not None and is_equivalent(r["gold"], a)
    return {"run": run_dir, "rule": rule, "questions": len(rows), "graded": graded,
            "accuracy": right / graded if graded else None, "answers_changed": changed,
            "completions_per_question": comps / len(rows),
            "started_per_question": started / len(rows)}
