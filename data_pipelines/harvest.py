"""gambit-harvest: rollouts on vLLM -> a graded dataset of boundary hidden states.

For every question it samples ``--n`` traces through the search driver (SC with a
recorder: the one engine loop gambit-solve runs; grading and shard writes on a thread of
their own), records the
policy's last-layer hidden state at every thought boundary, grades the final answer, and
writes one parquet row per trace (schema: ``gambit_scorer.harvest_io.HARVEST_SCHEMA``).

    gambit-harvest --dataset toy:train:300 --n 16 --out harvests/toy-train
    gambit-harvest --model Qwen/Qwen3-8B --dataset ../shared/benchmarks/hmmt_2012_2023.jsonl \\
        --n 64 --temperature 0.6 --top-p 0.95 --top-k 20 --max-tokens 32768 --out h --shard 0/4

Crash safety: questions are cut into fixed chunks (``--questions-per-shard``); a chunk's
shard ``data/shard-00007.parquet`` is written to a temporary name and renamed when complete, so
after ``kill -9`` the same command skips finished chunks and redoes the rest: every
question lands exactly once. ``--shard i/n`` takes chunks ``c`` with ``c % n == i``, and
each trace's seed depends only on (seed, question id, trace index), so the shards of n
machines together equal one unsharded run. ``harvest_config.json`` pins the model and
sampling config of a directory (a different one is refused); ``manifest.json`` is written
last, once every chunk exists. Read it with ``gambit_scorer.harvest_io.iter_traces(DIR)`` or
``datasets.load_dataset("parquet", data_dir=f"{DIR}/data")``.

Process labels (:mod:`data_pipelines.labels`, docs/SCORER.md): on toy questions every row
also gets the exact per-boundary ``prefix_labels`` (is the arithmetic still clean here?).
``--mc-labels K`` adds Monte-Carlo labels after the sampling: from the first boundary and
every ``--mc-every``-th one after it, K continuations forked through the prefix cache;
label 1 if any reaches gold. They go to ``mc/shard-N.parquet`` beside each data shard, so
the flag also labels a finished harvest (rerun the same command with it), resumes like the
sampling, and ``--mc-max-forks`` caps one run's continuations::

    gambit-harvest --dataset toy:train:300 --n 16 --out harvests/toy-train --mc-labels 4 --mc-every 2
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

from gambit_core.errors import InputError
from gambit_core.runio import (
    RUN_ONLY,
    atomic_write,
    claim_dir,
    fingerprint,
    replace_fsynced,
    versions,
)
from gambit_core.sampling import SamplingConfig
from gambit_search.engines import EngineSettings

DEFAULT_MODEL = EngineSettings.model
CONFIG_NAME = "harvest_config.json"


@dataclass(kw_only=True)
class HarvestConfig(SamplingConfig, EngineSettings):
    """One harvest run (the sampling fields: :class:`gambit_core.sampling.SamplingConfig`;
    the engine's: :class:`gambit_search.engines.EngineSettings`)."""

    out: str = field(metadata=RUN_ONLY)
    """Output directory (created; resumed when it holds a harvest of the same config)."""
    dataset: str = "toy:train:300"
    """Questions: JSONL path, local HF dataset, or toy:<split>[:count]."""
    n: int = 16
    """Traces per question."""
    shard: str = field(default="0/1", metadata=RUN_ONLY)
    """``i/n``: this process harvests chunks c with c % n == i."""
    max_questions: int | None = None
    """Use only the first N questions."""
    questions_per_shard: int = 16
    """Questions per output shard (the unit of crash recovery)."""
    mc_labels: int = field(default=0, metadata=RUN_ONLY)
    """Monte-Carlo labels: continuations forked per labelled boundary (0: off). Pinned for the
    directory in mc/mc_config.json, not in the harvest's config: a finished harvest can get them."""
    mc_every: int = field(default=1, metadata=RUN_ONLY)
    """Monte-Carlo labels at the first boundary of a trace and every N-th after it."""
    mc_max_forks: int | None = field(default=None, metadata=RUN_ONLY)
    """Most Monte-Carlo continuations this run samples (whole shards; rerun for the rest)."""

    def shard_index(self) -> tuple[int, int]:
        try:
            i, n = (int(x) for x in self.shard.split("/"))
        except ValueError:
            raise InputError(f"--shard must look like i/n (e.g. 0/4), got {self.shard!r}") from None
        if not (n >= 1 and 0 <= i < n):
            raise InputError(f"--shard {self.shard}: need 0 <= i < n")
        return i, n


# ---------------------------------------------------------------- engine


def _make_engine(cfg: HarvestConfig):
    """(engine, boundary ids), from the engine registry."""
    from gambit_search.data_parallel import start_ranks
    from gambit_search.engines import get_engine_kind

    kind = get_engine_kind(cfg.engine)
    engines = start_ranks(kind, cfg.engine_settings(seed=cfg.seed, confidence=True,
                                                    extra={"log_stats": False}))
    ids = sorted(getattr(engines[0], "boundary_ids", None) or kind.facts(cfg.model).boundary_ids)
    return (engines if len(engines) > 1 else engines[0]), ids


# ---------------------------------------------------------------- one chunk


def _thought_confidence(logprobs, boundary_offsets: list[int]) -> tuple[list[float], list[float]]:
    """Mean and min log-prob of the sampled tokens of each thought (the tokens after the
    previous boundary up to and including this one). Unknown (NaN) values are left out; a
    thought with none known gets NaN (the engine knows every token up to the last boundary
    state it emitted, so this does not happen in a harvest). The same per-thought values the
    search feeds a confidence-trained scorer at run time."""
    from gambit_search.scoring import thought_confidence  # the run-time definition

    means, mins, start = [], [], 0
    for b in boundary_offsets:
        m, n = thought_confidence(logprobs, start, b)
        means.append(m)
        mins.append(n)
        start = b + 1
    return means, mins


class _Recorder:
    """The harvest's :class:`~gambit_search.jobs.Recorder`: the driver runs SC over every
    question and hands this each boundary state and each trace's end; the per-trace work
    (grading, confidences, stacking the states) and the shard writes run on a thread of
    their own, off the engine loop. ``question_done`` marks a question whose traces have
    all ended (its result came out of the driver); a chunk whose questions are all done is
    written as one shard."""

    def __init__(self, engine, decode, work: list[tuple[int, list]], on_chunk_done) -> None:
        import queue
        import threading

        self.eng, self.decode = engine, decode
        self.hidden_size = engine.hidden_size
        self.on_chunk_done = on_chunk_done
        self.chunk_of = {str(q.id): c for c, qs in work for q in qs}
        self.question = {str(q.id): q for _, qs in work for q in qs}
        self.left = {c: len(qs) for c, qs in work}  # questions not yet done, per chunk
        self.rows: dict[int, list[dict]] = {c: [] for c, _ in work}
        self.states: dict[tuple[str, int], dict[int, object]] = {}
        self.error: BaseException | None = None
        self._q: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._work, name="gambit-harvest-rows", daemon=True)
        self._thread.start()

    # -- the driver's thread: cheap hand-offs only
    def on_boundary(self, qid: str, node: int, event) -> None:
        self.states.setdefault((qid, node), {})[event.output_index] = event.hidden

    def on_trace_end(self, qid: str, node: int, trace: int, finish_reason: str,
                     error: str | None, text: str | None) -> None:
        ids = list(self.eng.trace_info(trace).output_ids)
        lps = self.eng.sampled_logprobs(trace)
        self._q.put(("trace", qid, node, ids, text, self.states.pop((qid, node), {}), lps,
                     finish_reason, error))

    def question_done(self, qid: str) -> None:
        self._check()
        for key in [k for k in self.states if k[0] == qid]:  # aborted traces' states
            del self.states[key]
        self._q.put(("question", qid))

    def close(self) -> None:
        """Wait for the thread to write what it has; re-raise its error."""
        self._q.put(None)
        self._thread.join()
        self._check()

    def _check(self) -> None:
        if self.error is not None:
            raise self.error

    # -- the writer thread
    def _work(self) -> None:
        while (item := self._q.get()) is not None:
            if self.error is not None:
                continue  # drain: the driver's thread re-raises
            try:
                self._trace(*item[1:]) if item[0] == "trace" else self._question(item[1])
            except BaseException as e:  # noqa: BLE001 - handed to the driver's thread
                self.error = e

    def _trace(self, qid, node, ids, text, states, lps, finish, error) -> None:
        import numpy as np

        from gambit_core.grading import grade

        q = self.question[qid]
        offs = sorted(states)
        hidden = (np.stack([states[o] for o in offs]) if offs
                  else np.zeros((0, self.hidden_size), np.float32))
        if text is None:  # an error: what it had written
            text = self.decode(ids)
        answer, correct = grade(q.answer, text) if finish != "error" else (None, False)
        cm, cn = _thought_confidence(lps, offs)
        from data_pipelines.labels import toy_prefix_labels
        self.rows[self.chunk_of[qid]].append({
            "question_id": q.id, "question": q.question, "gold": q.answer,
            "trace_index": node, "token_ids": ids, "text": text, "answer": answer,
            "correct": bool(correct), "boundary_positions": offs, "hidden_states": hidden,
            "conf_mean": cm, "conf_min": cn, "n_tokens": len(ids),
            "prefix_labels": toy_prefix_labels(q.question, ids, offs, self.decode),
            "_error": error if finish == "error" else None,
        })

    def _question(self, qid: str) -> None:
        c = self.chunk_of[qid]
        self.left[c] -= 1
        if self.left[c] == 0:
            done = sorted(self.rows.pop(c), key=lambda r: (r["question_id"], r["trace_index"]))
            self.on_chunk_done(c, done)


