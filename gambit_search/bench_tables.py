"""gambit-bench's tables: one run's metrics, runs pooled over seeds, and the Markdown table.

    from gambit_search.bench_tables import aggregate, markdown, run_metrics
    table = aggregate([run_metrics(summary, rows) | {"dataset": d, "method": m} ...])
    print(markdown(table))

A row is one (dataset, method, N). Its headline is the method's best vote rule at that N,
named; every rule, the budget voted on (completions and traces started per question),
tokens, throughput, latency against the no-queue ideal and the search diagnostics
(coverage, correct and distinct answers per question, inherited share, fork depth:
:mod:`gambit_search.diagnostics`) are in the row too.
"""

from __future__ import annotations

import math

from gambit_search.diagnostics import Totals, row_diagnostics
from gambit_search.voting import RULES

__all__ = ["aggregate", "markdown", "run_metrics", "wilson"]


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval of k successes in n."""
    if n == 0:
        return (math.nan, math.nan)
    p = k / n
    den = 1 + z * z / n
    mid = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    # exact at the ends (in floats mid + half can fall just short of 1 at k = n, leaving
    # the point outside its own interval)
    return (0.0 if k == 0 else max(0.0, mid - half), 1.0 if k == n else min(1.0, mid + half))


def run_metrics(summary: dict, rows: list[dict]) -> dict:
    """One run's metrics from its summary and result rows (``diagnostics``: the rows'
    :class:`~gambit_search.diagnostics.Totals`, sums that pool over seeds)."""
    tm = summary.get("timing") or {}
    steps = max(1, tm.get("steps", 0))
    step_s = tm.get("wall_s", 0.0) / steps
    lat = [r["wall_s"] for r in rows if not r.get("error")]
    ideal = [r["tree_stats"].get("max_lineage", 0) * step_s for r in rows if not r.get("error")]
    mem = summary.get("memory_log") or []
    n = (summary.get("config") or {}).get("n")
    done = [r.get("tree_stats", {}).get("completions", 0) for r in rows if not r.get("error")]
    started = [r.get("tree_stats", {}).get("started") for r in rows if not r.get("error")]
    return {
        "n": n, "questions": len(rows), "correct": sum(bool(r.get("correct")) for r in rows),
        **{f"correct_{rule}": sum(bool(r.get(f"correct_{rule}")) for r in rows)
           for rule in RULES},
        "started": sum(started) if started and None not in started else None,
        "preemptions": summary.get("preemptions"),
        "graded": sum(1 for r in rows if r.get("gold")),
        "unique_tokens": sum(r["unique_tokens"] for r in rows),
        "wall_s": summary.get("wall_s"), "completions_per_s": summary.get("completions_per_s"),
        "kv_mean": sum(m[3] for m in mem) / len(mem) if mem else None,
        "latency_s": sum(lat) / len(lat) if lat else None,
        "latency_vs_ideal": (sum(lat) / sum(ideal)) if ideal and sum(ideal) > 0 else None,
        # completed traces per question, and the questions that reached the budget N (a
        # question also ends when none of its traces runs: Gambit under heavy KV pressure)
        "completions": sum(done),
        "budget_reached": sum(c >= n for c in done) if n else None,
        "accuracy_weighted": summary.get("accuracy_weighted"),
        "accuracy_plain": summary.get("accuracy_plain"), "accuracy_top1": summary.get("accuracy_top1"),
        "accuracy_lineage": summary.get("accuracy_lineage"),
        "diagnostics": Totals.of(row_diagnostics(r) for r in rows).to_json(),
    }


def aggregate(per_run: list[dict]) -> list[dict]:
    """Pool runs of the same (dataset, method, N) over seeds (``n``: the run's budget; a run
    without one pools with the others of its method)."""
    groups: dict[tuple[str, str, int | None], list[dict]] = {}
    for r in per_run:
        groups.setdefault((r["dataset"], r["method"], r.get("n")), []).append(r)
    table = []
    for (d, m, budget), rs in groups.items():
        n = sum(r["graded"] for r in rs)
        qs = sum(r["questions"] for r in rs)
        by_rule = {rule: (sum(r.get(f"correct_{rule}", 0) for r in rs) / n if n else None)
                   for rule in RULES}
        # the headline is the method's best vote rule (every rule is in the row too); on a
        # tie the simplest rule names it (plain, then weighted, then top-1, then lineage)
        pref = ("plain", "weighted", "top1", "lineage")
        best = max(RULES, key=lambda rule: (by_rule[rule] or 0.0, -pref.index(rule)))
        k = sum(r.get(f"correct_{best}", 0) for r in rs)
        lo, hi = wilson(k, n)
        toks = sum(r["unique_tokens"] for r in rs)
        comps = sum(r.get("completions", 0) for r in rs)

        def mean(key: str, rs=rs) -> float | None:
            v = [r[key] for r in rs if r.get(key) is not None]
            return sum(v) / len(v) if v else None

        diag = sum((Totals.from_json(r.get("diagnostics")) for r in rs), Totals())
        table.append({
            "dataset": d, "method": m, "n": budget, "seeds": len(rs), "questions": qs,
            "accuracy": k / n if n else None, "ci95": [lo, hi], "best_rule": best,
            **{f"accuracy_{rule}": by_rule[rule] for rule in RULES},
            "unique_tokens_per_question": toks / max(1, qs),
            "tokens_per_completion": toks / comps if comps else None,
            "started_per_question": (sum(r["started"] for r in rs) / qs
                                     if qs and all(r.get("started") is not None for r in rs)
                                     else None),
            "wall_s": mean("wall_s"), "completions_per_s": mean("completions_per_s"),
            "kv_mean": mean("kv_mean"), "latency_s": mean("latency_s"),
            "preemptions": (sum(r["preemptions"] for r in rs)
                            if all(r.get("preemptions") is not None for r in rs) else None),
            "latency_vs_ideal": mean("latency_vs_ideal"),
            "completions_per_question": (sum(r.get("completions", 0) for r in rs) / qs
                                         if qs and all("completions" in r for r in rs) else None),
            "budget_reached": (sum(r["budget_reached"] for r in rs) / qs
                               if qs and all(r.get("budget_reached") is not None for r in rs)
                               else None),
            **diag.means(),
        })
    return table


def markdown(table: list[dict]) -> str:
    """The table as Markdown: the headline is each method's best vote rule (named), then
    every rule, the budget actually voted on (completions per question, traces started),
    tokens, throughput, latency against the no-queue ideal and the search diagnostics."""
    def f(x, fmt):
        return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, fmt)

    def pct(x):
        return f(100 * x if x is not None else None, ".1f")

    cols = ["dataset", "method", "N", "seeds", "questions", "accuracy (best rule)", "95% CI",
            "weighted", "plain", "top-1", "lineage", "completions / q", "started / q", "reached N",
            "unique tokens / q", "tokens / completion", "wall s", "completions / s",
            "mean KV use", "latency s", "latency / ideal", "preemptions", "coverage",
            "correct / q", "distinct / q", "inherited share", "fork depth mean / max"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in table:
        lo, hi = r["ci95"]
        lines.append(
            f"| {r['dataset']} | {r['method']} | {f(r.get('n'), 'd')} | {r['seeds']} | "
            f"{r['questions']} | "
            f"{pct(r['accuracy'])}% ({r.get('best_rule', '-')}) | "
            f"{f(100 * lo, '.1f')}-{f(100 * hi, '.1f')} | {pct(r.get('accuracy_weighted'))} | "
            f"{pct(r.get('accuracy_plain'))} | {pct(r.get('accuracy_top1'))} | "
            f"{pct(r.get('accuracy_lineage'))} | "
            f"{f(r.get('completions_per_question'), '.1f')} | "
            f"{f(r.get('started_per_question'), '.1f')} | "
            f"{f(100 * r['budget_reached'] if r.get('budget_reached') is not None else None, '.0f')}% | "
            f"{r['unique_tokens_per_question']:.0f} | {f(r.get('tokens_per_completion'), '.0f')} | "
            f"{f(r['wall_s'], '.1f')} | {f(r['completions_per_s'], '.2f')} | "
            f"{f(r['kv_mean'], '.2f')} | {f(r['latency_s'], '.2f')} | "
            f"{f(r['latency_vs_ideal'], '.2f')} | {f(r.get('preemptions'), 'd')} | "
            f"{pct(r.get('coverage'))} | {f(r.get('correct_per_question'), '.2f')} | "
            f"{f(r.get('distinct_per_question'), '.2f')} | {pct(r.get('inherited_share'))} | "
            f"{f(r.get('fork_depth_mean'), '.2f')} / {f(r.get('fork_depth_max'), 'd')} |")
    return "\n".join(lines) + "\n"
