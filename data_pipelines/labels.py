"""Per-boundary process labels for a harvest, beside each trace's outcome label.

Two kinds (``gambit-train data.labels=prefix|mc`` trains on them; docs/SCORER.md):

* **prefix** (toy questions only, exact, free): whether the trace's arithmetic is still clean
  after the thought each boundary closes (:mod:`data_pipelines.toy.steps`). Written by the
  sampling pass into the data shard's ``prefix_labels`` column; null for other datasets.
* **mc** (any model, opt-in, costs k continuations per labelled boundary): from boundary b
  of a trace, k continuations are sampled with the harvest's sampling settings; the label is
  1 if any reaches the gold answer (Math-Shepherd's hard estimate), the hit count is kept
  too. The k continuations share the boundary's prefix through the engine's prefix cache:
  the first is a trace on the prompt + the trace's tokens through b, the other k - 1 are
  :meth:`~gambit_search.engine.Engine.fork` s of it at that point. A pass over finished data
  shards writes ``mc/shard-N.parquet`` next to ``data/shard-N.parquet`` (atomically, so a
  crash loses at most the shard in progress and a rerun carries on); ``mc/mc_config.json``
  pins k, every and the sampling settings. Every continuation's seed depends only on (seed,
  question id, trace index, boundary, j), so the labels do not depend on the order, the
  budget, or how many runs it took.

    from data_pipelines.labels import mc_label_traces
    labels, hits = mc_label_traces(engine, traces, spec, k=4, every=2, seed=0, decode=decode)[0]
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np


def toy_prefix_labels(question: str, ids: Sequence[int], boundary_offsets: Sequence[int],
                      decode: Callable[[Sequence[int]], str]) -> list[int] | None:
    """The toy world's exact per-boundary labels of one trace (None: not a toy question)."""
    from data_pipelines.toy.steps import clean_at_boundaries
    from data_pipelines.toy.task import parse_question

    try:
        q = parse_question(question)
    except ValueError:
        return None
    return clean_at_boundaries(q, [decode(list(ids[: b + 1])) for b in boundary_offsets])


# ----------------------------------------------------------------------------- Monte Carlo


@dataclass(frozen=True)
class MCTrace:
    """What labelling one harvested trace needs."""

    question_id: str
    trace_index: int
    gold: str
    prompt_ids: tuple[int, ...]
    """The trace's prompt (the question as the policy saw it)."""
    token_ids: tuple[int, ...]
    """Its output tokens."""
    boundary_positions: tuple[int, ...]
    """Output offsets of its boundary tokens."""


def mc_boundaries(n_boundaries: int, every: int) -> list[int]:
    """The boundaries (0-based) a trace's Monte-Carlo pass labels: the first, then every
    ``every``-th one after it."""
    return list(range(0, n_boundaries, every))


def mc_seed(seed: int, question_id: str, trace_index: int, boundary: int, j: int) -> int:
    """The seed of continuation ``j`` from ``boundary`` of a trace (order-independent)."""
    key = f"mc|{seed}|{question_id}|{trace_index}|{boundary}|{j}".encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=4).digest(), "big") & 0x7FFFFFFF


