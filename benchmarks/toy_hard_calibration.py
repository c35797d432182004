"""Calibration metrics of a gambit-solve run of SC and best-of-N (made for ``toy-hard``).

Reads run directories written by ``gambit-solve --method sc,bon --out DIR`` (``DIR/sc`` and
``DIR/bon``, or a single method's directory holding ``results.jsonl`` and ``trees/``) and
reports, per method run:

* ``accuracy`` (the method's own answer), ``accuracy_weighted`` / ``_plain`` / ``_top1``
  (the three vote rules gambit-solve records per question);
* ``per_trace_accuracy``: mean over questions of the share of completed traces whose
  answer is right; ``pass_at_n``: share of questions with at least one right trace;
* ``within_question_auroc``: per question, the ROC AUC of the completed traces' final
  scores (last entry of a node's ``scores``) against correctness, averaged over the
  questions that have both right and wrong scored traces (``auroc_questions`` of them);
  ``pooled_auroc`` over all scored traces for reference. Only runs whose traces carry
  scores (bon, gambit) get these.

``--pool`` adds the same metrics over all given runs of each method (e.g. two runs over
disjoint question ranges); ``--by-prefix`` adds them per question-id prefix (the strata of a
hand-made JSONL such as ``explore-h4-<i>``). ``stderr`` holds the binomial standard error
of each question-level accuracy.

Answers are graded against each row's ``gold`` with ``gambit_core.grading.is_equivalent``.

Run::

    .venv/bin/gambit-solve --dataset toy-hard:val:60 --n 64 --method sc,bon --kv-cache 0.02 \\
        --max-live 64 --out runs/toyhard-cal
    .venv/bin/python benchmarks/toy_hard_calibration.py runs/toyhard-cal \\
        --out docs/results/toy_hard_calibration/toy-hard_val60.json
    .venv/bin/python benchmarks/toy_hard_calibration.py runs/a runs/b --pool   # several runs

The numbers and the commands behind docs/results/toy_hard_calibration/: docs/TOY_WORLD.md
("toy-hard").
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable, Iterable
from functools import cache
from pathlib import Path
from typing import Any

from sklearn.metrics import roc_auc_score

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from gambit_core.grading import is_equivalent  # noqa: E402
from gambit_search.solve import read_results  # noqa: E402


@cache
def _right(gold: str, answer: str | None) -> bool:
    return answer is not None and bool(is_equivalent(gold, answer))


def method_dirs(path: Path) -> list[Path]:
    """The method run directories under ``path`` (itself when it holds a results.jsonl)."""
    if (path / "results.jsonl").exists():
        return [path]
    subs = sorted(p for p in path.iterdir() if p.is_dir() and (p / "results.jsonl").exists())
    if not subs:
        raise SystemExit(f"{path}: no results.jsonl in it or in a subdirectory")
    return subs


def completed_traces(tree: dict[str, Any]) -> list[tuple[str | None, float | None]]:
    """(answer, final score or None) of every completed node of a saved tree."""
    return [
        (n.get("answer"), n["scores"][-1][1] if n.get("scores") else None)
        for n in tree["nodes"]
        if n["state"] == "completed"
    ]


def load_trees(run: Path) -> dict[str, dict[str, Any]]:
    """Every saved tree of a run, keyed by question id."""
    trees = (json.loads(p.read_text()) for p in sorted((run / "trees").glob("*.json")))
    return {t["id"]: t for t in trees}


def _mean(xs: Iterable[float]) -> float | None:
    xs = list(xs)
    return statistics.fmean(xs) if xs else None


def question_metrics(
    rows: list[dict[str, Any]],
    trees: dict[str, dict[str, Any]],
    right: Callable[[str, str | None], bool] = _right,
) -> dict[str, Any]:
    """The metrics (see the module docstring) over graded result rows and their trees."""
    trace_acc: list[float] = []
    passed: list[bool] = []
    n_traces: list[int] = []
    aurocs: list[float] = []
    pooled_y: list[int] = []
    pooled_s: list[float] = []
    for r in rows:
        if r["id"] not in trees:
            raise SystemExit(f"no tree for question {r['id']!r} in trees/")
        traces = completed_traces(trees[r["id"]])
        ok = [right(r["gold"], a) for a, _ in traces]
        n_traces.append(len(ok))
        if ok:
            trace_acc.append(sum(ok) / len(ok))
        passed.append(any(ok))
        scored = [(int(y), s) for y, (_, s) in zip(ok, traces, strict=True) if s is not None]
        pooled_y += [y for y, _ in scored]
        pooled_s += [s for _, s in scored]
        if len({y for y, _ in scored}) == 2:
            aurocs.append(float(roc_auc_score([y for y, _ in scored], [s for _, s in scored])))

    def acc(key: str) -> float | None:
        vals = [bool(r[key]) for r in rows if key in r]
        return sum(vals) / len(vals) if vals else None

    out: dict[str, Any] = {
        "questions": len(rows),
        "accuracy": acc("correct"),
        "accuracy_weighted": acc("correct_weighted"),
        "accuracy_plain": acc("correct_plain"),
        "accuracy_top1": acc("correct_top1"),
        "per_trace_accuracy": _mean(trace_acc),
        "pass_at_n": sum(passed) / len(passed),
        "completed_traces_per_question": _mean(n_traces),
        "within_question_auroc": _mean(aurocs),
        "within_question_auroc_sd": statistics.stdev(aurocs) if len(aurocs) > 1 else None,
        "auroc_questions": len(aurocs),
        "pooled_auroc": (
            float(roc_auc_score(pooled_y, pooled_s)) if len(set(pooled_y)) == 2 else None
        ),
    }
    # binomial standard error of each question-level accuracy
    out["stderr"] = {
        k: (v * (1 - v) / len(rows)) ** 0.5
        for k, v in out.items()
        if k.startswith("accuracy") or k == "pass_at_n"
        if v is not None
    }
    return out


def run_metrics(
    run: Path,
    by_prefix: bool = False,
    right: Callable[[str, str | None], bool] = _right,
) -> dict[str, Any]:
    """The metrics of one method's run directory; with ``by_prefix`` also per question-id
    prefix (the id without its last ``-<index>``: strata of a hand-made JSONL)."""
    rows = [r for r in read_results(run) if r.get("gold") and not r.get("error")]
    if not rows:
        raise SystemExit(f"{run}: no graded, error-free rows in results.jsonl")
    path = run / "run_config.json"
    cfg = json.loads(path.read_text()) if path.exists() else {}
    trees = load_trees(run)
    out = {
        "run": str(run),
        "method": cfg.get("method", run.name),
        "dataset": cfg.get("dataset"),
        "n": cfg.get("n"),
        **question_metrics(rows, trees, right),
    }
    if by_prefix:
        groups: dict[str, list[dict[str, Any]]] = {}
        for r in rows:
            groups.setdefault(r["id"].rsplit("-", 1)[0], []).append(r)
        out["groups"] = {k: question_metrics(v, trees, right) for k, v in sorted(groups.items())}
    return out


def pooled_metrics(runs: list[Path]) -> dict[str, Any]:
    """The metrics over the questions of several runs of one method (distinct question ids)."""
    rows: list[dict[str, Any]] = []
    trees: dict[str, dict[str, Any]] = {}
    for run in runs:
        rows += [r for r in read_results(run) if r.get("gold") and not r.get("error")]
        trees |= load_trees(run)
    ids = [r["id"] for r in rows]
    if len(set(ids)) != len(ids):
        raise SystemExit(f"cannot pool {', '.join(map(str, runs))}: a question id repeats")
    return {"runs": [str(r) for r in runs], **question_metrics(rows, trees)}


def calibrate(paths: list[Path], by_prefix: bool = False, pool: bool = False) -> dict[str, Any]:
    """Metrics of every method run under ``paths``, keyed ``<dir>/<method>``; with ``pool``
    also ``pooled/<method>`` over all the runs of each method."""
    out: dict[str, Any] = {}
    by_method: dict[str, list[Path]] = {}
    for p in paths:
        for run in method_dirs(p):
            m = run_metrics(run, by_prefix)
            out[f"{p.name}/{m['method']}" if run != p else p.name] = m
            by_method.setdefault(m["method"], []).append(run)
    if pool:
        for method, runs in by_method.items():
            out[f"pooled/{method}"] = {"method": method, **pooled_metrics(runs)}
    return out


def _fmt(x: Any) -> str:
    return "-" if x is None else f"{x:.3f}" if isinstance(x, float) else str(x)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="+", type=Path, help="gambit-solve --out directories")
    ap.add_argument("--out", type=Path, help="write the metrics as JSON here too")
    ap.add_argument("--by-prefix", action="store_true", help="also per question-id prefix (strata)")
    ap.add_argument("--pool", action="store_true", help="also pool the runs of each method")
    a = ap.parse_args(argv)
    res = calibrate(a.runs, a.by_prefix, a.pool)
    cols = (
        "questions",
        "accuracy",
        "accuracy_weighted",
        "accuracy_plain",
        "accuracy_top1",
        "per_trace_accuracy",
        "pass_at_n",
        "within_question_auroc",
        "auroc_questions",
    )
    print("run".ljust(28) + "".join(c.replace("accuracy", "acc")[:14].rjust(15) for c in cols))
    for k, m in res.items():
        print(k.ljust(28) + "".join(_fmt(m[c]).rjust(15) for c in cols))
        for g, gm in m.get("groups", {}).items():
            print(f"  {g}"[:28].ljust(28) + "".join(_fmt(gm[c]).rjust(15) for c in cols))
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(res, indent=2) + "\n")
        print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
