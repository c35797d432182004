"""gambit-solve: answer questions with Gambit's thought-level beam search (or a baseline).

    gambit-solve "Start 47. Ops: +8 -3 +9. Mod 100."          # one question: answer + votes
    gambit-solve --dataset toy:test:200 --n 32 --out runs/solve-gambit
    gambit-solve --dataset toy:test:200 --n 32 --method sc --out runs/solve-sc
    gambit-solve --dataset toy:test:200 --method gambit,sc --out runs/both   # one engine
    gambit-solve --rescore runs/solve-gambit --rule plain     # re-vote saved traces, no model
    gambit-solve --model Qwen/Qwen3-8B --scorer my/ckpt.pt --dataset aime.jsonl --n 256 \\
        --capacity 256 --swap 16 --interval 200 --warmup 12000 --temperature 0.6 --top-p 0.95 \\
        --top-k 20 --max-tokens 32768 --out runs/aime

Defaults fit the embedded toy world (the shipped toy policy and SeqScorer); the paper's
settings for real reasoning models are C=256, K=16, D=200, w=12,000, floor 0.1, T=0.6,
top-p 0.95, top-k 20. ``--n`` is the budget of completed traces per question; Gambit's C and K
scale with it unless ``--capacity`` / ``--swap`` are given (C = N/2 up to N = 16, then 3N/8,
at most 64; K = ceil(C/16): the settings the issue-29 tables measured), and a question prunes at most N traces
(``--prune-budget 1``).

Outputs in ``--out``: ``results.jsonl`` (one line per question, appended as each finishes),
``trees/<question>.json`` (every node of its search tree), ``results.json`` (the summary)
and ``run_config.json``. Rerunning the same command into the same ``--out`` skips the
questions already in ``results.jsonl``; a different config there is refused.

``--preset paper`` starts from the paper's reference settings (flags given win):
``gambit-solve --preset paper --model Qwen/Qwen3-8B --scorer my/ckpt.pt --dataset aime.jsonl``.

Booleans are ``--flag`` / ``--no-flag`` (``--no-drain``); bad input exits with status 2 and
one line on stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import replace
from typing import Any

from gambit_core.errors import InputError
from gambit_search.solve.config import PROG, SolveConfig


def _print_one(r: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    c = Console()
    if r.get("error"):
        c.print(f"[red]{PROG}: {r['error']}[/red]")
    c.print(f"answer: [bold]{r['answer']}[/bold]  (rule: {r.get('rule')})")
    t = Table("answer", "votes", "score sum")
    for v in r["votes"]:
        t.add_row(str(v["answer"]), str(v["count"]), f"{v['weight']:.3f}")
    c.print(t)
    s = r["tree_stats"]
    c.print(f"tree: {s.get('nodes', 0)} nodes, {s.get('branches', 0)} branches, "
            f"{s.get('prunes', 0)} pruned, {s.get('ghosts', 0)} ghosts, "
            f"{s.get('completions', 0)} completed, max depth {s.get('max_depth', 0)}, "
            f"{r['unique_tokens']} unique tokens, {r['wall_s']:.1f} s")


def _print_summary(runs: list[dict]) -> None:
    from rich.console import Console
    from rich.table import Table

    def pct(x: float | None) -> str:
        return "-" if x is None else f"{100 * x:.1f}%"

    cfg = runs[0]["config"]
    t = Table(title=f"{PROG} on {cfg['dataset']} (n={cfg['n']})")
    for col in ("method", "qs", "acc", "weighted", "plain", "top-1", "lineage", "votes/started",
                "tok/q", "wall s", "done/s"):
        t.add_column(col, justify="right" if col != "method" else "left")
    for s in runs:
        cps = s.get("completions_per_s")
        t.add_row(s["config"]["method"], str(s["questions"]), pct(s["accuracy"]),
                  pct(s["accuracy_weighted"]), pct(s["accuracy_plain"]), pct(s["accuracy_top1"]),
                  pct(s.get("accuracy_lineage")),
                  f"{s['completions_per_question']:.1f}/{s['started_per_question']:.1f}",
                  f"{s['unique_tokens_per_question']:.0f}", f"{s['wall_s']:.1f}",
                  "-" if cps is None else f"{cps:.1f}")
    # piped or logged output gets the whole table (rich would squeeze it to 80 columns)
    console = Console(width=None if sys.stdout.isatty() else 160)
    console.print(t)
    console.print(_diagnostics_table(runs))
    if any(s.get("ranks") for s in runs):
        console.print(_ranks_table(runs))
    failed = sum(s["failed"] for s in runs)
    if failed:
        print(f"{PROG}: {failed} question(s) failed: see 'error' in results.jsonl", file=sys.stderr)


DIAGNOSTICS = (("coverage", "coverage", "pct"), ("correct/q", "correct_per_question", "num"),
               ("distinct/q", "distinct_per_question", "num"),
               ("inherited", "inherited_share", "pct"), ("depth mean", "fork_depth_mean", "num"),
               ("depth max", "fork_depth_max", "int"))
"""The search diagnostics a summary shows: (column, key of ``summary["diagnostics"]``, format)."""


def _diagnostics_table(runs: list[dict]) -> Any:
    """Each run's search diagnostics (:mod:`gambit_search.diagnostics`): the share of
    questions with a correct trace, correct and distinct answers per question, the share of a
    forked trace's tokens it inherited, and the fork depth of the completed traces."""
    from rich.table import Table

    def fmt(v: Any, how: str) -> str:
        if v is None:
            return "-"
        return {"pct": f"{100 * v:.1f}%", "num": f"{v:.2f}", "int": str(v)}[how]

    t = Table(title="search diagnostics")
    t.add_column("method")
    for col, _, _ in DIAGNOSTICS:
        t.add_column(col, justify="right")
    for s in runs:
        d = s.get("diagnostics") or {}
        t.add_row(s["config"]["method"], *(fmt(d.get(k), how) for _, k, how in DIAGNOSTICS))
    return t


