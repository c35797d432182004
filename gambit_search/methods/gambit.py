"""Gambit: the scorer-guided tournament (:mod:`gambit_search.tournament`) as a method.

    gambit-solve --method gambit --n 64 --capacity 32 --swap 2 --interval 32 --warmup 16 --dataset toy:test:200

``--n`` is the budget N of completed traces that vote; ``--capacity`` is C, the traces kept
active at once (at most N; the toy default C = 32 at N = 64 was chosen on val, the paper
runs C = N = 256). Answers by the score-weighted vote.
"""

from __future__ import annotations

from gambit_search.methods import Method
from gambit_search.tournament import Tournament, TournamentConfig


def tournament_config(params) -> TournamentConfig:
    """The :class:`TournamentConfig` of solve parameters (raises TournamentConfigError)."""
    cap = min(int(params.capacity or params.n), int(params.n))  # C <= N: more never run
    cap_tokens = getattr(params, "max_tokens", None)
    return TournamentConfig(
        capacity=cap, swap=int(params.swap), interval=int(params.interval),
        warmup=int(params.warmup), floor=float(params.floor),
        child_temperature=float(params.child_temperature), budget=int(params.n),
        ghosts=bool(params.ghosts), revive=bool(params.revive),
        branch_point=str(params.branch_point),
        parents=str(getattr(params, "parents", "top")),
        drain=bool(getattr(params, "drain", True)),
        max_unique_tokens=4 * int(params.n) * int(cap_tokens) if cap_tokens else None,
    )


def _make(params, ctx=None) -> Tournament:
    return Tournament(tournament_config(params))


def _check(params) -> None:
    tournament_config(params)  # raises TournamentConfigError (a ValueError), one line


METHOD = Method(
    name="gambit",
    summary="thought-level beam search: prune the worst K, fork the best K prefixes, ghosts "
            "under memory pressure",
    make_policy=_make,
    slots=lambda params: min(int(params.capacity or params.n), int(params.n)),
    needs_scorer=True,
    scores_traces=True,
    uses_memory=True,
    vote="weighted",
    check=_check,
)
