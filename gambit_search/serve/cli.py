"""gambit-serve: an OpenAI-compatible HTTP server that runs a search per request.

    gambit-serve                                   # the toy policy + SeqScorer, port 8000
    gambit-serve --method sc --n 16 --port 8001
    gambit-serve --model Qwen/Qwen3-8B --scorer my/ckpt.pt --n 256 --capacity 256 --swap 16 \\
        --interval 200 --warmup 12000 --temperature 0.6 --top-p 0.95 --top-k 20 --max-tokens 32768

    curl -s localhost:8000/v1/chat/completions -H 'content-type: application/json' \\
      -d '{"messages": [{"role": "user", "content": "Start 3. Ops: +1 +2. Mod 100."}],
           "gambit": {"method": "gambit", "n": 16}}'

The flags set the server's defaults (method, budget, sampling, each method's parameters);
a request overrides them with ``temperature``, ``top_p``, ``max_tokens`` and its ``gambit``
object. Many requests search at once on one engine, each with its own tree. SIGTERM (or
Ctrl-C) stops taking requests, finishes those in flight, then closes the engine.
Design, data parallelism and the API: docs/SERVE.md.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass, field
from typing import Any

from gambit_core.errors import InputError
from gambit_core.runio import RUN_ONLY
from gambit_core.sampling import SamplingConfig
from gambit_search.engines import EngineSettings
from gambit_search.solve.config import DEFAULT_SCORER

PROG = "gambit-serve"


@dataclass(kw_only=True)
class ServeConfig(SamplingConfig, EngineSettings):
    """One gambit-serve process (the sampling fields are the defaults of every request; the
    engine's, :class:`~gambit_search.engines.EngineSettings`, hold per rank)."""

    host: str = "127.0.0.1"
    """Address to listen on."""
    port: int = 8000
    """Port to listen on."""
    served_model_name: str | None = None
    """The model name /v1/models lists (default: the model directory's name)."""
    scorer: str = DEFAULT_SCORER
    """Scorer checkpoint; "none" serves only methods that need none."""
    method: str = "gambit"
    """Default search method of a request."""
    n: int = 64
    """Default budget: completed traces per request that vote."""
    rule: str | None = None
    """Default vote rule (None: the method's)."""
    admit_timeout: float = 60.0
    """Seconds a request may wait for room on the engine before a 503."""
    admit_on_live: bool = True
    """Admit a request while the traces live in the engine, plus its slots, fit
    ``max_live`` (False: while the admitted requests' slots fit), as gambit-solve does: a
    search near its end gives its finished traces' places to the next request at once."""
    params: dict[str, Any] = field(default_factory=dict, metadata=RUN_ONLY)
    """Default method parameters by flat name (from the method flags)."""


def build_state(cfg: ServeConfig, engines: list[Any] | None = None) -> tuple[Any, Any]:
    """(AppState, engines): everything checked before any engine starts, then the engines
    (one per rank: :class:`~gambit_search.data_parallel.Engines`) and one SearchService
    each. ``engines``: started ones to serve on instead (tests share them; left to the
    caller). Raises :class:`InputError`."""
    from gambit_search.engines import get_engine_kind
    from gambit_search.methods import get_method
    from gambit_search.serve.app import AppState
    from gambit_search.serve.service import SearchService
    from gambit_search.solve.config import params_from_flat

    kind = get_engine_kind(cfg.engine)
    cfg.check_sampling()
    if cfg.n < 1:
        raise InputError(f"--n must be >= 1, got {cfg.n}")
    m = get_method(cfg.method)
    m.bind(params_from_flat(m, cfg.params), cfg.n)  # the defaults must be valid
    facts = kind.facts(cfg.model)
    scorer = None
    if cfg.scorer and cfg.scorer != "none":
        from gambit_scorer.checkpoint import ScorerLoadError, load_scorer

        try:
            scorer = load_scorer(cfg.scorer, expected_hidden_size=facts.hidden_size,
                                 expected_boundary_token_ids=facts.boundary_ids)
        except ScorerLoadError as e:
            raise InputError(str(e)) from None
    elif m.needs_scorer:
        raise InputError(f"the default method {m.name!r} needs a scorer: pass --scorer or "
                         "another --method")
    from gambit_search.data_parallel import start_ranks
    from gambit_search.scoring import RuntimeScorer

    services = []
    if engines is None:
        engines = start_ranks(kind, cfg.engine_settings(
            seed=cfg.seed, confidence=bool(scorer and scorer.needs_confidence)))
    elif len(engines) != cfg.data_parallel_size:
        raise InputError(f"--data-parallel-size {cfg.data_parallel_size} but "
                         f"{len(engines)} engines given")
    for rank, eng in enumerate(engines):
        prompt = kind.prompt_ids(facts.tokenizer or getattr(eng, "tokenizer", None))
        svc = SearchService(eng, kind.decoder(eng), lambda q, p=prompt: p(q.question),
                            scorer=RuntimeScorer(scorer) if scorer else None,
                            max_live=cfg.max_live, seed=cfg.seed,
                            admit_timeout_s=cfg.admit_timeout, rank=rank,
                            admit_on_live=cfg.admit_on_live)
        services.append(svc)
    prompt = kind.prompt_ids(facts.tokenizer or getattr(engines[0], "tokenizer", None))
    defaults = {"method": cfg.method, "n": cfg.n, "rule": cfg.rule,
                "temperature": cfg.temperature, "top_p": cfg.top_p, "top_k": cfg.top_k,
                "max_tokens": cfg.max_tokens} | dict(cfg.params)
    name = cfg.served_model_name or os.path.basename(os.path.normpath(cfg.model))
    state = AppState(services, name, prompt, engines[0].max_model_len, scorer, defaults)
    return state, engines


def main(argv: list[str] | None = None) -> None:
    from gambit_core.cli import add_dataclass_args, add_verbose_arg, input_errors, quiet_logs
    from gambit_search.methods import param_classes
    from gambit_search.solve.config import flat_name

    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    add_verbose_arg(p, "vLLM's and uvicorn's logs")
    add_dataclass_args(p, ServeConfig, skip=("params",))
    flat_names: list[str] = []
    for cls, prefix in param_classes().items():
        g = p.add_argument_group(f"{cls.__name__} defaults")
        add_dataclass_args(g, cls, prefix=prefix, defaults=False)
        flat_names += [flat_name(prefix, f) for f in cls.__dataclass_fields__]
    a = vars(p.parse_args(argv))
    verbose = a.pop("verbose")
    params = {k: a.pop(k) for k in flat_names if k in a}
    quiet_logs(verbose)
    with input_errors(PROG):
        cfg = ServeConfig(**a, params=params)
        state, engines = build_state(cfg)
    import signal

    import uvicorn

    from gambit_search.serve.app import build_app

    def _exit(signum: int, _frame: Any) -> None:
        # uvicorn drains the in-flight requests on SIGTERM, restores this handler and raises
        # the signal again: exit through the finally below, which closes the engines
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, _exit)
    for s in state.services:
        s.start()
    print(f"{PROG}: serving {state.model_name} ({cfg.method}, n={cfg.n}) on "
          f"http://{cfg.host}:{cfg.port}", file=sys.stderr, flush=True)
    try:
        uvicorn.run(build_app(state), host=cfg.host, port=cfg.port,
                    log_level="info" if verbose else "warning", timeout_graceful_shutdown=600)
    finally:
        for s in state.services:
            s.close(timeout=600)
        engines.close()
        print(f"{PROG}: stopped", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
