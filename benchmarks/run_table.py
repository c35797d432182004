"""Run a gambit-bench table config where OmegaConf and matplotlib are missing (the lent H200).

The YAML of ``benchmarks/toy_table*.yaml`` is read with PyYAML (a transformers dependency),
the table is run by :func:`gambit_search.bench.bench` without figures
(``scripts/gpu_run.sh bench-tables`` sends back the run directories without their
per-question trees). Figures are drawn afterwards on any machine from that output.

    python benchmarks/run_table.py --config benchmarks/toy_table.yaml --out $OUT/toy \\
        --kv-cache 0.04 --set gambit.capacity=16    # flags win over the file
    python benchmarks/run_table.py --figures runs/gpu-tables/toy
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import fields
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def load_yaml(path: str) -> tuple[dict, dict]:
    """(BenchConfig fields, per-method sets) of a table config."""
    import yaml

    data = yaml.safe_load(Path(path).read_text()) or {}
    sets = data.pop("set", {}) or {}
    for k, v in list(data.items()):
        if isinstance(v, list):
            data[k] = ",".join(str(x) for x in v)
    return data, {m: dict(p) for m, p in sets.items()}


def run(config: str, out: str, overrides: dict, sets: list[str]) -> dict:
    """Run (or resume) the table; returns bench()'s result."""
    from gambit_search.bench import BenchConfig, bench, markdown, parse_sets

    data, file_sets = load_yaml(config)
    known = {f.name for f in fields(BenchConfig)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise SystemExit(f"run_table: {config}: unknown keys {unknown}")
    data.update({k: v for k, v in overrides.items() if v is not None})
    for m, p in parse_sets(sets).items():
        file_sets.setdefault(m, {}).update(p)
    res = bench(BenchConfig(**(data | {"out": out})), file_sets, progress=False, figures=False)
    print(markdown(res["table"]))
    return res


def figures(out: str) -> list[str]:
    """Draw the figures of a table run elsewhere (its run directories under ``out/runs``)."""
    from gambit_search.bench_plots import draw_all

    o = Path(out)
    per_run = json.loads((o / "table.json").read_text())["runs"]
    for r in per_run:  # the table was written on another machine
        r["dir"] = str(o / Path(r["dir"]).relative_to(Path(r["dir"]).parents[3]))
    return [str(p) for p in draw_all(o, per_run)]


def main() -> None:
    p = argparse.ArgumentParser(prog="run_table", description=__doc__.split("\n\n")[0])
    p.add_argument("--config", help="a table YAML (benchmarks/toy_table*.yaml)")
    p.add_argument("--out", help="output directory")
    p.add_argument("--kv-cache", type=float, default=None, help="override kv_cache (GiB)")
    p.add_argument("--datasets", default=None, help="override datasets")
    p.add_argument("--seeds", default=None, help="override seeds")
    p.add_argument("--methods", default=None, help="override methods")
    p.add_argument("--set", nargs="*", default=[], metavar="METHOD.PARAM=VALUE")
    p.add_argument("--figures", metavar="OUT", help="only draw the figures of a finished OUT")
    a = p.parse_args()
    if a.figures:
        print("\n".join(figures(a.figures)))
        return
    if not a.config or not a.out:
        p.error("--config and --out are needed (or --figures OUT)")
    run(a.config, a.out, {"kv_cache": a.kv_cache, "datasets": a.datasets, "seeds": a.seeds,
                          "methods": a.methods}, a.set)


if __name__ == "__main__":
    main()
