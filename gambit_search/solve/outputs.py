"""gambit-solve's output directory: results as they finish, trees, the summary, and resume.

``results.jsonl`` (one line per question, fsynced as each finishes), ``trees/<question>.json``
(written before its result line: a line means done), ``results.json`` (the summary) and
``run_config.json`` (the fingerprint a rerun into the same directory must match).
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

from gambit_core.runio import append_jsonl, atomic_write, claim_dir, read_jsonl, versions


def safe_name(qid: str) -> str:
    """A file name for a question id (an id that needs changing gets a short hash)."""
    s = re.sub(r"[^\w.-]", "_", qid)[:100]
    if s != qid:
        s += "-" + hashlib.blake2b(qid.encode(), digest_size=4).hexdigest()
    return s


def read_results(out: Path) -> list[dict]:
    """Every complete line of ``results.jsonl`` (a line cut by a crash is ignored)."""
    return read_jsonl(Path(out) / "results.jsonl")


def prepare_out(out: Path, want: dict, defaults: dict) -> set[str]:
    """Create or check ``out`` against the fingerprint ``want``; returns the ids of the
    questions already done there."""
    claim_dir(out, "run_config.json", want, defaults=defaults)
    (out / "trees").mkdir(exist_ok=True)
    # a crash may have cut the last line: rewrite the file with complete lines only
    rows = read_results(out)
    res = out / "results.jsonl"
    if res.exists():
        atomic_write(res, "".join(json.dumps(r) + "\n" for r in rows))
    return {r["id"] for r in rows}


def add_diagnostics(r: dict) -> dict:
    """``r`` with its ``diagnostics`` (coverage, correct and distinct answers, inherited
    share, fork depth: :mod:`gambit_search.diagnostics`) from its ``tree``, in place."""
    from gambit_search.diagnostics import question_diagnostics

    if "tree" in r and "diagnostics" not in r:
        r["diagnostics"] = question_diagnostics(r["tree"], r.get("gold")).to_json()
    return r


def fill_diagnostics(out: Path, rows: list[dict]) -> list[dict]:
    """``rows`` with ``diagnostics`` computed from ``out/trees`` where a row lacks it (a run
    written before diagnostics existed); a row whose tree is missing is left as it is."""
    from gambit_search.diagnostics import question_diagnostics

    filled = []
    for r in rows:
        path = Path(out) / "trees" / f"{safe_name(str(r['id']))}.json"
        if not r.get("diagnostics") and path.is_file():
            d = question_diagnostics(json.loads(path.read_text())["nodes"], r.get("gold"))
            r = dict(r, diagnostics=d.to_json())
        filled.append(r)
    return filled


def write_result(out: Path, r: dict) -> None:
    """Tree first, then the result line (fsynced, with its ``diagnostics``): a line in
    results.jsonl means done."""
    add_diagnostics(r)
    tree = {"id": r["id"], "method": r["method"], "nodes": r.pop("tree"),
            "rounds": r.pop("rounds", [])}
    atomic_write(out / "trees" / f"{safe_name(r['id'])}.json", json.dumps(tree))
    append_jsonl(out / "results.jsonl", r)


def summarize(rows: list[dict], cfg: dict, extra: dict | None = None) -> dict:
    """The run summary over result rows (``diagnostics``: their pooled
    :meth:`~gambit_search.diagnostics.Totals.means`)."""
    from gambit_search.diagnostics import Totals, row_diagnostics

    n = len(rows)
    graded = [r for r in rows if r.get("gold")]

    def acc(key: str) -> float | None:
        return (sum(bool(r.get(key)) for r in graded) / len(graded)) if graded else None

    tokens = sum(r.get("unique_tokens", 0) for r in rows)
    comps = sum(r.get("tree_stats", {}).get("completions", 0) for r in rows)
    started = sum(r.get("tree_stats", {}).get("started", 0) for r in rows)
    return {
        "questions": n, "graded": len(graded), "failed": sum(1 for r in rows if r.get("error")),
        "accuracy": acc("correct"), "accuracy_weighted": acc("correct_weighted"),
        "accuracy_plain": acc("correct_plain"), "accuracy_top1": acc("correct_top1"),
        "accuracy_lineage": acc("correct_lineage"),
        "unique_tokens": tokens, "unique_tokens_per_question": tokens / n if n else 0,
        "completions": comps, "completions_per_question": comps / n if n else 0,
        "started_per_question": started / n if n else 0,
        "diagnostics": Totals.of(row_diagnostics(r) for r in rows).means(), "config": cfg,
        "versions": versions(), "seed": cfg.get("seed"), **(extra or {}),
    }
