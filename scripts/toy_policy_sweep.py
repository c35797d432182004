"""Train and evaluate several toy-policy variants in parallel (a GPU sweep helper).

Each variant is a list of ``train_policy`` flags; every variant trains, then runs
``data_pipelines.toy.evaluate`` with the transformers backend, and its report lands in
``OUT/NAME.json`` (the model in ``OUT/NAME/``).

    python scripts/toy_policy_sweep.py OUT 'base=' 'long=--steps 6000' 'seed1=--seed 1'
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


def run(out: Path, name: str, flags: str, eval_flags: str) -> dict:
    mdir = out / name
    log = open(out / f"{name}.log", "w")
    py = sys.executable
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    subprocess.run([py, "-m", "data_pipelines.toy.train_policy", "--out", str(mdir), "--precision", "32-true",
                    *shlex.split(flags)], check=True, stdout=log, stderr=subprocess.STDOUT, env=env)
    subprocess.run([py, "-m", "data_pipelines.toy.evaluate", "--model", str(mdir), "--backend", "hf",
                    "--out", str(out / f"{name}.json"), *shlex.split(eval_flags)],
                   check=True, stdout=log, stderr=subprocess.STDOUT, env=env)
    rep = json.loads((out / f"{name}.json").read_text())
    rep["train_meta"] = json.loads((mdir / "train_meta.json").read_text())
    return rep


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    eval_flags = os.environ.get("EVAL_FLAGS", "")
    variants = dict(v.split("=", 1) for v in sys.argv[2:])
    with ThreadPoolExecutor(len(variants)) as ex:
        futs = {n: ex.submit(run, out, n, f, eval_flags) for n, f in variants.items()}
        summary = {}
        for n, f in futs.items():
            try:
                r = f.result()
                summary[n] = {"flags": variants[n], "accuracy": r["accuracy"], "probe": r["probe"],
                              "branching": r["branching"], "train": {k: r["train_meta"][k] for k in ("train_tokens", "wall_seconds", "metrics")}}
            except Exception as e:  # keep the other variants' results
                summary[n] = {"flags": variants[n], "error": repr(e)}
            print(n, json.dumps(summary[n]), flush=True)
    (out / "summary.json").write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