def _sample(cfg: HarvestConfig, engine, work: list[tuple[int, list]], chunk_done, bar) -> None:
    """Every question of ``work`` through the driver as SC with the harvest's recorder: the
    one engine loop gambit-solve runs. Questions are admitted on the engine's live traces
    (``admit_on_live``) with one question's traces waiting in vLLM's queue beyond
    ``--max-live``, so a question's last traces never leave the engine short of work."""
    from gambit_search.driver import Driver, DriverConfig
    from gambit_search.engine import SamplingSpec
    from gambit_search.engines import get_engine_kind
    from gambit_search.methods import get_method

    kind = get_engine_kind(cfg.engine)
    prompt = kind.prompt_ids(getattr(engine, "tokenizer", None))
    decode = kind.decoder(engine)
    # log-probs come from the engine's sampled_logprobs (read in the capture hook), not
    # from vLLM's per-request logprob path: that one cost 10-35 % of the throughput
    # stream=False: the harvest reads whole traces only, so vLLM builds no per-step outputs
    spec = SamplingSpec(temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k,
                        max_tokens=cfg.max_tokens, stream=False)
    rec = _Recorder(engine, decode, work, chunk_done)
    drv = Driver(engine, get_method("sc").bind(n=cfg.n), prompt_ids=lambda q: prompt(q.question),
                 decode=decode, spec=spec, recorder=rec,
                 config=DriverConfig(max_live=cfg.max_live, queue=cfg.n, admit_on_live=True,
                                     seed=cfg.seed, log_memory=False))
    try:
        for r in drv.run([q for _, qs in work for q in qs]):
            rec.question_done(r["id"])
            bar.update(cfg.n)
    finally:
        rec.close()