def _ranks_table(runs: list[dict]) -> Any:
    """Each data-parallel rank's share of each run: questions finished, and whether its
    engine died (with the questions it gave back)."""
    from rich.table import Table

    t = Table(title="data-parallel ranks")
    for col in ("method", "rank", "qs", "engine"):
        t.add_column(col, justify="left" if col in ("method", "engine") else "right")
    for s in runs:
        for r in s.get("ranks") or []:
            state = "ok" if r["died"] is None else \
                f"died ({r['died']}), {r['requeued']} q given back"
            t.add_row(s["config"]["method"], str(r["rank"]), str(r["questions"]), state)
    return t


def build_parser(defaults: bool = True) -> argparse.ArgumentParser:
    """gambit-solve's parser: the run's flags, then every method's parameters
    (``defaults=False``: a flag not given stays out of the namespace, so a preset can tell
    the flags given from the defaults)."""
    from gambit_core.cli import add_dataclass_args, add_verbose_arg
    from gambit_search.methods import param_classes

    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("question", nargs="?", default=None, help="one question as text")
    add_verbose_arg(p)
    add_dataclass_args(p, SolveConfig, skip=("params",), defaults=defaults)
    for cls, prefix in param_classes().items():
        g = p.add_argument_group(f"{cls.__name__} ({(cls.__doc__ or '').splitlines()[0]})")
        add_dataclass_args(g, cls, prefix=prefix, defaults=defaults)
    return p


def configs_from_args(a: dict, given: set[str] | None = None) -> list[SolveConfig]:
    """One :class:`SolveConfig` per method of ``--method`` (comma-separated), each with its
    own typed parameters from the flat flags; several methods write to ``<out>/<method>``.
    ``--preset`` sets every flag not in ``given`` (None: every flag counts as given)."""
    from gambit_search.methods import get_method
    from gambit_search.solve.config import params_from_flat, setting_names, with_preset

    a = with_preset(a, set(a) if given is None else given)
    own = setting_names(SolveConfig)
    base = SolveConfig(**{k: v for k, v in a.items() if k in own})
    names = list(dict.fromkeys(m.strip() for m in base.method.split(",") if m.strip()))
    if base.rescore is not None:
        return [base]
    if not names:
        raise InputError("--method names no method")
    out = []
    for name in names:
        m = get_method(name)
        path = base.out if len(names) == 1 or base.out is None else os.path.join(base.out, name)
        out.append(replace(base, method=name, out=path, params=params_from_flat(m, a)))
    return out


def main(argv: list[str] | None = None) -> None:
    from gambit_core.cli import input_errors, quiet_logs
    from gambit_search.solve.rescore import rescore
    from gambit_search.solve.run import solve, solve_methods

    p = build_parser()
    a = vars(p.parse_args(argv))
    given = set(vars(build_parser(defaults=False).parse_args(argv)))
    question, verbose = a.pop("question"), a.pop("verbose")
    quiet_logs(verbose)
    from gambit_search.data_parallel import rank_errors

    with input_errors(PROG), rank_errors(PROG):
        cfgs = configs_from_args(a, given)
        cfg = cfgs[0]
        if cfg.rescore is not None:
            print(json.dumps(rescore(cfg.rescore, cfg.rule or "weighted"), indent=1))
            return
        if cfg.dataset is not None and cfg.out is None:
            raise InputError("--dataset needs --out DIR (results are written there as they finish)")
        runs = [solve(cfg, question)] if len(cfgs) == 1 else solve_methods(cfgs, question)
    if question is not None:
        for s in runs:
            print(f"== {s['config']['method']}")
            _print_one(s["results"][0])
    else:
        _print_summary(runs)
        print(f"{PROG}: results in {a['out']}", file=sys.stderr)


if __name__ == "__main__":
    main()