def mc_label_traces(engine: Any, traces: Sequence[MCTrace], spec: Any, *, k: int, every: int,
                    seed: int, decode: Callable[[Sequence[int]], str], max_live: int = 256,
                    on_done: Callable[[int], None] | None = None) -> list[tuple[np.ndarray, np.ndarray]]:
    """(labels int8, hits int16) per trace, one entry per boundary (-1: not labelled).

    From each labelled boundary b, ``k`` continuations with ``spec`` (its ``max_tokens`` is
    the trace's whole budget; a continuation gets what was left at b): a trace on the prompt +
    the tokens through b, and ``k - 1`` forks of it at that point (the prefix cache serves
    the shared prefix). A continuation counts as a hit when the prefix + its text grades
    right against the trace's gold; an engine error is a miss. ``on_done(n)``: n more
    continuations finished (a progress bar)."""
    from gambit_core.grading import grade

    if k < 1 or every < 1:
        raise ValueError(f"need k >= 1 and every >= 1, got k={k}, every={every}")
    hits = [np.full(len(t.boundary_positions), -1, np.int16) for t in traces]
    jobs = [(ti, b) for ti, t in enumerate(traces) for b in mc_boundaries(len(t.boundary_positions), every)]
    jobs.reverse()  # pop() from the end: traces in order, so one trace's prefixes share the cache
    live: dict[int, tuple[int, int]] = {}
    while jobs or live:
        while jobs and (not live or len(live) + k <= max_live):
            ti, b = jobs.pop()
            t = traces[ti]
            cut = int(t.boundary_positions[b]) + 1
            hits[ti][b] = 0
            budget = spec.max_tokens - cut
            if budget < 1:  # the trace's budget ends at this boundary: no continuation can answer
                if on_done:
                    on_done(k)
                continue
            stem = engine.add_trace(list(t.prompt_ids) + list(t.token_ids[:cut]),
                                    replace(spec, max_tokens=budget),
                                    seed=mc_seed(seed, t.question_id, t.trace_index, b, 0))
            live[stem] = (ti, b)
            for j in range(1, k):
                live[engine.fork(stem, at=0, seed=mc_seed(seed, t.question_id, t.trace_index, b, j))] = (ti, b)
        for d in engine.step().deltas:
            if d.finish_reason is None or d.trace not in live:
                continue
            ti, b = live.pop(d.trace)
            t = traces[ti]
            if d.finish_reason != "error":
                out = engine.trace_info(d.trace).output_ids
                cut = int(t.boundary_positions[b]) + 1
                hits[ti][b] += bool(grade(t.gold, decode(list(t.token_ids[:cut]) + list(out)))[1])
            engine.release(d.trace)
            if on_done:
                on_done(1)
    return [(np.where(h < 0, -1, h > 0).astype(np.int8), h) for h in hits]


# ----------------------------------------------------------------------------- the pass


@dataclass(frozen=True)
class MCPlan:
    """One Monte-Carlo pass over a harvest directory."""

    k: int
    """Continuations per labelled boundary."""
    every: int
    """Label the first boundary and every ``every``-th after it."""
    seed: int
    """The harvest's seed (continuation seeds derive from it)."""
    max_forks: int | None
    """Most continuations this run samples (None: no limit); shards are labelled whole."""


def _shard_traces(path: Path, prompt: Callable[[str], list[int]]) -> list[MCTrace]:
    import pyarrow.parquet as pq

    cols = ["question_id", "question", "gold", "trace_index", "token_ids", "boundary_positions"]
    d = pq.read_table(path, columns=cols).to_pydict()
    prompts: dict[str, tuple[int, ...]] = {}
    out = []
    for q, text, gold, i, ids, bpos in zip(*(d[c] for c in cols), strict=True):
        if q not in prompts:
            prompts[q] = tuple(prompt(text))
        out.append(MCTrace(q, int(i), gold, prompts[q], tuple(ids), tuple(bpos)))
    return out


def _write_mc_shard(path: Path, traces: Sequence[MCTrace], labels: Iterable[tuple[np.ndarray, np.ndarray]]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from gambit_core.runio import replace_fsynced
    from gambit_scorer.harvest_io import MC_SCHEMA

    rows = [{"question_id": t.question_id, "trace_index": t.trace_index, "mc_labels": lab.tolist(),
             "mc_hits": h.tolist()} for t, (lab, h) in zip(traces, labels, strict=True)]
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".parquet.tmp")
    pq.write_table(pa.Table.from_pylist(rows, schema=MC_SCHEMA), tmp)
    replace_fsynced(tmp, path)