def _write_shard(out: Path, chunk: int, rows: list[dict]) -> None:
    import pyarrow.parquet as pq

    from gambit_scorer.harvest_io import HarvestTrace, traces_to_table

    failed = sorted({(r["question_id"], r["_error"]) for r in rows if r["_error"]})
    traces = [HarvestTrace(**{k: v for k, v in r.items() if not k.startswith("_")}) for r in rows]
    path = out / "data" / f"shard-{chunk:05d}.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    if failed:  # the side file first: it only counts once the shard exists
        (out / f"failed-{chunk:05d}.json").write_text(json.dumps([{"question_id": q, "error": e} for q, e in failed]))
    tmp = path.with_suffix(".parquet.tmp")
    pq.write_table(traces_to_table(traces), tmp)
    replace_fsynced(tmp, path)


# ---------------------------------------------------------------- driver


RESUMABLE_ACROSS = ("max_live", "kv_cache")
"""Engine settings a resume may change: SC's traces do not depend on the engine's capacity
(each trace's seed is its own)."""


def _check_config(out: Path, cfg: HarvestConfig, ident: dict) -> None:
    want = {k: v for k, v in fingerprint(cfg).items() if k not in RESUMABLE_ACROSS} | ident
    claim_dir(out, CONFIG_NAME, want, what="harvest")


def summarize(out: Path) -> dict:
    """Accuracy, pass@n, majority@n, tokens and boundaries per trace over the shards present."""
    import pyarrow.dataset as pads

    files = sorted(out.glob("data/shard-*.parquet"))
    if not files:
        return {"traces": 0}
    t = pads.dataset([str(f) for f in files]).to_table(columns=["question_id", "answer", "correct", "n_tokens", "boundary_positions"])
    d = t.to_pydict()
    by_q: dict[str, list] = {}
    for qid, a, c in zip(d["question_id"], d["answer"], d["correct"], strict=True):
        by_q.setdefault(qid, []).append((a, c))
    from gambit_core.vote_bins import majority_correct

    maj = sum(majority_correct([a for a, _ in rows], [c for _, c in rows])[1] for rows in by_q.values())
    n = len(d["correct"])
    return {
        "questions": len(by_q), "traces": n, "accuracy": sum(d["correct"]) / n,
        "pass@n": sum(any(c for _, c in r) for r in by_q.values()) / len(by_q),
        "majority@n": maj / len(by_q),
        "tokens_per_trace": sum(d["n_tokens"]) / n,
        "boundaries_per_trace": sum(len(b) for b in d["boundary_positions"]) / n,
        "correct": int(sum(d["correct"])),
    }


