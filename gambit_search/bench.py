"""gambit-bench: methods x datasets x seeds on one engine, as a table and figures.

    gambit-bench --methods sc,gambit --datasets toy:val:20 --seeds 0 --n 16 --out runs/bench-smoke
    gambit-bench --methods sc,gambit --datasets toy:test:200 --seeds 0,1,2 --n 64 --kv-cache 0.05 \\
        --out runs/bench-toy
    gambit-bench --config bench.yaml          # the same keys in a YAML/JSON file; flags override

Every (method, dataset, seed) run is one ``gambit-solve`` run (same driver, engine and
accounting) into ``<out>/runs/<dataset>/<method>/seed<k>/``; a rerun skips finished
questions, so the whole harness resumes after a crash. One engine serves every run (one
model); ``--kv-cache`` sets its size to create memory pressure. Per-method parameters:
``--set gambit.swap=2 step.n=32`` (or a ``set:`` mapping in the config file). A method may
run twice under two labels: ``--methods gambit,gambit-c16=gambit --set gambit-c16.capacity=16``.

Writes ``<out>/table.md`` and ``<out>/table.json`` (per method and dataset, pooled over
seeds: accuracy with a 95% Wilson interval, unique tokens per question, wall, completions/s,
mean KV use, mean question latency against its no-queue ideal, completed traces per question
and the share of questions that reached the budget N) and ``<out>/figures/*.png``
(``gambit_search.bench_plots``). Everything that can be refused is refused before the
engine starts: an unknown method, a method that needs a scorer run without one, a dataset
that does not load.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from gambit_search.voting import RULES

PROG = "gambit-bench"


@dataclass
class BenchConfig:
    """One harness run (every other gambit-solve setting keeps its default unless --set)."""

    out: str
    """Output directory (resumable)."""
    methods: str = "sc,gambit"
    """Comma-separated method names; ``label=method`` adds a variant of a method under its own
    row (e.g. ``gambit-c16=gambit`` with ``--set gambit-c16.capacity=16``)."""
    datasets: str = "toy:val:20"
    """Comma-separated question sources (JSONL path, local HF dataset, toy:<split>[:n])."""
    seeds: str = "0"
    """Comma-separated seeds."""
    n: int = 32
    """Budget of completed traces per question, for every method."""
    model: str | None = None
    """Policy model (default: gambit-solve's, the shipped toy policy)."""
    scorer: str | None = None
    """Scorer checkpoint (default: gambit-solve's, the shipped SeqScorer)."""
    kv_cache: float = 1.0
    """KV-cache size in GiB (small values create memory pressure)."""
    max_live: int = 256
    """Global limit of live traces (also vLLM's max_num_seqs)."""
    max_questions: int | None = None
    """Use only the first N questions of each dataset."""
    config: str | None = None
    """A YAML or JSON file with any of these keys (and ``set``: {method: {param: value}})."""
    engine: str = "vllm"
    """"vllm", or "fake" (the scripted engine: tests and dry runs)."""


class BenchInputError(ValueError):
    """Bad harness input (one line)."""


def _split(s: str) -> list[str]:
    return [x.strip() for x in str(s).split(",") if x.strip()]


def _value(v: str) -> Any:
    for t in (int, float):
        try:
            return t(v)
        except ValueError:
            pass
    return {"true": True, "false": False, "none": None}.get(v.lower(), v)


def parse_sets(items: list[str]) -> dict[str, dict[str, Any]]:
    """``["gambit.swap=2", "sc.n=8"]`` -> {"gambit": {"swap": 2}, "sc": {"n": 8}}."""
    out: dict[str, dict[str, Any]] = {}
    for it in items:
        m = re.fullmatch(r"([\w-]+)\.([\w-]+)=(.*)", it)
        if not m:
            raise BenchInputError(f"--set takes method.param=value, got {it!r}")
        out.setdefault(m.group(1), {})[m.group(2).replace("-", "_")] = _value(m.group(3))
    return out


def load_config(cfg: BenchConfig, sets: dict) -> tuple[BenchConfig, dict]:
    """Merge ``cfg.config`` (YAML/JSON) under the flags given on the command line."""
    if not cfg.config:
        return cfg, sets
    path = Path(cfg.config)
    if not path.is_file():
        raise BenchInputError(f"config file {cfg.config!r} does not exist")
    from omegaconf import OmegaConf

    try:
        data = OmegaConf.to_container(OmegaConf.load(path), resolve=True) or {}
    except Exception as e:  # noqa: BLE001 - one line for the user
        raise BenchInputError(f"cannot read {cfg.config}: {str(e).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise BenchInputError(f"{cfg.config}: expected a mapping of settings")
    file_sets = data.pop("set", {}) or {}
    known = {f.name for f in fields(BenchConfig)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise BenchInputError(f"{cfg.config}: unknown keys {unknown} (known: {sorted(known)})")
    defaults = BenchConfig(out=cfg.out)
    merged = {k: v for k, v in data.items()
              if getattr(cfg, k) == getattr(defaults, k)}  # flags win over the file
    for k, v in merged.items():
        if isinstance(v, list):
            merged[k] = ",".join(str(x) for x in v)
    all_sets = {m: dict(p) for m, p in file_sets.items()}
    for m, p in sets.items():
        all_sets.setdefault(m, {}).update(p)
    return replace(cfg, **merged), all_sets


def plan(cfg: BenchConfig, sets: dict) -> list[tuple[str, str, int, Any]]:
    """Every (dataset, method, seed, SolveConfig), checked: raises BenchInputError."""
    from gambit_search.methods import UnknownMethodError, get_method
    from gambit_search.solve import SolveConfig, SolveInputError, check_config, load_run_questions

    methods, datasets = _split(cfg.methods), _split(cfg.datasets)
    try:
        seeds = [int(s) for s in _split(cfg.seeds)]
    except ValueError:
        raise BenchInputError(f"--seeds must be integers, got {cfg.seeds!r}") from None
    if not methods or not datasets or not seeds:
        raise BenchInputError("need at least one method, dataset and seed")
    base_of: dict[str, str] = {}  # row label -> registered method
    for entry in methods:
        label, _, name = entry.partition("=")
        name = name.strip() or label
        label = label.strip()
        if not re.fullmatch(r"[\w-]+", label):
            raise BenchInputError(f"--methods: bad label {label!r} (letters, digits, - and _)")
        if label in base_of:
            raise BenchInputError(f"--methods names {label!r} twice")
        try:
            get_method(name)
        except UnknownMethodError as e:
            raise BenchInputError(str(e)) from None
        base_of[label] = name
    methods = list(base_of)
    for m in sets:
        if m not in methods:
            raise BenchInputError(f"--set names method {m!r}, which is not in --methods")
    solve_fields = {f.name for f in fields(SolveConfig)}
    base: dict[str, Any] = {"n": cfg.n, "kv_cache": cfg.kv_cache, "max_live": cfg.max_live,
                            "max_questions": cfg.max_questions, "engine": cfg.engine}
    if cfg.model:
        base["model"] = cfg.model
    if cfg.scorer:
        base["scorer"] = cfg.scorer
    for m in methods:
        bad = sorted(set(sets.get(m, {})) - solve_fields)
        if bad:
            raise BenchInputError(f"--set {m}: unknown parameters {bad}")
    # seed-major: a run cut short still leaves whole seeds of every method, not whole
    # methods and none of the later ones
    jobs = []
    for d in datasets:
        for s in seeds:
            for m in methods:
                extra = sets.get(m, {})
                out = Path(cfg.out) / "runs" / _slug(d) / m / f"seed{s}"
                sc = SolveConfig(**(base | {"dataset": d, "method": base_of[m], "seed": s,
                                            "out": str(out)} | extra))
                try:
                    check_config(sc, None)
                except SolveInputError as e:
                    raise BenchInputError(f"{m} on {d}: {e}") from None
                jobs.append((d, m, s, sc))
    for d in datasets:  # every dataset loads before any engine starts
        try:
            load_run_questions(replace(jobs[0][3], dataset=d, max_questions=cfg.max_questions), None)
        except SolveInputError as e:
            raise BenchInputError(str(e)) from None
    return jobs


def _slug(s: str) -> str:
    return re.sub(r"[^\w.-]+", "_", s).strip("_")


# ----------------------------------------------------------------------------- tables


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval of k successes in n."""
    if n == 0:
        return (math.nan, math.nan)
    p = k / n
    den = 1 + z * z / n
    mid = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return (max(0.0, mid - half), min(1.0, mid + half))


def run_metrics(summary: dict, rows: list[dict]) -> dict:
    """One run's metrics from its summary and result rows."""
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
        "questions": len(rows), "correct": sum(bool(r.get("correct")) for r in rows),
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
    }


def aggregate(per_run: list[dict]) -> list[dict]:
    """Pool runs of the same (dataset, method) over seeds."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in per_run:
        groups.setdefault((r["dataset"], r["method"]), []).append(r)
    table = []
    for (d, m), rs in groups.items():
        n = sum(r["graded"] for r in rs)
        qs = sum(r["questions"] for r in rs)
        by_rule = {rule: (sum(r.get(f"correct_{rule}", 0) for r in rs) / n if n else None)
                   for rule in RULES}
        # the headline is the method's best vote rule (every rule is in the row too); on a
        # tie the simplest rule names it (plain, then weighted, then top-1)
        pref = ("plain", "weighted", "top1")
        best = max(RULES, key=lambda rule: (by_rule[rule] or 0.0, -pref.index(rule)))
        k = sum(r.get(f"correct_{best}", 0) for r in rs)
        lo, hi = wilson(k, n)
        toks = sum(r["unique_tokens"] for r in rs)
        comps = sum(r.get("completions", 0) for r in rs)

        def mean(key: str, rs=rs) -> float | None:
            v = [r[key] for r in rs if r.get(key) is not None]
            return sum(v) / len(v) if v else None

        table.append({
            "dataset": d, "method": m, "seeds": len(rs), "questions": qs,
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
        })
    return table


def markdown(table: list[dict]) -> str:
    """The table as Markdown: the headline is each method's best vote rule (named), then
    every rule, the budget actually voted on (completions per question, traces started),
    tokens, throughput and latency against the no-queue ideal."""
    def f(x, fmt):
        return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, fmt)

    def pct(x):
        return f(100 * x if x is not None else None, ".1f")

    lines = ["| dataset | method | seeds | questions | accuracy (best rule) | 95% CI | weighted | "
             "plain | top-1 | completions / q | started / q | reached N | unique tokens / q | "
             "tokens / completion | wall s | completions / s | mean KV use | latency s | "
             "latency / ideal | preemptions |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in table:
        lo, hi = r["ci95"]
        lines.append(
            f"| {r['dataset']} | {r['method']} | {r['seeds']} | {r['questions']} | "
            f"{pct(r['accuracy'])}% ({r.get('best_rule', '-')}) | "
            f"{f(100 * lo, '.1f')}-{f(100 * hi, '.1f')} | {pct(r.get('accuracy_weighted'))} | "
            f"{pct(r.get('accuracy_plain'))} | {pct(r.get('accuracy_top1'))} | "
            f"{f(r.get('completions_per_question'), '.1f')} | "
            f"{f(r.get('started_per_question'), '.1f')} | "
            f"{f(100 * r['budget_reached'] if r.get('budget_reached') is not None else None, '.0f')}% | "
            f"{r['unique_tokens_per_question']:.0f} | {f(r.get('tokens_per_completion'), '.0f')} | "
            f"{f(r['wall_s'], '.1f')} | {f(r['completions_per_s'], '.2f')} | "
            f"{f(r['kv_mean'], '.2f')} | {f(r['latency_s'], '.2f')} | "
            f"{f(r['latency_vs_ideal'], '.2f')} | {f(r.get('preemptions'), 'd')} |")
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- run


def bench(cfg: BenchConfig, sets: dict | None = None, *, engine: Any = None, decode: Any = None,
          progress: bool = True, figures: bool = True) -> dict:
    """Run (or resume) the harness; returns {"table": [...], "runs": [...]}."""
    from gambit_search.solve import prepare, read_results, run_prepared, start_engine

    cfg, sets = load_config(cfg, sets or {})
    jobs = plan(cfg, sets)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    preps = [(d, m, s, prepare(sc, None, engine.hidden_size if engine is not None else None))
             for d, m, s, sc in jobs]
    own = engine is None and any(p.todo for *_, p in preps)
    if own:
        engine, decode = start_engine(jobs[0][3], any(p.needs_confidence for *_, p in preps))
    per_run = []
    try:
        for d, m, s, p in preps:
            run_dir = Path(p.cfg.out)
            if p.todo:
                print(f"{PROG}: {m} on {d}, seed {s}: {len(p.todo)} questions", file=sys.stderr)
                summary = run_prepared(p, engine, decode, progress)
                summary.pop("results", None)
            else:
                summary = json.loads((run_dir / "results.json").read_text())
            rows = read_results(run_dir)
            per_run.append({"dataset": d, "method": m, "seed": s, "dir": str(run_dir),
                            **run_metrics(summary, rows)})
    finally:
        if own:
            engine.close()
    table = aggregate(per_run)
    res = {"config": {f.name: getattr(cfg, f.name) for f in fields(cfg)}, "set": sets,
           "table": table, "runs": per_run}
    (out / "table.json").write_text(json.dumps(res, indent=1))
    (out / "table.md").write_text(markdown(table))
    if figures:
        from gambit_search.bench_plots import draw_all

        res["figures"] = draw_all(out, per_run)
    return res


def main(argv: list[str] | None = None) -> None:
    import os

    from data_pipelines.cli import add_dataclass_args

    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    add_dataclass_args(p, BenchConfig, required=("out",))
    p.add_argument("--set", nargs="*", default=[], metavar="METHOD.PARAM=VALUE",
                   help="a gambit-solve parameter for one method, e.g. gambit.swap=2")
    p.add_argument("-v", "--verbose", action="store_true", help="show vLLM's INFO logs")
    a = vars(p.parse_args(argv))
    sets, verbose = a.pop("set"), a.pop("verbose")
    if not verbose:
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    from gambit_search.solve import SolveInputError

    try:
        res = bench(BenchConfig(**a), parse_sets(sets))
    except (BenchInputError, SolveInputError) as e:
        p.exit(2, f"{PROG}: error: {e}\n")
    print(markdown(res["table"]))
    print(f"{PROG}: table and figures in {a['out']}", file=sys.stderr)


if __name__ == "__main__":
    main()