def mc_pass(out: Path, chunks: Sequence[int], plan: MCPlan, sampling: dict, engine_of: Callable[[], Any],
            kind: Any, max_live: int) -> dict:
    """Label the finished data shards ``chunks`` of harvest ``out`` that have no MC shard yet,
    within ``plan.max_forks``; returns counts. ``engine_of()`` gives the engine (started only
    when there is work); ``sampling``: the harvest's temperature, top_p, top_k, max_tokens."""
    from tqdm import tqdm

    from gambit_core.runio import claim_dir
    from gambit_scorer.harvest_io import MC_CONFIG_NAME, MC_DIR, mc_shard_path
    from gambit_search.engine import SamplingSpec

    claim_dir(out / MC_DIR, MC_CONFIG_NAME, {"k": plan.k, "every": plan.every, "seed": plan.seed, **sampling},
              what="Monte-Carlo labelling")
    for stale in (out / MC_DIR).glob("*.tmp"):
        stale.unlink()
    todo = [out / "data" / f"shard-{c:05d}.parquet" for c in chunks]
    todo = [p for p in todo if p.exists() and not mc_shard_path(p).exists()]
    if not todo:
        return {"mc_shards_done": 0, "mc_shards_left": 0, "mc_forks": 0}
    import pyarrow.parquet as pq

    def forks_of(p: Path) -> int:
        b = pq.read_table(p, columns=["boundary_positions"]).column("boundary_positions").to_pylist()
        return plan.k * sum(len(mc_boundaries(len(x), plan.every)) for x in b)

    sizes = [forks_of(p) for p in todo]
    n_fit, total = 0, 0
    for s in sizes:
        if plan.max_forks is not None and total + s > plan.max_forks:
            break
        n_fit, total = n_fit + 1, total + s
    if n_fit < len(todo):
        print(f"gambit-harvest: --mc-max-forks {plan.max_forks} covers {n_fit} of the {len(todo)} shards "
              f"without MC labels ({sum(sizes)} continuations in all); rerun to label the rest",
              file=sys.stderr)
    if n_fit == 0:
        return {"mc_shards_done": 0, "mc_shards_left": len(todo), "mc_forks": 0}
    engine = engine_of()
    prompt = kind.prompt_ids(getattr(engine, "tokenizer", None))
    decode = kind.decoder(engine)
    spec = SamplingSpec(temperature=sampling["temperature"], top_p=sampling["top_p"], top_k=sampling["top_k"],
                        max_tokens=sampling["max_tokens"], stream=False, score=False)
    bar = tqdm(total=total, unit="fork", desc=f"mc labels (k={plan.k})", dynamic_ncols=True)
    try:
        for p in todo[:n_fit]:
            traces = _shard_traces(p, prompt)
            labels = mc_label_traces(engine, traces, spec, k=plan.k, every=plan.every, seed=plan.seed,
                                     decode=decode, max_live=max_live, on_done=bar.update)
            _write_mc_shard(mc_shard_path(p), traces, labels)
    finally:
        bar.close()
    return {"mc_shards_done": n_fit, "mc_shards_left": len(todo) - n_fit, "mc_forks": total}


def mc_summary(out: Path) -> dict | None:
    """The MC labels of a harvest for its manifest: config, shards labelled, label rate."""
    import pyarrow.parquet as pq

    from gambit_scorer.harvest_io import MC_CONFIG_NAME, MC_DIR

    cfg_path = out / MC_DIR / MC_CONFIG_NAME
    if not cfg_path.exists():
        return None
    files = sorted((out / MC_DIR).glob("shard-*.parquet"))
    lab = np.concatenate([np.concatenate(pq.read_table(f, columns=["mc_labels"]).column("mc_labels").to_pylist()
                                         or [[]]) for f in files]) if files else np.zeros(0)
    lab = lab[lab >= 0]
    return {**json.loads(cfg_path.read_text()), "shards": len(files),
            "labelled_boundaries": int(len(lab)), "positive_rate": float(lab.mean()) if len(lab) else None}
