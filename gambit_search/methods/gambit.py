"""Gambit: the scorer-guided tournament (:mod:`gambit_search.tournament`) as a method.

    gambit-solve --method gambit --n 64 --capacity 32 --swap 2 --interval 32 --warmup 16 --dataset toy:test:200

``--n`` is the budget N of completed traces that vote; ``--capacity`` is C, the traces kept
active at once (at most N). By default C and K scale with N (:func:`capacity_swap`: C = N/2
up to N = 16 and 3N/8 above, at most 64, and K = ceil(C/16); chosen on toy val,
docs/SEARCH.md "Width"); the paper runs C = N = 256, K = 16. A question prunes at most N
traces (``--prune-budget 1``, chosen on toy val; ``inf``: no cap, the paper's), then its
survivors finish. Answers by the lineage vote (the
score-weighted vote with one vote per root lineage, :mod:`gambit_search.voting`; chosen on toy
val, docs/SEARCH.md "A lineage vote"; ``--rule weighted`` is the paper's).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from gambit_search.methods import Method
from gambit_search.tournament import Tournament
from gambit_search.tournament_config import TournamentConfig, TournamentConfigError


@dataclass(frozen=True)
class GambitParams:
    """Gambit's flags (``--capacity``, ``--swap`` ...). Defaults: chosen on toy val
    (docs/SEARCH.md, issue 29's sections); the paper's for real reasoning models in
    brackets."""

    capacity: int | None = None
    """Gambit's C, logically active traces per question, at most n (None: scaled with the
    budget: N/2 up to N = 16, 3N/8 above, at most 64; on toy val 3N/8 saved 11-17% of the
    tokens from N = 32 on at equal accuracy, and C = N cut latency 2x at N <= 16 but cost more
    tokens) [paper 256]."""
    swap: int | None = None
    """Gambit's K, traces swapped per round (None: ceil(C/16), at most C/2; on toy-hard val
    K = 2 at C = 24 lost less than K = 1) [paper 16]."""
    interval: int = 32
    """Gambit's D, decode steps of a question between rounds [paper 200]."""
    warmup: int = 16
    """Gambit's w, output tokens before a trace is ranked or may branch [paper 12000]."""
    floor: float = 0.1
    """Gambit's hard floor: ranked traces scoring below it are pruned (0: off; on toy val with
    the prefix scorer 0 loses 10-20 points, 0.02-0.05 are within noise of 0.1) [paper 0.1]."""
    child_temperature: float = 1.0
    """Children sample at the parent's temperature times this."""
    branch_point: str = "boundary"
    """Where a child branches: "boundary" (the parent's last scored thought boundary),
    "current" (its current tokens, the reference), "best" (its best-scored boundary so far)
    or "drop" (the last boundary before its score last fell); on toy-clean val, outcome
    scorer, "current" and "best" were +6 points over "boundary", within noise [paper
    current]."""
    interval_unit: str = "steps"
    """What --interval counts: "steps" (decode steps of the question) or "thoughts" (scored
    boundaries per running trace: a round every D thoughts of the average trace; D = 1
    prunes before the scorer can tell traces apart: coverage 36-48% on toy-clean val) [paper
    steps]."""
    max_children: int = 0
    """Diversity cap: a trace that has had this many children is no longer a parent (0: no
    cap; 2 on top of "best": +1.5 points on toy-clean val, noise) [paper 0]."""
    lineage_share: float = 0.0
    """Diversity cap per root lineage: a fork may not take one root's descendants above this
    share of C active traces (ceil(share x C), at least 1); the next-best parent of another
    lineage forks instead, or a fresh root (0: no cap; on toy val 1/8 gave +2 points at N = 128
    and cost 5-13 points at N <= 64; the lineage vote, the default rule, got the N = 128 gain
    without it) [paper 0]."""
    prune_budget: float = 1.0
    """Exploration cap: at most this times N traces pruned per question (so at most (1 + it)
    x N started); then no more prunes, and the survivors finish and vote (inf: no cap; on
    toy val 1 beat BoN at N = 8-16 at fewer tokens, where no cap spent 1.3-2.3x BoN's; 0.5
    costs less still) [paper inf]."""
    parents: str = "top"
    """Which eligible traces Gambit forks from: "top" (best scored) or "random" (ablation)."""
    drain: bool = True
    """Keep completed + active traces within n, so every trace kept finishes and votes
    (--no-drain: the reference, which refills until n complete, then stops the active ones)."""
    ghosts: bool = True
    """Under memory pressure evict the lowest-scored running traces to ghosts."""
    revive: bool = True
    """Revive ghosts in batches sized to the free KV (they also come back whenever none of
    their question's traces runs)."""