def harvest(cfg: HarvestConfig, engine=None) -> dict:
    """Run (or resume) a harvest; returns the summary (and the manifest once complete).

    ``engine``: an already started :class:`~gambit_search.engine.Engine` on ``cfg.model``
    to use instead of starting one (tests and benchmarks share one); it is left open."""
    from gambit_core.errors import DatasetError
    from gambit_core.questions import load_questions

    shard_i, shard_n = cfg.shard_index()
    from gambit_search.engines import get_engine_kind

    kind = get_engine_kind(cfg.engine)  # InputError naming the known engines
    cfg.check_sampling()
    if cfg.mc_labels < 0 or (cfg.mc_max_forks is not None and cfg.mc_max_forks < 0):
        raise InputError(f"--mc-labels and --mc-max-forks must be >= 0, got {cfg.mc_labels}, {cfg.mc_max_forks}")
    for name in ("n", "questions_per_shard", "mc_every"):
        if getattr(cfg, name) < 1:
            raise InputError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(cfg, name)}")
    if Path(cfg.out).exists() and not Path(cfg.out).is_dir():
        raise InputError(f"--out {cfg.out} exists and is not a directory")
    if kind.reads_model and cfg.model.startswith((".", "/", "~")) and not Path(cfg.model).expanduser().is_dir():
        raise InputError(f"model path {cfg.model} does not exist")
    try:
        questions = load_questions(cfg.dataset, max_questions=cfg.max_questions)
    except (DatasetError, OSError, ValueError) as e:
        raise InputError(f"cannot read dataset {cfg.dataset!r}: {e}") from None
    out = Path(cfg.out)
    ident = kind.identity(cfg.model)
    m_hash, t_hash = ident["model_hash"], ident["tokenizer_hash"]
    _check_config(out, cfg, ident)
    K = cfg.questions_per_shard
    chunks = [questions[c * K : (c + 1) * K] for c in range((len(questions) + K - 1) // K)]
    mine = [c for c in range(len(chunks)) if c % shard_n == shard_i and not (out / "data" / f"shard-{c:05d}.parquet").exists()]
    for stale in out.glob("data/*.tmp"):
        stale.unlink()
    print(f"gambit-harvest: {len(questions)} questions in {len(chunks)} shards; this process: {len(mine)} to do "
          f"(shard {cfg.shard})", file=sys.stderr)
    own_engine = engine is None
    started: list = [] if own_engine else [(engine, sorted(getattr(engine, "boundary_ids", [])) or [4])]

    def engine_of():
        if not started:
            started.append(_make_engine(cfg))
        return started[0][0]

    try:
        return _run(cfg, out, questions, chunks, mine, (shard_i, shard_n), kind, engine_of, started, m_hash, t_hash)
    finally:
        if own_engine and started:
            started[0][0].close()


def _run(cfg, out, questions, chunks, mine, shard, kind, engine_of, started, m_hash, t_hash) -> dict:
    shard_i, shard_n = shard
    if mine:
        from tqdm import tqdm

        engine = engine_of()
        boundary_ids = started[0][1]
        stats = Counter()
        t0 = time.time()
        bar = tqdm(total=sum(len(chunks[c]) for c in mine) * cfg.n, unit="trace", desc="harvest",
                   dynamic_ncols=True)

        def chunk_done(c: int, rows: list[dict]) -> None:  # on the recorder's thread
            _write_shard(out, c, rows)
            stats["right"] += sum(r["correct"] for r in rows)
            stats["done"] += len(rows)
            stats["shards"] += 1
            bar.set_postfix(acc=f"{stats['right'] / max(1, stats['done']):.3f}",
                            traces_per_s=f"{stats['done'] / (time.time() - t0):.1f}",
                            shards=f"{stats['shards']}/{len(mine)}")

        try:
            work = [(c, chunks[c]) for c in mine]
            if isinstance(engine, list):  # data parallel: each chunk whole on one rank
                import threading

                from gambit_search.data_parallel import on_ranks

                lock = threading.Lock()

                def done(c: int, rows: list[dict]) -> None:
                    with lock:
                        chunk_done(c, rows)

                on_ranks(engine, work, len, lambda e, w: _sample(cfg, e, w, done, bar),
                         "its unwritten shards are left for the rerun of this command")
                engine = engine[0]
            else:
                from gambit_search.data_parallel import RankDied, one_line
                from gambit_search.engine import EngineDied

                try:
                    _sample(cfg, engine, work, chunk_done, bar)
                except EngineDied as e:  # the written shards are kept
                    raise RankDied(f"the engine died ({one_line(e)}): its unwritten shards are "
                                   "left for the rerun of this command") from e
        finally:
            bar.close()
        sampling_seconds = time.time() - t0
        meta = {"hidden_size": engine.hidden_size, "boundary_token_ids": boundary_ids}
        (out / f"engine-{shard_i}of{shard_n}.json").write_text(json.dumps(meta))
    summary = summarize(out)
    if mine:
        summary["sampling_seconds"] = round(sampling_seconds, 3)
    if cfg.mc_labels:
        from data_pipelines.labels import MCPlan, mc_pass

        t1 = time.time()
        sampling = {k: getattr(cfg, k) for k in ("temperature", "top_p", "top_k", "max_tokens")}
        plan = MCPlan(k=cfg.mc_labels, every=cfg.mc_every, seed=cfg.seed, max_forks=cfg.mc_max_forks)
        def one_engine():  # Monte-Carlo labels run on rank 0's engine
            e = engine_of()
            return e[0] if isinstance(e, list) else e

        summary |= mc_pass(out, [c for c in range(len(chunks)) if c % shard_n == shard_i], plan, sampling,
                           one_engine, kind, cfg.max_live)
        summary["mc_seconds"] = round(time.time() - t1, 3)
    complete = all((out / "data" / f"shard-{c:05d}.parquet").exists() for c in range(len(chunks)))
    if complete:
        summary["manifest"] = str(_write_manifest(out, cfg, m_hash, t_hash, len(questions), summary))
    print(json.dumps(summary, indent=1))
    return summary


def _write_manifest(out: Path, cfg: HarvestConfig, m_hash: str, t_hash: str, n_questions: int, summary: dict) -> Path:
    engine_meta = [json.loads(p.read_text()) for p in sorted(out.glob("engine-*.json"))]
    if not engine_meta:
        raise RuntimeError(f"{out}: no engine-*.json: the harvest did not finish a shard here")
    failed = [x for p in sorted(out.glob("failed-*.json")) for x in json.loads(p.read_text())]
    flags = cfg.__dataclass_fields__
    cfgd = {k: v for k, v in asdict(cfg).items() if flags[k].metadata.get("flag") is not False}
    manifest = {
        "model": cfg.model, "model_hash": m_hash, "tokenizer_hash": t_hash,
        "hidden_size": engine_meta[0]["hidden_size"], "boundary_token_ids": engine_meta[0]["boundary_token_ids"],
        "sampling": {k: cfgd[k] for k in ("temperature", "top_p", "top_k", "max_tokens", "n")},
        "seed": cfg.seed, "dataset": cfg.dataset, "config": cfgd, "versions": versions(),
        "counts": {"questions": n_questions, "traces": summary["traces"], "correct": summary["correct"],
                   "failed_questions": len({f["question_id"] for f in failed})},
        "failed": failed, "summary": {k: v for k, v in summary.items() if k != "manifest"},
        "labels": _label_kinds(out),
    }
    path = out / "manifest.json"
    atomic_write(path, json.dumps(manifest, indent=2))
    return path


def _label_kinds(out: Path) -> dict:
    """Which process labels the harvest holds (docs/SCORER.md): prefix (every trace has
    them) and mc (its config and coverage), for the manifest."""
    import pyarrow.compute as pc

    from data_pipelines.labels import mc_summary
    from gambit_scorer.harvest_io import _dataset

    col = _dataset(out).to_table(columns=["prefix_labels"]).column("prefix_labels")
    return {"outcome": True, "prefix": bool(len(col)) and int(pc.sum(pc.is_null(col)).as_py()) == 0,
            "mc": mc_summary(out)}


def main(argv: list[str] | None = None) -> None:
    from gambit_core.cli import add_dataclass_args, add_verbose_arg, input_errors, quiet_logs

    p = argparse.ArgumentParser(prog="gambit-harvest", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    add_verbose_arg(p)
    add_dataclass_args(p, HarvestConfig, required=("out",))
    a = vars(p.parse_args(argv))
    quiet_logs(a.pop("verbose"))
    from gambit_search.data_parallel import rank_errors

    with input_errors(p.prog), rank_errors(p.prog):
        harvest(HarvestConfig(**a))


if __name__ == "__main__":
    main()
