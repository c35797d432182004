"""Re-vote finished Gambit runs with candidate vote rules, from their saved trees (no engine):
how many questions each rule gets right, beside the four shipped rules.

    python docs/results/issue29/revote_rules.py RUN [RUN ...]     # RUN: a method's seed folder
    python docs/results/issue29/revote_rules.py --fails RUN       # and each lineage vote it lost

A RUN folder holds ``results.jsonl`` and ``trees/`` (gambit-bench writes
``<out>/runs/<dataset>/<method>/seed<k>/``). The candidates all reuse
:func:`gambit_search.voting.vote`'s score-weighted vote, on re-weighted votes:

* ``lineage^p``: each completion weighs score / (its root lineage's completions)^p: p = 1 is
  the shipped ``lineage`` rule, p = 0 ``weighted``;
* ``root-max``: one vote per (root lineage, answer), weighing that pair's best score;
* ``root-mean``: one vote per (root lineage, answer), weighing that pair's mean score;
* ``lineage-min``: ``lineage`` on each completion's lowest boundary score instead of its last.
"""

from __future__ import annotations

import json
import sys
from collections import Counter, defaultdict
from pathlib import Path

from gambit_core.grading import is_equivalent
from gambit_search.voting import RULES, lineage_roots, vote


def questions(run: Path) -> list[dict]:
    """Per question: its gold, stored result and completed answered traces (node, answer,
    last score, lowest score, root)."""
    out = []
    for line in (run / "results.jsonl").read_text().splitlines():
        r = json.loads(line)
        nodes = json.loads((run / "trees" / f"{r['id']}.json").read_text())["nodes"]
        roots = lineage_roots(nodes)
        done = [dict(id=n["id"], a=n["answer"], s=n["scores"][-1][1] if n["scores"] else None,
                     lo=min(s for _, s in n["scores"]) if n["scores"] else None,
                     root=roots.get(n["id"], n["id"]))
                for n in nodes if n["state"] == "completed" and (n["answer"] or "").strip()]
        out.append(dict(gold=r["gold"], result=r, done=done, roots=roots))
    return out


def _per_pair(done: list[dict], agg) -> list[tuple[int, str, float]]:
    pairs: dict[tuple[int, str], list[float]] = defaultdict(list)
    for d in done:
        pairs[(d["root"], d["a"].strip())].append(d["s"] or 0.0)
    return [(i, a, agg(s)) for i, ((_, a), s) in enumerate(pairs.items())]


def candidates(q: dict) -> dict[str, str | None]:
    done, roots = q["done"], q["roots"]
    v = [(d["id"], d["a"], d["s"]) for d in done]
    size = Counter(d["root"] for d in done)
    picks = {rule: vote(v, rule, roots=roots) for rule in RULES}
    for p in (0.5, 0.75):
        picks[f"lineage^{p}"] = vote([(d["id"], d["a"], (d["s"] or 0.0) / size[d["root"]] ** p)
                                      for d in done], "weighted")
    picks["root-max"] = vote(_per_pair(done, max), "weighted")
    picks["root-mean"] = vote(_per_pair(done, lambda s: sum(s) / len(s)), "weighted")
    picks["lineage-min"] = vote([(d["id"], d["a"], d["lo"]) for d in done], "lineage",
                                roots=roots)
    return picks


def _right(gold: str, answer: str | None) -> bool:
    return answer is not None and is_equivalent(gold, answer)


if __name__ == "__main__":
    args = sys.argv[1:]
    fails = "--fails" in args
    for run in (Path(a) for a in args if a != "--fails"):
        qs = questions(run)
        counts: Counter = Counter()
        for q in qs:
            picks = candidates(q)
            counts.update(k for k, a in picks.items() if _right(q["gold"], a))
            if fails and not q["result"]["correct_lineage"]:
                by = defaultdict(Counter)
                for d in q["done"]:
                    by[d["root"]][d["a"]] += 1
                print(f"  {q['result']['id']} gold {q['gold']}: lineage picked {picks['lineage']}; "
                      + "; ".join(f"root {r}: {dict(c)}" for r, c in by.items()))
        stored = sum(q["result"]["correct_lineage"] for q in qs)
        assert counts["lineage"] == stored, (run, counts["lineage"], stored)
        print(f"{run}: {len(qs)} questions, covered {sum(any(_right(q['gold'], d['a']) for d in q['done']) for q in qs)}")
        print("  " + "  ".join(f"{k} {counts[k]}" for k in
                               [*RULES, "lineage^0.5", "lineage^0.75", "root-max", "root-mean",
                                "lineage-min"]))
