"""The driver's result records: one dict per question, as :class:`~gambit_search.driver.Driver`
yields them (gambit-solve writes them as JSONL lines, gambit-serve returns them).

A finished question's record holds the answer under its vote rule and under each rule
(``weighted``, ``plain``, ``top1``, ``lineage``) with their grades against the gold answer, the vote
table, the policy's tree and stats, its prefix-cache counts and, with ``keep_texts``, the
completed traces' texts; a question that never ran (empty, cancelled before admission) gets
the short record of :func:`failed_result`::

    from gambit_search.driver_results import failed_result, question_result
    rec = question_result(st, "weighted", error=None)   # st: the driver's question in flight
    rec = failed_result(q, "sc", "empty question")
"""

from __future__ import annotations

import time
from typing import Any

from gambit_core.grading import is_equivalent
from gambit_search.voting import RULES, lineage_roots, vote, vote_table

__all__ = ["failed_result", "question_result"]


def failed_result(q: Any, method: str, why: str) -> dict:
    """The record of question ``q`` that method ``method`` never ran, for reason ``why``."""
    return {"id": str(q.id), "question": q.question, "gold": q.answer or None,
            "method": method, "answer": None, "correct": False if q.answer else None,
            "error": why, "unique_tokens": 0, "wall_s": 0.0, "votes": [], "tree_stats": {},
            "tree": []}


def question_result(st: Any, rule: str, error: str | None = None) -> dict:
    """The record of the question in flight ``st`` (the driver's ``_Q``: its question, policy,
    start time, errors, cache counts and texts), answered under vote rule ``rule``;
    ``error``: why it ended early (None: it ran to its end, and an error is only recorded
    when no trace completed)."""
    p = st.policy
    votes = p.votes()
    gold = st.q.answer or None
    tree = p.tree()
    roots = lineage_roots(tree)
    answers = {r: vote(votes, r, roots) for r in RULES}

    def ok(a: str | None) -> bool | None:
        if gold is None:
            return None
        return a is not None and is_equivalent(gold, a)

    stats = p.stats()
    lineages = [n["inherited"] + n["generated"] for n in tree if n["state"] == "completed"]
    stats["max_lineage"] = max(lineages, default=0)
    if error is not None:
        pass
    elif not votes:
        error = ("all traces errored: " + st.errors[0]) if st.errors else "no trace completed"
    return {
        "id": str(st.q.id), "question": st.q.question, "gold": gold,
        "method": st.bound.method.name, "rule": rule, "answer": answers[rule],
        "correct": ok(answers[rule]),
        "answer_weighted": answers["weighted"], "correct_weighted": ok(answers["weighted"]),
        "answer_plain": answers["plain"], "correct_plain": ok(answers["plain"]),
        "answer_top1": answers["top1"], "correct_top1": ok(answers["top1"]),
        "answer_lineage": answers["lineage"], "correct_lineage": ok(answers["lineage"]),
        "votes": vote_table(votes), "unique_tokens": stats["unique_tokens"],
        "wall_s": round(time.perf_counter() - st.t0, 3), "tree_stats": stats,
        "error": error, "prefix_cache": dict(st.cache), "tree": tree,
        "rounds": getattr(p, "round_log", []),
        **({"texts": dict(st.texts)} if st.texts is not None else {}),
    }
