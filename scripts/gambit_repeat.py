"""Does Gambit reproduce on vLLM? The same gambit-solve run twice on one engine (K = 1), then
how many questions have the same rows and trees (docs/SEARCH.md, "Data parallelism").

    .venv/bin/python scripts/gambit_repeat.py [OUT]      # default /tmp/gambit-repeat
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

WHEN = {"wall_s", "rank", "decode_steps", "created_at", "ended_at", "completed_at", "pruned_at"}
"""Where and when, not what (as tests/test_data_parallel_vllm.py compares)."""


def what(x):
    if isinstance(x, dict):
        return {k: what(v) for k, v in x.items() if k not in WHEN}
    return [what(v) for v in x] if isinstance(x, list) else x


def outputs(d: Path) -> dict:
    rows = [json.loads(x) for x in (d / "results.jsonl").read_text().splitlines()]
    return {r["id"]: (what(r), what(json.loads((d / "trees" / f"{r['id']}.json").read_text())))
            for r in rows}


if __name__ == "__main__":
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    from gambit_search.engines import EngineSettings, get_engine_kind
    from gambit_search.solve import make_config, solve

    base = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/gambit-repeat")
    kind = get_engine_kind("vllm")
    eng = kind.start(EngineSettings(max_live=64, kv_cache=0.125))
    try:
        outs = []
        for i in range(2):
            out = base / f"run{i}"
            shutil.rmtree(out, ignore_errors=True)
            s = solve(make_config(dataset="toy:test:8", n=8, max_live=64, kv_cache=0.125,
                                  out=str(out)), engine=eng, decode=kind.decoder(eng),
                      progress=False)
            outs.append(outputs(out))
            print(f"run {i}: accuracy {s['accuracy']}", flush=True)
        a, b = outs
        print(f"same rows and trees: {sum(a[q] == b[q] for q in a)} of {len(a)} questions")
    finally:
        eng.close()
