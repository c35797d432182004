#!/usr/bin/env bash
# Data-parallel scaling of gambit-solve on this machine (issue 32): the same SC run at
# --data-parallel-size 1 and 2, back to back, then Gambit at K = 1 twice and K = 2 (whether
# Gambit reproduces at all on vLLM). Prints a markdown table; docs/results/issue32/scaling.md
# has the numbers. Questions/s is over the run's own wall (results.json "wall_s": engine
# start-up excluded). Usage: bash scripts/dp_scaling.sh [OUT] [QUESTIONS]
set -euo pipefail
out=${1:-runs/issue32}
nq=${2:-32}
common=(--dataset "toy:test:$nq" --n 8 --max-live 64 --kv-cache 0.125)
run() {  # name, flags...
  local name=$1; shift
  rm -rf "${out:?}/$name"
  .venv/bin/gambit-solve "${common[@]}" "$@" --out "$out/$name" > "$out/$name.log" 2>&1
}
mkdir -p "$out"
run sc-k1 --method sc --data-parallel-size 1
run sc-k2 --method sc --data-parallel-size 2
run gambit-k1 --method gambit --data-parallel-size 1
run gambit-k1-again --method gambit --data-parallel-size 1
run gambit-k2 --method gambit --data-parallel-size 2
.venv/bin/python - "$out" <<'PY'
import json, sys
from pathlib import Path

out = Path(sys.argv[1])
WHEN = {"wall_s", "rank", "decode_steps", "created_at", "ended_at", "completed_at", "pruned_at"}


def what(x):
    if isinstance(x, dict):
        return {k: what(v) for k, v in x.items() if k not in WHEN}
    return [what(v) for v in x] if isinstance(x, list) else x


def outputs(d):
    rows = [json.loads(x) for x in (d / "results.jsonl").read_text().splitlines()]
    return {r["id"]: (what(r), what(json.loads((d / "trees" / f"{r['id']}.json").read_text())))
            for r in rows}


base = {}
print("| run | K | questions | wall s | questions/s | ratio to K = 1 | tokens/s | accuracy | per rank |")
print("|---|---|---|---|---|---|---|---|---|")
for name in ("sc-k1", "sc-k2", "gambit-k1", "gambit-k1-again", "gambit-k2"):
    s = json.loads((out / name / "results.json").read_text())
    k = s["config"]["data_parallel_size"]
    qps = s["questions_this_run"] / s["wall_s"]
    m = s["config"]["method"]
    base.setdefault(m, qps)
    ranks = "/".join(str(r["questions"]) for r in s.get("ranks", [])) or "-"
    print(f"| {name} | {k} | {s['questions_this_run']} | {s['wall_s']:.1f} | {qps:.3f} | "
          f"{qps / base[m]:.2f} | {s['tokens_per_s']:.0f} | {s['accuracy']:.3f} | {ranks} |")
for a, b in (("sc-k1", "sc-k2"), ("gambit-k1", "gambit-k1-again"), ("gambit-k1", "gambit-k2")):
    x, y = outputs(out / a), outputs(out / b)
    same = sum(x[q] == y[q] for q in x)
    print(f"\n{a} vs {b}: {same} of {len(x)} questions with the same rows and trees")
PY