AUTO_CAPACITY = 64
"""The largest C when ``--capacity`` is not given (reached from N = 171 on)."""
HALF_UP_TO = 16
"""Up to this N the scaled C is N/2; above it C grows as 3N/8 (never below this N's C)."""
SWAP_EVERY = 16
"""K when ``--swap`` is not given: one swapped trace per this many of C, rounded up."""


def _scaled_capacity(n: int) -> int:
    """C = N/2 up to N = 16, then 3N/8 (never less than 8, so C never falls as N grows),
    at most 64. Narrower than N/2 from N = 32 on: the same accuracy at 11-17% fewer tokens
    on toy val; at N <= 16 a narrower pool lost 2-10 points at no saving (docs/SEARCH.md,
    "Width")."""
    return min(AUTO_CAPACITY, max(min(n, HALF_UP_TO) // 2, 3 * n // 8))


def capacity_swap(params: GambitParams, n: int) -> tuple[int, int]:
    """Gambit's C and K at budget ``n``: the given ones, or scaled with the budget. C =
    :func:`_scaled_capacity` (at least 2, and 2K where K is given; at most n: more never
    run) and K = ceil(C/16) (at most C/2: a round prunes K and keeps K parents) are the
    settings measured on toy val and test (docs/SEARCH.md, "Width"): C = 4, 8, 12, 24, 48
    and K = 1, 1, 1, 2, 3 at N = 8, 16, 32, 64, 128; from N = 171 on C = 64, K = 4."""
    c = params.capacity
    if c is None:  # a given K keeps its room: C >= 2K
        c = max(2, _scaled_capacity(n), 2 * (params.swap or 0))
    c = min(int(c), n)
    k = (params.swap if params.swap is not None
         else min(math.ceil(c / SWAP_EVERY), max(1, c // 2)))
    return c, int(k)


def _capacity(params: GambitParams, n: int) -> int:
    return capacity_swap(params, n)[0]


def tournament_config(params: GambitParams, n: int, max_tokens: int | None = None
                      ) -> TournamentConfig:
    """The :class:`TournamentConfig` of Gambit's parameters and budget ``n`` (raises
    TournamentConfigError, a ValueError, with one line)."""
    c, k = capacity_swap(params, n)
    x = _number("prune_budget", params.prune_budget, math.inf, "a number >= 0 (inf: no cap)")
    share = _number("lineage_share", params.lineage_share, 1.0, "a number in [0, 1] (0: no cap)")
    return TournamentConfig(
        **{name: getattr(params, name) for name in SHARED_FIELDS},
        capacity=c, swap=k, budget=n,
        max_lineage=max(1, math.ceil(share * c - 1e-9)) if share > 0 else 0,
        max_prunes=None if math.isinf(x) else math.ceil(x * n - 1e-9),
        max_unique_tokens=4 * n * max_tokens if max_tokens else None,
    )


SHARED_FIELDS = tuple(f.name for f in fields(GambitParams)
                      if f.name in {g.name for g in fields(TournamentConfig)}
                      and f.name not in ("capacity", "swap"))
"""GambitParams' fields that TournamentConfig takes as they are (the rest are resolved
against the budget: C and K by :func:`capacity_swap`, the lineage share and the prune budget
as counts)."""


def _number(name: str, value, top: float, what: str) -> float:
    """``value`` as a float in [0, top] (serve's JSON has no inf: "inf" is accepted as a
    string), else TournamentConfigError naming ``name`` and ``what`` it must be."""
    try:
        x = float(value)
    except (TypeError, ValueError):
        x = math.nan
    if not 0 <= x <= top:  # NaN too
        raise TournamentConfigError(f"{name} must be {what}, got {value!r}")
    return x


def _make(params: GambitParams, n: int, ctx=None) -> Tournament:
    return Tournament(tournament_config(params, n, ctx.max_tokens if ctx is not None else None))


def _check(params: GambitParams, n: int) -> None:
    tournament_config(params, n)


METHOD = Method(
    name="gambit",
    summary="thought-level beam search: prune the worst K, fork the best K prefixes, ghosts "
            "under memory pressure",
    make_policy=_make,
    slots=_capacity,
    params=GambitParams,
    needs_scorer=True,
    scores_traces=True,
    uses_memory=True,
    vote="lineage",
    check=_check,
)
