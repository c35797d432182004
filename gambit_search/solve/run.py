"""Run gambit-solve: check and load everything that needs no engine, start one engine, drive
the questions through the method's policies and write each result as it finishes.

    from gambit_search.solve import SolveConfig, solve
    summary = solve(SolveConfig(dataset="toy:test:20", n=16, out="runs/x"))

:func:`prepare` does every check first (config, questions, model facts, the scorer's fit,
the output directory), so bad input fails in a second, before the engine's ~30-60 s start.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from gambit_core.errors import InputError
from gambit_core.runio import atomic_write
from gambit_search.solve.config import (
    PROG,
    SolveConfig,
    check_config,
    flat_params,
    run_fingerprint,
    setting_names,
)
from gambit_search.solve.outputs import prepare_out, read_results, summarize, write_result


def load_run_scorer(cfg: SolveConfig, bound: Any, hidden_size: int | None,
                    boundary_ids: list[int] | None) -> Any:
    """The method's scorer, checked against the model (None when the method scores nothing)."""
    if not bound.method.scores_traces or not cfg.scorer or cfg.scorer == "none":
        return None
    from gambit_scorer.checkpoint import ScorerLoadError, load_scorer

    try:
        return load_scorer(cfg.scorer, expected_hidden_size=hidden_size,
                           expected_boundary_token_ids=boundary_ids)
    except ScorerLoadError as e:
        raise InputError(str(e)) from None


def load_run_questions(cfg: SolveConfig, question: str | None) -> list[Any]:
    """The run's questions: the one given as text, or ``cfg.dataset``'s."""
    from gambit_core.questions import Question, load_questions

    if question is not None:
        return [Question("q0", question, "", "cli")]
    try:
        return load_questions(cfg.dataset, max_questions=cfg.max_questions)
    except (OSError, ValueError) as e:
        raise InputError(f"cannot load dataset {cfg.dataset!r}: {e}") from None


def start_engine(cfg: SolveConfig, needs_confidence: bool = False,
                 scorer: str | None = None) -> tuple[Any, Any]:
    """(engine, decode) for ``cfg``, from the engine registry; ``scorer``: a checkpoint for
    the engine to score boundaries with itself (:func:`engine_scorer`). With
    ``--data-parallel-size`` K > 1 the engine is K engines, one per rank
    (:class:`~gambit_search.data_parallel.Engines`)."""
    from gambit_search.engines import get_engine_kind

    kind = get_engine_kind(cfg.engine)
    settings = cfg.engine_settings(seed=cfg.seed, confidence=needs_confidence, scorer=scorer)
    if cfg.data_parallel_size > 1:
        from gambit_search.data_parallel import start_ranks

        engines = start_ranks(kind, settings)
        return engines, kind.decoder(engines[0])
    eng = kind.start(settings)
    return eng, kind.decoder(eng)


def first_engine(engine: Any) -> Any:
    """The engine, or rank 0's of a data-parallel run's :class:`~gambit_search.data_parallel.
    Engines` (their facts are the same)."""
    return engine[0] if isinstance(engine, list) else engine


def engine_scorer(preps: Sequence[Prepared]) -> str | None:
    """The checkpoint the engine is to score with for these runs: the one scorer they all
    use (``--score-in-engine``, no confidence features, an engine kind that can), else None
    (the driver scores)."""
    from gambit_search.engines import get_engine_kind

    paths = set()
    for p in preps:
        if p.scorer is None:
            continue  # scores nothing
        if (not p.cfg.score_in_engine or p.needs_confidence
                or not get_engine_kind(p.cfg.engine).scores_inside):
            return None  # a driver that scores needs the states: the engine ships them
        paths.add(str(Path(p.cfg.scorer).resolve()))
    return paths.pop() if len(paths) == 1 else None


@dataclass
class Prepared:
    """A run checked and loaded up to (not including) the engine."""

    cfg: SolveConfig
    """The run's settings."""
    question: str | None
    """The one question given as text (None: ``cfg.dataset``)."""
    bound: Any
    """The method bound to its parameters and N (:class:`~gambit_search.methods.BoundMethod`)."""
    questions: list[Any]
    """Every question of the run."""
    scorer: Any
    """The loaded scorer (None: the method scores nothing)."""
    tokenizer: Any
    """The model's tokenizer (None: the fake engine's or the engine's own)."""
    todo: list[Any]
    """The questions not already done in ``cfg.out``."""

    @property
    def method(self) -> Any:
        return self.bound.method

    @property
    def needs_confidence(self) -> bool:
        return bool(self.scorer is not None and self.scorer.needs_confidence)


