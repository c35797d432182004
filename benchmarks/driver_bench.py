"""How the driver's per-step bookkeeping scales with the number of live traces.

Runs :class:`~gambit_search.driver.Driver` on the fake engine, one question of N traces at
a time (N = ``--traces``, default 256 and 1024; Gambit with C = N), for each method, and
reports per engine step:

- ``engine_us_step_live``: the fake engine's own ``step`` time per step per live trace;
- ``driver_us_step_live``: the driver's time outside ``engine.step`` (policy, scoring,
  memory handling, bookkeeping: ``timing["wall_s"] - timing["engine_s"]``) per step per
  live trace;
- ``*_vs_first``: each of those over the same figure at the smallest N.

A live trace here is a running request, i.e. one delta of the step (every running request
gets one token per step), so both figures are per event. Work proportional to the step's
events keeps them flat as N grows; per-event work that scans every live trace or every node
of the tree makes them grow with N (the quadratic regression this guards against).

Memory is ample by default (no eviction: the numbers measure bookkeeping, not memory
pressure); ``--num-blocks`` sets it. The scorer is a pseudo-random stand-in (scoring cost is
not the point; ``scoring_s`` is reported apart).

    .venv/bin/python benchmarks/driver_bench.py --out runs/driver_bench.json
    .venv/bin/python benchmarks/driver_bench.py --traces 128 512 2048 --methods sc
    .venv/bin/python benchmarks/driver_bench.py --traces 1024 --profile runs/prof   # cProfile
    .venv/bin/python benchmarks/driver_bench.py --repeats 3   # best of 3 (a shared machine)

Measured before and after the fix of its quadratic per-step scan (2026-12-05):
docs/results/driver_bench/README.md. To measure other code (e.g. the files before a change,
copied to DIR), run it from outside the repo so that DIR comes first on the path: ``cd /tmp && PYTHONPATH=DIR python /path/to/driver_bench.py``.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import random
import time
from pathlib import Path
from typing import Any

from gambit_core.questions import load_questions
from gambit_search.driver import Driver, DriverConfig
from gambit_search.engine import SamplingSpec, StepOutput
from gambit_search.engines import get_engine_kind
from gambit_search.fake_engine import FakeEngine, FakeEngineConfig
from gambit_search.methods import get_method


class PseudoScorer:
    """The driver's scorer interface with pseudo-random scores (a function of trace and
    output index): no torch, a negligible cost."""

    needs_confidence = False

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed
        self.keys: set = set()

    def add(self, key: Any, parent: Any = None) -> None:
        self.keys.add(key)

    def drop(self, key: Any) -> None:
        self.keys.discard(key)

    def __contains__(self, key: Any) -> bool:
        return key in self.keys

    def score(self, items: list, logprobs: Any = None) -> list[float]:
        return [random.Random(hash((self.seed, k, j))).random() for k, _, j in items]


class CountingEngine(FakeEngine):
    """A :class:`FakeEngine` that counts the deltas (live traces) of every step."""

    events = 0

    def step(self) -> StepOutput:
        out = super().step()
        self.events += len(out.deltas)
        return out


def run_one(method: str, traces: int, questions: int, max_tokens: int,
            num_blocks: int | None, seed: int, profile: Path | None = None) -> dict:
    """One driver run on the fake engine; returns its timing row."""
    kind = get_engine_kind("fake")
    per_trace = -(-(64 + max_tokens) // 4) + 1  # blocks of a trace (toy prompts < 64 tokens)
    blocks = num_blocks or traces * per_trace + 64
    eng = CountingEngine(FakeEngineConfig(seed=seed, max_num_seqs=traces, num_blocks=blocks))
    m = get_method(method)
    params = m.params(capacity=traces) if method == "gambit" else None
    bound = m.bind(params, n=traces)
    prompt = kind.prompt_ids(None)
    drv = Driver(eng, bound, prompt_ids=lambda q: prompt(q.question), decode=eng.decode,
                 spec=SamplingSpec(max_tokens=max_tokens, logprobs=m.logprobs),
                 scorer=PseudoScorer(seed) if m.needs_scorer or m.scores_traces else None,
                 config=DriverConfig(max_live=traces, seed=seed))
    qs = load_questions(f"toy:val:{questions}")
    prof = cProfile.Profile() if profile is not None else None
    t0 = time.perf_counter()
    if prof is not None:
        prof.enable()
    results = list(drv.run(qs))
    if prof is not None:
        prof.disable()
    wall = time.perf_counter() - t0
    tm = drv.timing
    steps, events = max(1, tm["steps"]), max(1, eng.events)
    outside = tm["wall_s"] - tm["engine_s"]
    row = {
        "method": method, "traces": traces, "questions": len(results),
        "errors": sum(bool(r.get("error")) for r in results),
        "steps": tm["steps"], "events": eng.events, "mean_live": round(events / steps, 1),
        "nodes": sum(r["tree_stats"].get("nodes", 0) for r in results),
        "wall_s": round(wall, 3), "engine_s": round(tm["engine_s"], 3),
        "driver_s": round(outside, 3), "policy_s": round(tm["policy_s"], 3),
        "scoring_s": round(tm["scoring_s"], 3), "memory_s": round(tm["memory_s"], 3),
        "engine_us_step_live": round(1e6 * tm["engine_s"] / events, 3),
        "driver_us_step_live": round(1e6 * outside / events, 3),
        "driver_ms_step": round(1e3 * outside / steps, 3),
    }
    if prof is not None:
        assert profile is not None
        profile.mkdir(parents=True, exist_ok=True)
        path = profile / f"{method}_{traces}.prof"
        prof.dump_stats(str(path))
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(15)
        row["profile"] = str(path)
        print(f"--- {method} N={traces}: top 15 by own time ({path})")
        print(buf.getvalue().split("\n\n", 2)[-1].rstrip())
    return row


_TIMES = ("wall_s", "engine_s", "driver_s", "policy_s", "scoring_s", "memory_s",
          "engine_us_step_live", "driver_us_step_live", "driver_ms_step")


def best_of(rows: list[dict]) -> dict:
    """One row of ``rows`` (repeats of one run, same work) with each time its minimum."""
    out = dict(rows[0])
    for k in _TIMES:
        out[k] = min(r[k] for r in rows)
    out["repeats"] = len(rows)
    return out


def _table(rows: list[dict]) -> str:
    head = (f"{'method':<8}{'N':>6}{'steps':>7}{'live':>8}{'nodes':>7}{'engine_s':>10}"
            f"{'driver_s':>10}{'eng us/ev':>11}{'drv us/ev':>11}{'eng x':>7}{'drv x':>7}")
    lines = [head]
    for r in rows:
        lines.append(f"{r['method']:<8}{r['traces']:>6}{r['steps']:>7}{r['mean_live']:>8}"
                     f"{r['nodes']:>7}{r['engine_s']:>10.3f}{r['driver_s']:>10.3f}"
                     f"{r['engine_us_step_live']:>11.2f}{r['driver_us_step_live']:>11.2f}"
                     f"{r['engine_vs_first']:>7.2f}{r['driver_vs_first']:>7.2f}")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--traces", type=int, nargs="+", default=[256, 1024],
                   help="traces per question (N; Gambit's C = N)")
    p.add_argument("--methods", nargs="+", default=["gambit", "sc"])
    p.add_argument("--questions", type=int, default=1, help="toy:val questions per run")
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--num-blocks", type=int, default=None,
                   help="fake engine KV blocks (default: ample for N traces)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeats", type=int, default=1,
                   help="runs per point; each time is the minimum over them")
    p.add_argument("--profile", type=Path, default=None,
                   help="cProfile each run: <dir>/<method>_<N>.prof and a top-15 to stdout")
    p.add_argument("--out", type=Path, default=None, help="write the rows as JSON here")
    a = p.parse_args()
    rows: list[dict] = []
    for method in a.methods:
        first: dict | None = None
        for n in sorted(a.traces):
            r = best_of([run_one(method, n, a.questions, a.max_tokens, a.num_blocks, a.seed,
                                 a.profile) for _ in range(max(1, a.repeats))])
            first = first or r
            r["engine_vs_first"] = round(
                r["engine_us_step_live"] / max(first["engine_us_step_live"], 1e-9), 3)
            r["driver_vs_first"] = round(
                r["driver_us_step_live"] / max(first["driver_us_step_live"], 1e-9), 3)
            rows.append(r)
    print(_table(rows))
    if a.out is not None:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps({"args": {k: str(v) if isinstance(v, Path) else v
                                              for k, v in vars(a).items()},
                                     "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
