"""Draw the issue-29 test frontier at today's defaults: the earlier pass's SC/BoN/STEP/Gambit
lines (test-frontier.md) with today's default Gambit (`gambit-default`: prune budget 1, and
C = 64 at N = 128) from test-prune-budget.md, one panel per split, accuracy against unique
tokens per question. Nothing is re-run: it reads the runs' table.json files.

    python docs/results/issue29/combine_frontier.py    (from the repository root, after the
                                                        commands in the two .md files)
"""

from __future__ import annotations

import json
from pathlib import Path

if __name__ == "__main__":
    from gambit_search.bench_plots import _frontier

    here = Path(__file__).parent
    old = {"toy": "runs/x29b/test-toy", "hard": "runs/x29b/test-hard",
           "clean": "runs/x29b/test-clean"}
    new = {"toy": ["runs/x29c/test-clean-toy", "runs/x29c/test-clean-toy-c64"],
           "hard": ["runs/x29c/test-hard", "runs/x29c/test-hard-c64"],
           "clean": ["runs/x29c/test-clean-toy", "runs/x29c/test-clean-toy-c64"]}
    split = {"toy": "toy:test:100", "hard": "toy-hard:test:100", "clean": "toy-clean:test:100"}
    for name, d in old.items():
        runs = json.loads(Path(d, "table.json").read_text())["runs"]
        for p in new[name]:
            c64 = p.endswith("-c64")
            for r in json.loads(Path(p, "table.json").read_text())["runs"]:
                # N = 128 comes from the C = 64 pass (today's default there), N <= 64 from the other
                if r["dataset"] == split[name] and (r["n"] == 128) == c64:
                    runs.append(r | {"method": "gambit-default"})
        _frontier(runs, "tokens", "unique tokens per question",
                  here / f"test-{name}-default-accuracy_vs_tokens.png")
        print(here / f"test-{name}-default-accuracy_vs_tokens.png")
