"""gambit-solve: answer questions with Gambit's thought-level beam search (or a baseline).

The pieces, one job each:

- :mod:`~gambit_search.solve.config`: :class:`SolveConfig`, method parameters, checks;
- :mod:`~gambit_search.solve.run`: prepare, start the engine, drive, write results;
- :mod:`~gambit_search.solve.outputs`: the output directory (results, trees, resume);
- :mod:`~gambit_search.solve.rescore`: re-vote a finished run without a model;
- :mod:`~gambit_search.solve.cli`: the ``gambit-solve`` console script (``--help``).

    from gambit_search.solve import SolveConfig, solve
    summary = solve(SolveConfig(dataset="toy:test:20", n=16, out="runs/x"))
"""

from gambit_search.solve.config import (
    DEFAULT_MODEL,
    DEFAULT_SCORER,
    PROG,
    SolveConfig,
    SolveInputError,
    bind_method,
    check_config,
    make_config,
    params_from_flat,
)
from gambit_search.solve.outputs import read_results, summarize, write_result
from gambit_search.solve.rescore import rescore
from gambit_search.solve.run import (
    Prepared,
    engine_scorer,
    load_run_questions,
    prepare,
    run_prepared,
    solve,
    solve_methods,
    start_engine,
)

__all__ = ["DEFAULT_MODEL", "DEFAULT_SCORER", "PROG", "Prepared", "SolveConfig",
           "SolveInputError", "bind_method", "check_config", "engine_scorer", "load_run_questions",
           "main",
           "make_config",
           "params_from_flat", "prepare", "read_results", "rescore", "run_prepared", "solve",
           "solve_methods", "start_engine", "summarize", "write_result"]


def main(argv: list[str] | None = None) -> None:
    """The ``gambit-solve`` console script (:func:`gambit_search.solve.cli.main`)."""
    from gambit_search.solve.cli import main as _main

    _main(argv)
