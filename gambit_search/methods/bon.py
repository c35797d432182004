"""Best-of-N (BoN@N) with the scorer: N independent traces, every thought boundary scored.

The baseline a scorer-guided search must beat to show that the *search* helps and not just
the scorer: the traces are SC's (all N start at once, no pruning, no memory handling), and
the answer is the score-weighted vote over their final trace scores (the default rule); the
top-1 rule (the answer of the highest-scored completed trace) is reported next to it in
every result row (``answer_top1`` / ``correct_top1``), as is the plain majority.

    gambit-solve --method bon --n 32 --dataset toy:val:100 --out runs/bon
"""

from __future__ import annotations

from gambit_search.methods import Method
from gambit_search.methods.independent import from_budget
from gambit_search.methods.sc import SelfConsistency


class BestOfN(SelfConsistency):
    """SC's N fresh traces, scored (the driver feeds :class:`~gambit_search.policy.Scored`
    events); done when all have ended. Votes carry the final trace scores."""


METHOD = Method(
    name="bon",
    summary="best-of-N: N independent scored traces, score-weighted vote (top-1 reported too)",
    make_policy=from_budget(BestOfN),
    needs_scorer=True,
    scores_traces=True,
    vote="weighted",
)
