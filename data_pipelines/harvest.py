"""gambit-harvest: rollouts on vLLM -> a graded dataset of boundary hidden states.

For every question it samples ``--n`` traces through the engine adapter, records the
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

One engine loop: the traces run through :class:`gambit_search.driver.Driver` with the ``sc``
method (``--n`` independent traces per question; trace i is the question's node i, seeded
``trace_seed(seed, question id, i)`` as before) and a recorder (:class:`_Recorder`, the
driver's ``recorder`` hook) that keeps each trace's tokens, boundary states and sampled
log-probs; a question's rows are graded when its result arrives and a chunk's shard is
written once all its questions are in. Same rows as the harvest's former own loop for the
same seed; one scheduling difference: ``--max-live`` admits whole questions (a question's n
traces start together; one question always runs, even if n > max_live). A question the
driver refuses to start (blank text; the dataset loaders already reject those) would get
n error rows (no tokens) and an entry in the failed-question side file.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from collections.abc import Sequence
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

DEFAULT_MODEL = str(Path(__file__).resolve().parents[1] / "checkpoints" / "toy-policy")
CONFIG_NAME = "harvest_config.json"


@dataclass(kw_only=True)
class HarvestConfig(SamplingConfig):
    """One harvest run (the sampling fields: :class:`gambit_core.sampling.SamplingConfig`)."""

    out: str = field(metadata=RUN_ONLY)
    """Output directory (created; resumed when it holds a harvest of the same config)."""
    model: str = DEFAULT_MODEL
    """Policy model directory or Hugging Face name (offline)."""
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
    max_live: int = field(default=256, metadata=RUN_ONLY)
    """Most traces live in the engine at once (vLLM's max_num_seqs)."""
    kv_cache: float = field(default=1.0, metadata=RUN_ONLY)
    """KV-cache size in GiB."""
    stream_interval: int = field(default=8, metadata=RUN_ONLY)
    """Deliver generated tokens every N steps (vLLM's ``stream_interval``). The harvest only
    needs whole traces, so batching the deliveries saves vLLM's per-step output building;
    the sampled tokens are the same for any value (not part of the config fingerprint)."""
    engine: str = "vllm"
    """'vllm', or 'fake' (scripted engine: tests and dry runs)."""

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
    from gambit_search.engines import EngineSettings, get_engine_kind

    kind = get_engine_kind(cfg.engine)
    eng = kind.start(EngineSettings(
        model=cfg.model, max_live=cfg.max_live, seed=cfg.seed, kv_cache=cfg.kv_cache,
        confidence=True, extra={"dtype": "auto", "stream_interval": cfg.stream_interval,
                                "log_stats": False}))
    return eng, sorted(getattr(eng, "boundary_ids", None) or kind.facts(cfg.model).boundary_ids)


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


@dataclass(frozen=True)
class _Ask:
    """A question as the driver sees it: no gold, so the driver grades nothing (the harvest
    grades every trace itself, once)."""

    id: str
    question: str
    answer: str = ""


class _Recorder:
    """The driver's :class:`~gambit_search.driver.Recorder`: per live trace its output ids,
    delta texts and boundary states, and at its end its text and sampled log-probs (copied
    before the driver releases the engine trace). Rows are built from these when the
    question's result arrives (:meth:`rows`), off the step loop."""

    def __init__(self, engine, tok, on_trace) -> None:
        self.eng, self.on_trace = engine, on_trace
        self.detok = getattr(getattr(engine, "config", None), "detokenize", True) or tok is None
        self.traces: dict[tuple[str, int], dict] = {}

    def _t(self, qid: str, node: int) -> dict:
        t = self.traces.get((qid, node))
        if t is None:
            t = self.traces[(qid, node)] = {"ids": [], "text": [], "states": {}, "finish": None,
                                             "error": None, "lps": None}
        return t

    def on_boundary(self, qid: str, node: int, b) -> None:
        self._t(qid, node)["states"][b.output_index] = b.hidden

    def on_delta(self, qid: str, node: int, d) -> None:
        t = self._t(qid, node)
        t["ids"].extend(d.token_ids)
        if self.detok:
            t["text"].append(d.text)

    def on_trace_end(self, qid: str, node: int, trace: int, finish_reason: str, error, text) -> None:
        import numpy as np

        t = self._t(qid, node)
        t["finish"], t["error"] = finish_reason, error
        # The text: the engine's deltas, or the driver's one decode of the ids where the engine
        # does not detokenize (the harvest's own vLLM engine: cheaper than vLLM's per-token
        # detokenization).
        t["text"] = "".join(t["text"]) if self.detok else (text or "")
        t["lps"] = np.array(self.eng.sampled_logprobs(trace), copy=True)
        self.on_trace()

    def rows(self, q, n: int, hidden_size: int, why: str | None) -> list[dict]:
        """The n rows of question ``q`` (traces the driver never started: error rows)."""
        import numpy as np

        from gambit_core.grading import grade

        out = []
        for i in range(n):
            t = self.traces.pop((str(q.id), i), None)
            if t is None or t["finish"] is None:
                t = {"ids": [], "text": "", "states": {}, "finish": "error", "error": why or "not run",
                     "lps": np.zeros(0, np.float32)}
            offs = sorted(t["states"])
            states = np.stack([t["states"][o] for o in offs]) if offs else np.zeros((0, hidden_size), np.float32)
            text = t["text"] if isinstance(t["text"], str) else "".join(t["text"])
            answer, correct = grade(q.answer, text) if t["finish"] != "error" else (None, False)
            cm, cn = _thought_confidence(t["lps"], offs)
            out.append({
                "question_id": q.id, "question": q.question, "gold": q.answer,
                "trace_index": i, "token_ids": t["ids"], "text": text, "answer": answer,
                "correct": bool(correct), "boundary_positions": offs, "hidden_states": states,
                "conf_mean": cm, "conf_min": cn, "n_tokens": len(t["ids"]),
                "_error": t["error"] if t["finish"] == "error" else None,
            })
        return out


def _run(cfg: HarvestConfig, engine, tok, work: list[tuple[int, list]], progress, on_chunk_done) -> None:
    """Sample every (chunk, questions) in ``work`` through one :class:`~gambit_search.driver.Driver`
    (method ``sc``: ``cfg.n`` independent traces per question, trace i seeded
    ``trace_seed(seed, question id, i)``); call ``on_chunk_done(chunk, rows)`` as each chunk
    completes. Every chunk's questions go to one ``driver.run()``, so traces of the next
    chunks start while a chunk's last traces finish and the engine stays full."""
    from gambit_search.driver import Driver, DriverConfig
    from gambit_search.engine import SamplingSpec
    from gambit_search.engines import get_engine_kind
    from gambit_search.methods import get_method

    kind = get_engine_kind(cfg.engine)
    prompt = kind.prompt_ids(tok)
    # log-probs come from the engine's sampled_logprobs (read in the recorder), not from
    # vLLM's per-request logprob path: that one cost 10-35 % of the throughput
    spec = SamplingSpec(temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k,
                        max_tokens=cfg.max_tokens)
    rec = _Recorder(engine, tok, progress)
    drv = Driver(engine, get_method("sc").bind(n=cfg.n), prompt_ids=lambda q: prompt(q.question),
                 decode=kind.decoder(engine), spec=spec, recorder=rec,
                 config=DriverConfig(max_live=cfg.max_live, seed=cfg.seed, release=True, log_memory=False))
    chunk_of = {str(q.id): (c, q) for c, qs in work for q in qs}
    left = {c: len(qs) for c, qs in work}
    rows: dict[int, list[dict]] = {c: [] for c, _ in work}
    for res in drv.run([_Ask(str(q.id), q.question) for _, qs in work for q in qs]):
        c, q = chunk_of.pop(res["id"])
        started = bool(res.get("tree"))
        rows[c].extend(rec.rows(q, cfg.n, engine.hidden_size, None if started else res.get("error")))
        if not started:  # never started (e.g. an empty question): n error rows
            for _ in range(cfg.n):
                progress()
        left[c] -= 1
        if left[c] == 0:
            on_chunk_done(c, sorted(rows.pop(c), key=lambda r: (r["question_id"], r["trace_index"])))


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


def _check_config(out: Path, cfg: HarvestConfig, ident: dict) -> None:
    want = fingerprint(cfg) | ident
    claim_dir(out, CONFIG_NAME, want, what="harvest")


def majority_correct(answers: Sequence[str | None], correct: Sequence[bool]) -> tuple[str | None, bool]:
    """The majority answer of one question's traces and whether it is right.

    The vote pools answers over math-verify equivalence bins
    (:func:`gambit_core.vote_bins.majority_vote`: "1/2", "0.5" and "\\frac{1}{2}" are one
    answer; None and empty answers do not vote). The winner is its bin's representative,
    itself one trace's answer, so its correctness is that trace's graded ``correct``: no
    second grading, and a majority verdict never disagrees with the per-trace grade of the
    answer it outputs. ``(None, False)`` when no trace has an answer.
    """
    from gambit_core.vote_bins import majority_vote

    if len(answers) != len(correct):
        raise ValueError(f"{len(answers)} answers but {len(correct)} verdicts")
    winner = majority_vote(answers)
    if winner is None:
        return None, False
    return winner, bool(next(c for a, c in zip(answers, correct, strict=True) if a == winner))


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
    from gambit_core.questions import DatasetError, load_questions

    shard_i, shard_n = cfg.shard_index()
    from gambit_search.engines import get_engine_kind

    kind = get_engine_kind(cfg.engine)  # InputError naming the known engines
    cfg.check_sampling()
    for name in ("n", "questions_per_shard", "max_live"):
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
    if mine:
        from tqdm import tqdm

        if own_engine:
            engine, boundary_ids = _make_engine(cfg)
        else:
            boundary_ids = sorted(getattr(engine, "boundary_ids", [])) or [4]
        tok = getattr(engine, "tokenizer", None)
        stats = Counter()
        t0 = time.time()
        bar = tqdm(total=sum(len(chunks[c]) for c in mine) * cfg.n, unit="trace", desc="harvest", dynamic_ncols=True)

        def progress() -> None:
            bar.update(1)

        def chunk_done(c: int, rows: list[dict]) -> None:
            _write_shard(out, c, rows)
            stats["right"] += sum(r["correct"] for r in rows)
            stats["done"] += len(rows)
            stats["shards"] += 1
            bar.set_postfix(acc=f"{stats['right'] / max(1, stats['done']):.3f}",
                            traces_per_s=f"{stats['done'] / (time.time() - t0):.1f}", shards=f"{stats['shards']}/{len(mine)}")

        try:
            _run(cfg, engine, tok, [(c, chunks[c]) for c in mine], progress, chunk_done)
        finally:
            bar.close()
        sampling_seconds = time.time() - t0
        meta = {"hidden_size": engine.hidden_size, "boundary_token_ids": boundary_ids}
        (out / f"engine-{shard_i}of{shard_n}.json").write_text(json.dumps(meta))
        if own_engine:
            engine.close()
    summary = summarize(out)
    if mine:
        summary["sampling_seconds"] = round(sampling_seconds, 3)
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
    cfgd = asdict(cfg)
    manifest = {
        "model": cfg.model, "model_hash": m_hash, "tokenizer_hash": t_hash,
        "hidden_size": engine_meta[0]["hidden_size"], "boundary_token_ids": engine_meta[0]["boundary_token_ids"],
        "sampling": {k: cfgd[k] for k in ("temperature", "top_p", "top_k", "max_tokens", "n")},
        "seed": cfg.seed, "dataset": cfg.dataset, "config": cfgd, "versions": versions(),
        "counts": {"questions": n_questions, "traces": summary["traces"], "correct": summary["correct"],
                   "failed_questions": len({f["question_id"] for f in failed})},
        "failed": failed, "summary": {k: v for k, v in summary.items() if k != "manifest"},
    }
    path = out / "manifest.json"
    atomic_write(path, json.dumps(manifest, indent=2))
    return path


def main(argv: list[str] | None = None) -> None:
    from gambit_core.cli import add_dataclass_args, input_errors

    p = argparse.ArgumentParser(prog="gambit-harvest", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    add_dataclass_args(p, HarvestConfig, required=("out",))
    a = p.parse_args(argv)
    with input_errors(p.prog):
        harvest(HarvestConfig(**vars(a)))


if __name__ == "__main__":
    main()
