"""Vote rules over a question's completed traces (equivalence bins, ``gambit_core.vote_bins.VoteBins``).

* ``plain``: one vote per completed trace with an answer.
* ``weighted``: each vote weighs the trace's final trace score (Gambit, STEP). A trace that
  was never scored weighs 0; when no vote weighs anything the plain vote decides.
* ``top1``: the answer of the highest-scored completed trace.
* ``lineage``: ``weighted`` with one vote per root lineage: each trace weighs its final score
  divided by the completed traces (with an answer) that descend from the same root, so a
  root's lineage weighs its traces' mean score however many copies the search forked of it.
  For methods whose traces never fork (SC, BoN, STEP, DeepConf) it is ``weighted``.

    from gambit_search.voting import vote, vote_table
    vote([(0, "42", 0.9), (1, "41", 0.2), (2, "41", 0.3)], "weighted")   # "42"
    vote([(0, "42", 0.6), (1, "42", 0.6), (2, "42", 0.6), (3, "41", 0.8)], "lineage",
         roots={1: 0, 2: 0})   # "41": nodes 1, 2 are forks of 0 ("weighted": "42")
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

from gambit_core.vote_bins import VoteBins

__all__ = ["RULES", "lineage_roots", "vote", "vote_table"]

RULES = ("weighted", "plain", "top1", "lineage")

Vote = tuple[int, str | None, float | None]
"""(node, answer or None, final trace score or None)."""


def _bins(votes: Sequence[Vote]) -> VoteBins:
    bins = VoteBins()
    for _, a, s in votes:
        if a is not None and a.strip():
            bins.add(a, 0.0 if s is None else float(s))
    return bins


def lineage_roots(nodes: Iterable[Mapping]) -> dict[int, int]:
    """Each forked node's root, from a tree's node records (``id``, ``parent``); a root maps
    to itself or is left out."""
    parent = {int(n["id"]): n["parent"] for n in nodes}
    roots: dict[int, int] = {}
    for i in parent:
        path = [i]
        while parent.get(path[-1]) is not None and path[-1] not in roots:
            path.append(int(parent[path[-1]]))
        top = roots.get(path[-1], path[-1])
        for j in path:
            roots[j] = top
    return roots


def vote(votes: Sequence[Vote], rule: str, roots: Mapping[int, int] | None = None
         ) -> str | None:
    """The answer ``rule`` picks (None when no completed trace has an answer); ``roots``:
    each forked node's root (:func:`lineage_roots`; for ``lineage``, a node left out is a
    root)."""
    if rule not in RULES:
        raise ValueError(f"unknown vote rule {rule!r}: choose one of {', '.join(RULES)}")
    answered = [v for v in votes if v[1] is not None and v[1].strip()]
    if not answered:
        return None
    if rule == "lineage":
        root = (roots or {}).get
        size = Counter(root(v[0], v[0]) for v in answered)
        answered = [(i, a, None if s is None else s / size[root(i, i)])
                    for i, a, s in answered]
        rule = "weighted"
    if rule == "top1":
        scored = [v for v in answered if v[2] is not None]
        if not scored:
            return vote(answered, "plain")
        return max(scored, key=lambda v: (v[2], -v[0]))[1]
    bins = _bins(answered)
    if rule == "weighted" and bins.total_weight > 0:
        return bins.winner()
    best = max(range(len(bins)), key=lambda i: (bins.bins()[i].count, -i))
    return bins.bins()[best].representative


def vote_table(votes: Sequence[Vote]) -> list[dict]:
    """Every answer bin: representative, count, summed score; heaviest count first."""
    rows = [{"answer": b.representative, "count": b.count, "weight": round(b.weight, 6)}
            for b in _bins(votes).bins()]
    return sorted(rows, key=lambda r: (-r["count"], -r["weight"]))