def prepare(cfg: SolveConfig, question: str | None = None, hidden_size: int | None = None
            ) -> Prepared:
    """Every check that needs no engine (config, questions, model facts, scorer fit, the
    output directory); raises :class:`InputError`."""
    from gambit_search.engines import get_engine_kind

    bound = check_config(cfg, question)
    questions = load_run_questions(cfg, question)
    facts = get_engine_kind(cfg.engine).facts(cfg.model)
    scorer = load_run_scorer(cfg, bound, hidden_size or facts.hidden_size,
                             facts.boundary_ids if bound.method.scores_traces else None)
    done: set[str] = set()
    if cfg.out:
        want = run_fingerprint(cfg, bound, {"model_hash": facts.identity.get("model_hash", "")})
        done = prepare_out(Path(cfg.out), want, defaults=_defaults(bound))
    todo = [q for q in questions if str(q.id) not in done]
    return Prepared(cfg, question, bound, questions, scorer, facts.tokenizer, todo)


def driver_scorer(prep: Prepared, engine: Any) -> Any:
    """The scorer the driver runs itself (a :class:`~gambit_search.scoring.RuntimeScorer`),
    or None: the method scores nothing, or the engine scores with this run's checkpoint."""
    from gambit_search.scoring import RuntimeScorer

    if prep.scorer is None:
        return None
    if (prep.cfg.score_in_engine and engine.scorer_checkpoint is not None
            and engine.scorer_checkpoint == str(Path(prep.cfg.scorer).resolve())
            and not prep.needs_confidence):
        return None
    return RuntimeScorer(prep.scorer.to(scorer_device(prep.cfg.scorer_device)))


def scorer_device(name: str) -> str:
    """``SolveConfig.scorer_device`` resolved: "auto" is cuda when this process sees a GPU
    (an InputError for "cuda" without one)."""
    import torch

    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise InputError("--scorer-device cuda: this process sees no GPU")
    return name


def _defaults(bound: Any) -> dict:
    """Fingerprint values for keys an older run_config.json lacks."""
    d = {f.name: f.default for f in dataclasses.fields(SolveConfig)
         if f.default is not dataclasses.MISSING}
    return d | flat_params(bound.method, bound.method.params())


def run_prepared(prep: Prepared, engine: Any, decode: Any, progress: bool = True,
                 sampling: dict[str, Any] | None = None) -> dict:
    """Solve a prepared run on a started engine (left open); returns the summary, with
    ``results``: this run's rows. ``sampling``: :class:`~gambit_search.engine.SamplingSpec`
    fields over the run's own (benchmarks: ``{"ignore_eos": True}`` for fixed-length
    traces); not part of the run's fingerprint."""
    from gambit_search.driver import Driver, DriverConfig
    from gambit_search.engine import SamplingSpec
    from gambit_search.engines import get_engine_kind
    cfg, bound = prep.cfg, prep.bound
    out = Path(cfg.out) if cfg.out else None
    driver = None
    rows: list[dict] = []
    t0 = time.perf_counter()
    if prep.todo:
        spec = SamplingSpec(temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k,
                            max_tokens=cfg.max_tokens, logprobs=bound.method.logprobs)
        if sampling:
            spec = replace(spec, **sampling)
        kind = get_engine_kind(cfg.engine)
        engines = list(engine) if isinstance(engine, list) else [engine]
        prompt = kind.prompt_ids(prep.tokenizer or getattr(engines[0], "tokenizer", None))
        # the ranks' threads share the tokenizer: one at a time
        lock = threading.Lock() if len(engines) > 1 else contextlib.nullcontext()

        def prompt_ids(q: Any) -> list[int]:
            with lock:
                return prompt(q.question)

        drivers = [Driver(e, bound, prompt_ids=prompt_ids,
                          decode=decode if len(engines) == 1 else kind.decoder(e),
                          spec=spec, scorer=driver_scorer(prep, e),
                          config=DriverConfig(max_live=cfg.max_live, seed=cfg.seed,
                                              admit_on_live=cfg.admit_on_live, queue=cfg.queue,
                                              score_every=cfg.score_every, vote_rule=cfg.rule))
                   for e in engines]
        driver = drivers[0]
        if len(drivers) > 1:
            from gambit_search.data_parallel import DataParallel

            driver = DataParallel(drivers, capacity=cfg.max_live + cfg.queue,
                                  say=lambda m: print(f"{PROG}: {m}", file=sys.stderr,
                                                      flush=True))
        with contextlib.ExitStack() as stack:
            if kind.catches_up:
                for e, d in zip(engines, drivers, strict=True):
                    stack.enter_context(_catching_up(e, cfg.catch_up, d.timing))
            rows = _drive(prep, driver, out, progress)
    wall = time.perf_counter() - t0
    all_rows = read_results(out) if out is not None else rows
    summary = summarize(all_rows, _config_dict(prep), _run_extra(driver, rows, wall))
    if out is not None:
        import json

        atomic_write(out / "results.json", json.dumps(summary, indent=2))
    summary["results"] = rows
    return summary


def _config_dict(prep: Prepared) -> dict:
    d = dataclasses.asdict(replace(prep.cfg, params=None))
    d = {k: v for k, v in d.items() if k in setting_names(SolveConfig) - {"params"}}
    return d | flat_params(prep.bound.method, prep.bound.params)


