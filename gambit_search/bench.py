"""gambit-bench: methods x datasets x seeds on one engine, as a table and figures.

    gambit-bench --methods sc,gambit --datasets toy:val:20 --seeds 0 --n 16 --out runs/bench-smoke
    gambit-bench --methods sc,gambit --datasets toy:test:200 --seeds 0,1,2 --n 64 --kv-cache 0.05 \\
        --out runs/bench-toy
    gambit-bench --config bench.yaml          # the same keys in a YAML/JSON file; flags override
    gambit-bench --methods sc,bon,step,gambit --datasets toy-clean:val:100 --n 8,16,32,64,128 \
        --out runs/frontier                   # a budget sweep: one row per method and N

Every (method, dataset, N, seed) run is one ``gambit-solve`` run (same driver, engine and
accounting) into ``<out>/runs/<dataset>/<method>/seed<k>/`` (a sweep of several N:
``.../<method>/n<N>/seed<k>/``); a rerun skips finished questions, so the whole harness
resumes after a crash. ``--n 8,16,32,64,128`` sweeps the budget; every run is
gambit-solve's defaults at its N (Gambit's C and K scale with N:
:func:`gambit_search.methods.gambit.capacity_swap`) unless ``--set`` changes them. One
engine serves every run (one model); ``--kv-cache`` sets its size to create memory pressure. Per-method parameters:
``--set gambit.swap=2 step.n=32`` (or a ``set:`` mapping in the config file). A method may
run twice under two labels: ``--methods gambit,gambit-c16=gambit --set gambit-c16.capacity=16``.

Writes ``<out>/table.md`` and ``<out>/table.json`` (per method and dataset, pooled over
seeds: accuracy with a 95% Wilson interval, unique tokens per question, wall, completions/s,
mean KV use, mean question latency against its no-queue ideal, completed traces per question
and the share of questions that reached the budget N) and ``<out>/figures/*.png``
(``gambit_search.bench_plots``); every row also carries the search diagnostics
(coverage, correct and distinct answers per question, inherited share, fork depth:
``gambit_search.diagnostics``). A budget sweep also checks each method's accuracy-vs-tokens
line against ``--frontier-reference``'s (BoN by default): ``table.md``'s "Frontier" section
and ``table.json``'s ``frontier`` give the worst gap and where it falls
(``gambit_search.bench_frontier``). Everything that can be refused is refused before the
engine starts: an unknown method, a method that needs a scorer run without one, a dataset
that does not load.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from gambit_core.errors import InputError
from gambit_search.bench_frontier import frontier_gaps, frontier_markdown
from gambit_search.bench_tables import aggregate, markdown, run_metrics
from gambit_search.engines import EngineSettings
from gambit_search.solve.config import setting_names

PROG = "gambit-bench"


@dataclass(kw_only=True)
class BenchConfig(EngineSettings):
    """One harness run on one engine (:class:`~gambit_search.engines.EngineSettings`; every
    other gambit-solve setting keeps its default unless --set)."""

    out: str
    """Output directory (resumable)."""
    methods: str = "sc,gambit"
    """Comma-separated method names; ``label=method`` adds a variant of a method under its own
    row (e.g. ``gambit-c16=gambit`` with ``--set gambit-c16.capacity=16``)."""
    datasets: str = "toy:val:20"
    """Comma-separated question sources (JSONL path, local HF dataset, toy:<split>[:n])."""
    seeds: str = "0"
    """Comma-separated seeds."""
    n: str = "32"
    """Budget of completed traces per question, for every method; comma-separated (or a list
    in the config file) sweeps it, one table row per method and N."""
    scorer: str | None = None
    """Scorer checkpoint (default: gambit-solve's, the shipped SeqScorer)."""
    max_questions: int | None = None
    """Use only the first N questions of each dataset."""
    frontier_reference: str = "bon"
    """The method (label) whose accuracy-vs-tokens line every other method's is checked
    against when --n sweeps the budget (``table.md``'s "Frontier" section): one of
    --methods' labels, or "bon" (no check when it is not run):
    :mod:`gambit_search.bench_frontier`."""
    config: str | None = None
    """A YAML or JSON file with any of these keys (and ``set``: {method: {param: value}})."""


BenchInputError = InputError
"""Bad harness input (the project's one :class:`~gambit_core.errors.InputError`)."""

def _split(s: str) -> list[str]:
    return [x.strip() for x in str(s).split(",") if x.strip()]


def _value(v: str) -> Any:
    for t in (int, float):
        try:
            return t(v)
        except ValueError:
            pass
    return {"true": True, "false": False, "none": None}.get(v.lower(), v)


def budgets(n: str | int) -> list[int]:
    """``"8,16,32"`` -> [8, 16, 32]: the budgets of ``--n`` (an InputError for anything but
    distinct positive integers)."""
    items = _split(str(n))
    try:
        out = [int(x) for x in items]
    except ValueError:
        raise InputError(f"--n takes positive integers separated by commas, got {n!r}") from None
    if not out or min(out) < 1:
        raise InputError(f"--n takes positive integers separated by commas, got {n!r}")
    if len(set(out)) != len(out):
        raise InputError(f"--n names a budget twice: {n!r}")
    return out


def parse_sets(items: list[str]) -> dict[str, dict[str, Any]]:
    """``["gambit.swap=2", "sc.n=8"]`` -> {"gambit": {"swap": 2}, "sc": {"n": 8}}."""
    out: dict[str, dict[str, Any]] = {}
    for it in items:
        m = re.fullmatch(r"([\w-]+)\.([\w-]+)=(.*)", it)
        if not m:
            raise InputError(f"--set takes method.param=value, got {it!r}")
        out.setdefault(m.group(1), {})[m.group(2).replace("-", "_")] = _value(m.group(3))
    return out


def load_config(cfg: BenchConfig, sets: dict, given: set[str] | None = None
                ) -> tuple[BenchConfig, dict]:
    """Merge ``cfg.config`` (YAML/JSON) by OmegaConf's rules: the defaults, then the file,
    then the flags given on the command line (``given``: their names; None: the fields whose
    value differs from the default). ``set`` in the file merges under ``--set``."""
    if not cfg.config:
        return cfg, sets
    path = Path(cfg.config)
    if not path.is_file():
        raise InputError(f"config file {cfg.config!r} does not exist")
    from omegaconf import OmegaConf

    try:
        data = OmegaConf.to_container(OmegaConf.load(path), resolve=True) or {}
    except Exception as e:  # noqa: BLE001 - one line for the user
        raise InputError(f"cannot read {cfg.config}: {str(e).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise InputError(f"{cfg.config}: expected a mapping of settings")
    file_sets = data.pop("set", {}) or {}
    known = setting_names(BenchConfig)
    unknown = sorted(set(data) - known)
    if unknown:
        raise InputError(f"{cfg.config}: unknown keys {unknown} (known: {sorted(known)})")
    for k, v in data.items():  # a list in YAML is the flag's comma-separated string
        if isinstance(v, list):
            data[k] = ",".join(str(x) for x in v)
    defaults = BenchConfig(out=cfg.out)
    if given is None:
        given = {f.name for f in fields(BenchConfig)
                 if getattr(cfg, f.name) != getattr(defaults, f.name)}
    cli = {k: getattr(cfg, k) for k in given | {"out", "config"}}
    try:
        merged = OmegaConf.merge(OmegaConf.structured(defaults), data, cli)
    except Exception as e:  # noqa: BLE001 - a value of the wrong type, one line
        raise InputError(f"{cfg.config}: {str(e).splitlines()[0]}") from None
    all_sets = OmegaConf.to_container(OmegaConf.merge(file_sets, sets))
    out = BenchConfig(**OmegaConf.to_container(merged))
    budgets(out.n)  # "n: lots" is refused here, in one line
    return out, all_sets


def plan(cfg: BenchConfig, sets: dict) -> list[tuple[str, str, int, Any]]:
    """Every (dataset, method, seed, SolveConfig), checked: raises BenchInputError."""
    from gambit_search.methods import get_method
    from gambit_search.solve import SolveConfig, check_config, load_run_questions
    from gambit_search.solve.config import flat_names, params_from_flat

    methods, datasets, ns = _split(cfg.methods), _split(cfg.datasets), budgets(cfg.n)
    try:
        seeds = [int(s) for s in _split(cfg.seeds)]
    except ValueError:
        raise InputError(f"--seeds must be integers, got {cfg.seeds!r}") from None
    if not methods or not datasets or not seeds:
        raise InputError("need at least one method, dataset and seed")
    base_of: dict[str, str] = {}  # row label -> registered method
    for entry in methods:
        label, _, name = entry.partition("=")
        name = name.strip() or label
        label = label.strip()
        if not re.fullmatch(r"[\w-]+", label):
            raise InputError(f"--methods: bad label {label!r} (letters, digits, - and _)")
        if label in base_of:
            raise InputError(f"--methods names {label!r} twice")
        get_method(name)  # InputError naming the known methods
        base_of[label] = name
    methods = list(base_of)
    if cfg.frontier_reference != "bon" and cfg.frontier_reference not in methods:
        raise InputError(f"--frontier-reference {cfg.frontier_reference!r} is not in --methods "
                         f"({', '.join(methods)})")
    for m in sets:
        if m not in methods:
            raise InputError(f"--set names method {m!r}, which is not in --methods")
    solve_fields = setting_names(SolveConfig) - {"params"}
    engine = {k: getattr(cfg, k) for k in setting_names(EngineSettings)}
    base: dict[str, Any] = engine | {"max_questions": cfg.max_questions}
    if cfg.scorer:
        base["scorer"] = cfg.scorer
    own_params = {}
    for m in methods:
        meth = get_method(base_of[m])
        own_params[m] = flat_names(meth)
        bad = sorted(set(sets.get(m, {})) - solve_fields - own_params[m])
        if bad:
            raise InputError(f"--set {m}: unknown parameters {bad} (for {base_of[m]}: "
                             f"{', '.join(sorted(own_params[m])) or 'none of its own'})")
    # budget- then seed-major: a run cut short still leaves whole seeds of every method at
    # the smaller budgets, not whole methods and none of the later ones
    jobs = []
    for d in datasets:
        for n in ns:
            for s in seeds:
                for m in methods:
                    meth = get_method(base_of[m])
                    extra = sets.get(m, {})
                    out = Path(cfg.out) / "runs" / _slug(d) / m
                    out = (out / f"n{n}" if len(ns) > 1 else out) / f"seed{s}"
                    run = {k: v for k, v in extra.items() if k not in own_params[m]}
                    sc = SolveConfig(**(base | {"dataset": d, "method": base_of[m], "seed": s,
                                                "n": n, "out": str(out)} | run),
                                     params=params_from_flat(meth, extra))
                    try:
                        check_config(sc, None)
                    except InputError as e:
                        raise InputError(f"{m} on {d} at N={n}: {e}") from None
                    jobs.append((d, m, s, sc))
    for d in datasets:  # every dataset loads before any engine starts
        load_run_questions(replace(jobs[0][3], dataset=d, max_questions=cfg.max_questions), None)
    return jobs


def _slug(s: str) -> str:
    return re.sub(r"[^\w.-]+", "_", s).strip("_")


# ----------------------------------------------------------------------------- tables


# ----------------------------------------------------------------------------- run


def bench(cfg: BenchConfig, sets: dict | None = None, *, engine: Any = None, decode: Any = None,
          progress: bool = True, figures: bool = True, given: set[str] | None = None) -> dict:
    """Run (or resume) the harness; returns {"table": [...], "runs": [...]}. ``given``: the
    fields set on the command line (they win over ``cfg.config``'s file)."""
    from gambit_search.solve import (
        engine_scorer,
        prepare,
        read_results,
        run_prepared,
        start_engine,
    )
    from gambit_search.solve.outputs import fill_diagnostics
    from gambit_search.solve.run import first_engine

    cfg, sets = load_config(cfg, sets or {}, given)
    jobs = plan(cfg, sets)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    hidden = first_engine(engine).hidden_size if engine is not None else None
    preps = [(d, m, s, prepare(sc, None, hidden)) for d, m, s, sc in jobs]
    own = engine is None and any(p.todo for *_, p in preps)
    if own:
        engine, decode = start_engine(jobs[0][3], any(p.needs_confidence for *_, p in preps),
                                      engine_scorer([p for *_, p in preps]))
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
            rows = fill_diagnostics(run_dir, read_results(run_dir))
            per_run.append({"dataset": d, "method": m, "seed": s, "dir": str(run_dir),
                            **run_metrics(summary, rows), "n": p.cfg.n})
    finally:
        if own:
            engine.close()
    table = aggregate(per_run)
    gaps = frontier_gaps(table, cfg.frontier_reference)
    res = {"config": {k: getattr(cfg, k) for k in sorted(setting_names(BenchConfig))},
           "set": sets,
           "table": table, "frontier": gaps, "runs": per_run}
    (out / "table.json").write_text(json.dumps(res, indent=1))
    (out / "table.md").write_text(markdown(table) + _frontier_section(gaps))
    if figures:
        from gambit_search.bench_plots import draw_all

        res["figures"] = draw_all(out, per_run)
    return res


def _frontier_section(gaps: list[dict]) -> str:
    if not gaps:
        return ""
    return (f"\n## Frontier against {gaps[0]['reference']}\n\nEach line at its best rule, "
            "straight between budgets on a log token axis (gambit_search.bench_frontier); "
            "worst gap = method - reference, in accuracy points.\n\n"
            + frontier_markdown(gaps))


def main(argv: list[str] | None = None) -> None:
    from gambit_core.cli import add_dataclass_args, add_verbose_arg, input_errors, quiet_logs

    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    add_dataclass_args(p, BenchConfig, required=("out",), defaults=False)
    p.add_argument("--set", nargs="*", default=[], metavar="METHOD.PARAM=VALUE",
                   help="a gambit-solve parameter for one method, e.g. gambit.swap=2")
    add_verbose_arg(p)
    a = vars(p.parse_args(argv))
    sets, verbose = a.pop("set"), a.pop("verbose")
    quiet_logs(verbose)
    from gambit_search.data_parallel import rank_errors

    with input_errors(PROG), rank_errors(PROG):
        res = bench(BenchConfig(**a), parse_sets(sets), given=set(a) - {"out"})
    print(markdown(res["table"]) + _frontier_section(res["frontier"]))
    print(f"{PROG}: table and figures in {a['out']}", file=sys.stderr)


if __name__ == "__main__":
    main()
