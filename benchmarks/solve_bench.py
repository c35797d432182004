"""Gambit vs SC on one engine, same questions, same concurrency: throughput, overhead, accuracy.

    # throughput ratio + search overhead (alternating order, median of repeats)
    .venv/bin/python benchmarks/solve_bench.py --dataset toy:val:64 --n 32 --repeats 3 --out runs/bench.json
    # a parameter sweep on the val split (Gambit only, each setting once)
    .venv/bin/python benchmarks/solve_bench.py --dataset toy:val:100 --n 32 --methods gambit \\
        --grid swap=2,4,8 interval=4,8,16 --out runs/sweep.json
    # a driver setting for both methods (each Gambit run's ratio is against SC at its setting)
    .venv/bin/python benchmarks/solve_bench.py --dataset toy:val:64 --n 32 --repeats 2 \\
        --grid queue=0,32 --grid-methods sc,gambit --out runs/queue.json
    # the accuracy table (test split, touched once, with the settings chosen on val)
    .venv/bin/python benchmarks/solve_bench.py --dataset toy:test:200 --n 32 --repeats 1 --out runs/test32.json

Every run goes through gambit-solve's own code (``gambit_search.solve.prepare`` /
``run_prepared``) on one ``VLLMEngine`` started like gambit-solve's. Per run it records
tokens/s of the loop (unique generated tokens / wall of ``Driver.run``), the search's own
cost (scoring + policy + memory handling + driver bookkeeping, % of that wall), accuracy
under each vote rule, unique tokens and completions/s. Ratios are taken between runs of
the same repeat.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import time
from pathlib import Path


def _grid(items: list[str]) -> list[dict]:
    keys, vals = [], []
    for it in items:
        k, v = it.split("=", 1)
        keys.append(k.replace("-", "_"))
        vals.append([_num(x) for x in v.split(",")])
    return [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*vals)]


def _num(x: str):
    for t in (int, float):
        try:
            return t(x)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(x.lower(), x)


def _row(s: dict, label: str, repeat: int) -> dict:
    from gambit_search.bench_tables import run_metrics

    tm = s["timing"]
    m = run_metrics(s, s.get("results") or [])
    return {
        "label": label, "method": s["config"]["method"], "repeat": repeat,
        "questions": s["questions_this_run"], "accuracy": s["accuracy"],
        "accuracy_weighted": s["accuracy_weighted"], "accuracy_plain": s["accuracy_plain"],
        "accuracy_top1": s["accuracy_top1"], "unique_tokens": s["unique_tokens_this_run"],
        "tokens_per_s": s["tokens_per_s"], "completions_per_s": s["completions_per_s"],
        "wall_s": s["wall_s"], "search_overhead_pct": tm["search_overhead_pct"],
        # mean question latency, and against its no-queue ideal (its longest lineage's
        # decode steps at the run's mean step time: gambit-bench's definition)
        "latency_s": m["latency_s"], "latency_vs_ideal": m["latency_vs_ideal"],
        "timing": tm, "prefix_cache": s["prefix_cache"],
        "params": {k: s["config"].get(k) for k in ("n", "capacity", "swap", "interval", "warmup",
                                                   "floor", "branch_point", "child_temperature",
                                                   "ghosts", "parents", "drain")},
        "tree_means": _tree_means(s.get("results") or []),
        **_occupancy(s.get("memory_log") or []),
    }


def _occupancy(log: list) -> dict:
    """Mean running and waiting requests and KV use over the run's memory reads ((t,
    running, waiting, kv) per read: every step for Gambit, every 16th for SC), weighted by
    the time to the next read; and the mean running while anything waited or the run was
    not yet in its tail (the first 90 % of the wall), i.e. while the budget was open."""
    if len(log) < 2:
        return {}
    dts = [b[0] - a[0] for a, b in zip(log, log[1:], strict=False)]
    tot = sum(dts) or 1e-9
    head = [(dt, r) for (t, r, _w, _k), dt in zip(log, dts, strict=False) if t <= 0.9 * log[-1][0]]

    def wmean(i: int) -> float:
        return round(sum(dt * row[i] for row, dt in zip(log, dts, strict=False)) / tot, 2)

    return {"mean_running": wmean(1), "mean_waiting": wmean(2), "mean_kv": wmean(3),
            "mean_running_first_90pct": round(sum(dt * r for dt, r in head)
                                              / max(1e-9, sum(dt for dt, _ in head)), 2)}


def _tree_means(rows: list[dict]) -> dict:
    """Per-question tree statistics (numbers only) averaged over the run's questions: nodes,
    branches, prunes, ghosts, parent diversity (distinct_parents_per_round, top_parent_share)."""
    stats = [r.get("tree_stats") or {} for r in rows if not r.get("error")]
    keys = sorted({k for st in stats for k, v in st.items()
                   if isinstance(v, (int, float)) and not isinstance(v, bool)})
    return {k: round(statistics.fmean(st[k] for st in stats if k in st), 3) for k in keys}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset", default="toy:val:64")
    p.add_argument("--n", type=int, default=32)
    p.add_argument("--methods", default="sc,gambit")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--grid", nargs="*", default=[],
                   help="gambit settings to sweep, gambit-solve's flat names: key=v1,v2")
    p.add_argument("--grid-methods", default="gambit",
                   help="the methods --grid applies to (the rest run each repeat once, as set)")
    p.add_argument("--set", nargs="*", default=[],
                   help="fixed settings, gambit-solve's flat names: key=value")
    p.add_argument("--kv-cache", type=float, default=1.0)
    p.add_argument("--max-live", type=int, default=256)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--engine", default="vllm", help='"vllm", or "fake" (a dry run)')
    p.add_argument("--out", required=True)
    a = p.parse_args()

    from gambit_core.cli import input_errors
    from gambit_search.solve import engine_scorer, make_config, prepare, run_prepared, start_engine

    flat = {"dataset": a.dataset, "n": a.n, "kv_cache": a.kv_cache, "max_live": a.max_live,
            "seed": a.seed, "engine": a.engine} | {k: v for d in _grid(a.set) for k, v in d.items()}
    swept = set(a.grid_methods.split(","))
    with input_errors(p.prog):  # an unknown --set/--grid name fails before the engine starts
        base = make_config(**flat)
        jobs_of = {(m, tuple(st.items())): make_config(**(flat | st | {"method": m}))
                   for m in a.methods.split(",")
                   for st in ((_grid(a.grid) or [{}]) if m in swept else [{}])}
    settings = _grid(a.grid) or [{}]
    methods = a.methods.split(",")
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = json.loads(out.read_text())["runs"] if out.exists() else []
    done = {(r["label"], r["repeat"]) for r in rows}
    # the engine scores in its worker with the runs' scorer (unless --set score_in_engine=false)
    engine, decode = start_engine(base, False,
                                  engine_scorer([prepare(c, None) for c in jobs_of.values()]))
    t_all = time.perf_counter()
    try:
        for rep in range(a.repeats):
            jobs = []
            for m in methods:
                for st in (settings if m in swept else [{}]):
                    label = m + "".join(f" {k}={v}" for k, v in st.items())
                    jobs.append((label, jobs_of[(m, tuple(st.items()))]))
            if rep % 2:
                jobs.reverse()  # alternate which method runs first
            for label, cfg in jobs:
                if (label, rep) in done:
                    continue
                s = run_prepared(prepare(cfg, None, engine.hidden_size), engine, decode)
                rows.append(_row(s, label, rep))
                r = rows[-1]
                print(f"{label} [rep {rep}]: acc {r['accuracy']:.3f} (w {r['accuracy_weighted']:.3f} "
                      f"p {r['accuracy_plain']:.3f} t1 {r['accuracy_top1']:.3f}) "
                      f"{r['unique_tokens'] / max(1, r['questions']):.0f} tok/q "
                      f"{r['tokens_per_s']:.0f} tok/s overhead {r['search_overhead_pct']:.1f}% "
                      f"wall {r['wall_s']:.1f}s latency/ideal {r['latency_vs_ideal'] or 0:.2f} "
                      f"running {r.get('mean_running')}", flush=True)
                out.write_text(json.dumps({"args": vars(a), "runs": rows}, indent=1))
    finally:
        engine.close()
    # ratios of the same repeat, against SC at the same setting where SC was swept too
    ratios = []
    for rep in range(a.repeats):
        for g in (r for r in rows if r["repeat"] == rep and r["method"] == "gambit"):
            same = "sc" + g["label"][len("gambit"):]
            sc = ([r for r in rows if r["repeat"] == rep and r["label"] == same]
                  or [r for r in rows if r["repeat"] == rep and r["label"] == "sc"])
            if sc:
                ratios.append({"label": g["label"], "repeat": rep,
                               "throughput_ratio": g["tokens_per_s"] / sc[0]["tokens_per_s"],
                               "token_ratio": g["unique_tokens"] / sc[0]["unique_tokens"],
                               "completions_ratio": g["completions_per_s"] / sc[0]["completions_per_s"]})
    summary = {}
    for label in dict.fromkeys(r["label"] for r in ratios):
        rs = [r for r in ratios if r["label"] == label]
        summary[label] = {k: statistics.median(r[k] for r in rs)
                          for k in ("throughput_ratio", "token_ratio", "completions_ratio")}
    out.write_text(json.dumps({"args": vars(a), "runs": rows, "ratios": ratios,
                               "median_ratios": summary,
                               "bench_wall_s": round(time.perf_counter() - t_all, 1)}, indent=1))
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