def _drive(prep: Prepared, driver: Any, out: Path | None, progress: bool) -> list[dict]:
    bar = None
    if progress and prep.cfg.dataset is not None:
        from tqdm import tqdm

        bar = tqdm(total=len(prep.todo), unit="q", desc=f"{PROG} {prep.method.name}",
                   dynamic_ncols=True, file=sys.stderr)
    rows: list[dict] = []
    right = graded = 0
    t0 = time.perf_counter()
    from gambit_search.data_parallel import RankDied, one_line
    from gambit_search.engine import EngineDied

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
                ranks = getattr(driver, "ranks", None)  # data parallel: questions per rank
                bar.set_postfix(acc=f"{right / max(1, graded):.3f}",
                                tok_s=f"{driver.tokens / max(time.perf_counter() - t0, 1e-9):.0f}",
                                **({"ranks": "/".join(str(x.questions) for x in ranks)}
                                   if ranks else {}))
    except EngineDied as e:  # one engine (several: DataParallel says RankDied itself)
        left = len(prep.todo) - len(rows)
        raise RankDied(f"the engine died ({one_line(e)}); {left} question(s) unfinished, "
                       + ("the finished ones are kept: rerun to resume" if out is not None
                          else "nothing is kept without --out")) from e
    finally:
        if bar is not None:
            bar.close()
    return rows


@contextlib.contextmanager
def _catching_up(engine: Any, on: bool, timing: dict) -> Iterator[None]:
    """``engine.catch_up`` set to ``on`` for one run and put back after it (one engine serves
    several runs: solve_bench's grids); ``timing["caught_up"]``: the engine-core outputs it
    took beyond one per driver step (0: the driver kept up)."""
    before, caught0 = engine.catch_up, engine.timing["caught_up"]
    engine.catch_up = on
    try:
        yield
    finally:
        engine.catch_up = before
        timing["caught_up"] = engine.timing["caught_up"] - caught0


def _run_extra(driver: Any, rows: list[dict], wall: float) -> dict:
    """This run's throughput, timing and memory numbers (zeros when nothing ran)."""
    tokens = driver.tokens if driver is not None else 0
    tm = dict(driver.timing) if driver is not None else {
        "engine_s": 0.0, "scoring_s": 0.0, "policy_s": 0.0, "memory_s": 0.0, "other_s": 0.0,
        "wall_s": 0.0, "steps": 0}
    tm["search_overhead_pct"] = round(100 * (tm["scoring_s"] + tm["policy_s"] + tm["memory_s"]
                                             + tm["other_s"]) / max(tm["wall_s"], 1e-9), 3)
    comps = sum(r.get("tree_stats", {}).get("completions", 0) for r in rows)
    cache = {k: sum(r.get("prefix_cache", {}).get(k, 0) for r in rows)
             for k in ("forks", "prompt_tokens", "cached_tokens")}
    log = driver.trace_log if driver is not None else []
    ranks = getattr(driver, "ranks", None)
    return {"wall_s": round(wall, 3), "questions_this_run": len(rows),
            **({"ranks": [dataclasses.asdict(x) for x in ranks]} if ranks else {}),
            "unique_tokens_this_run": tokens,
            "completions_per_s": comps / wall if rows and wall > 0 else None,
            "tokens_per_s": tokens / wall if rows and wall > 0 else None,
            "prefix_cache": cache, "timing": tm,
            "preemptions": driver.preemptions if driver is not None else 0,
            "memory_log": log[:: max(1, len(log) // 2000)]}


def solve(cfg: SolveConfig, question: str | None = None, *, engine: Any = None,
          decode: Any = None, progress: bool = True) -> dict:
    """Run gambit-solve for one method; returns the summary (``results``: this run's rows).

    ``engine`` / ``decode``: an already started engine and its decoder (tests and benchmarks
    share one); it is left open."""
    prep = prepare(cfg, question, first_engine(engine).hidden_size if engine is not None
                   else None)
    if engine is not None or not prep.todo:
        return run_prepared(prep, engine, decode, progress)
    engine, decode = start_engine(cfg, prep.needs_confidence, engine_scorer([prep]))
    try:
        return run_prepared(prep, engine, decode, progress)
    finally:
        engine.close()


def solve_methods(cfgs: list[SolveConfig], question: str | None = None,
                  progress: bool = True) -> list[dict]:
    """Several runs (one per method, ``--method gambit,sc``) on one engine, one after
    another. Every run is checked before the engine starts; the engine's settings are the
    first run's."""
    preps = [prepare(c, question) for c in cfgs]
    engine = decode = None
    if any(p.todo for p in preps):
        engine, decode = start_engine(cfgs[0], any(p.needs_confidence for p in preps),
                                      engine_scorer(preps))
    try:
        return [run_prepared(p, engine, decode, progress) for p in preps]
    finally:
        if engine is not None:
            engine.close()
