"""DeepConf online (arXiv 2508.15260): confidence from the engine's top-k log-probs.

Per generated token i, the token confidence is ``C_i = -mean(top-k log-probs at i)`` (k=20:
the method asks the engine for them through ``Method.logprobs``); a trace's group
confidence at token i is the mean of C over the last W tokens (a full window), and its
trace confidence is its lowest group confidence (a trace shorter than W: the mean over all
its tokens).

1. **Warmup**: N_init full traces (all at once); when every one has ended, the threshold is
   the (100 - eta)-th percentile of the completed ones' lowest group confidences
   (``deepconf-low``: eta = 10, the bar keeps the top 10 %; ``deepconf-high``: eta = 90,
   the top 90 %).
2. **Online**: the remaining N - N_init traces run (all at once); a trace whose current
   window mean falls below the threshold, with its window full, is stopped (``Prune``).
3. **Vote**: weighted by trace confidence, over the warmup traces at or above the bar plus
   the online traces that completed (none of which was stopped). The driver also reports
   the plain majority and the top-1 (highest confidence) trace of the same voters.

Scaling to the toy world. The paper's W = 2048 and N_init = 16 (of a 512-trace budget) are
for ~15k-token traces; toy traces are ~130 tokens (a 2048 window would never fill, so
nothing would ever be stopped). Defaults here: W = 32 (``--deepconf-window``, about a
quarter of a toy trace: ~3 thoughts of the "a+b=c / check" format, short enough to catch a
bad stretch, long enough that one unsure token does not stop a trace) and N_init = 8
(``--deepconf-warmup``; a quarter of the toy budget N = 32, keeping the paper's share of
warmup above its 16/512 so the percentile rests on more than a handful of traces). Set
them back to 2048 / 16 for real reasoning models.

Log-probs: the engine must return ``SamplingSpec.logprobs`` top-k log-probs with every
delta. Both gambit-solve engines do (vLLM up to its ``max_logprobs``, 20 by default, which
is why ``--deepconf-top-k`` above 20 is refused before any engine starts; the fake engine
serves scripted ones). A delta that arrives without them (an engine passed to
``solve(engine=...)`` that ignores the request) raises :class:`MissingLogprobsError`.

Not implemented: the paper's consensus stop (stop sampling once the leading answer's
weighted share reaches tau), so every method spends the same trace budget.

    gambit-solve --method deepconf-low --scorer none --n 32 --dataset toy:val:100 --out runs/dc
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from gambit_search.methods import Method
from gambit_search.methods.independent import IndependentTraces
from gambit_search.policy import Action, Finished, NodeState, Progress, Prune, Spawn

__all__ = ["ENGINE_TOP_K", "DeepConf", "DeepConfParams", "MissingLogprobsError",
           "token_confidence"]

ENGINE_TOP_K = 20
"""Top log-probs per token the method asks for (vLLM serves at most its ``max_logprobs``,
20 by default)."""


class MissingLogprobsError(ValueError):
    """The engine delivered tokens without the top-k log-probs DeepConf needs."""


@dataclass(frozen=True)
class DeepConfParams:
    """DeepConf's flags (``--deepconf-window`` ...), shared by deepconf-low and -high."""

    window: int = 32
    """DeepConf's group size W: tokens per sliding-window confidence [paper 2048, for
    ~15k-token traces; toy traces are ~130 tokens]."""
    warmup: int = 8
    """DeepConf's N_init: full warmup traces that set the stopping threshold [paper 16 of
    512]."""
    top_k: int = 20
    """DeepConf's k: top log-probs per token in its confidence (at most 20, what the engine
    serves) [paper 20]."""

    def check(self, n: int, eta: float) -> None:
        """Raise ValueError (one line) for a value the policy cannot run with: budget ``n``
        and the method's ``eta`` (percent of the warmup kept above the bar)."""
        if n < 1:
            raise ValueError(f"--n must be >= 1, got {n}")
        if not 0 < eta < 100:
            raise ValueError(f"DeepConf's eta must be in (0, 100), got {eta}")
        if self.window < 1:
            raise ValueError(f"--deepconf-window must be >= 1, got {self.window}")
        if self.warmup < 1:
            raise ValueError(f"--deepconf-warmup must be >= 1, got {self.warmup}")
        if not 1 <= self.top_k <= ENGINE_TOP_K:
            raise ValueError(
                f"--deepconf-top-k must be in 1..{ENGINE_TOP_K} (the engine serves at most "
                f"{ENGINE_TOP_K} top log-probs per token), got {self.top_k}")


def token_confidence(top_logprobs, k: int) -> float:
    """``-mean`` of the first ``k`` finite top log-probs (0.0 when there are none)."""
    vals = [v for v in top_logprobs[:k] if math.isfinite(v)]
    return -sum(vals) / len(vals) if vals else 0.0


@dataclass
class _Conf:
    """Running confidence of one trace: the last W token confidences and their sum."""

    window: deque = field(default_factory=deque)
    wsum: float = 0.0
    total: float = 0.0
    count: int = 0
    lowest_full: float = math.inf
    """Lowest mean over a full window so far (inf before the window first fills)."""

    def add(self, c: float, w: int) -> float | None:
        """Add one token's confidence; the current window mean when the window is full."""
        self.window.append(c)
        self.wsum += c
        self.total += c
        self.count += 1
        if len(self.window) > w:
            self.wsum -= self.window.popleft()
        if len(self.window) < w:
            return None
        m = self.wsum / w
        self.lowest_full = min(self.lowest_full, m)
        return m

    @property
    def lowest(self) -> float | None:
        """Trace confidence: lowest full-window mean (shorter trace: mean of all; none: None)."""
        if self.lowest_full < math.inf:
            return self.lowest_full
        return self.total / self.count if self.count else None


class DeepConf(IndependentTraces):
    """One question's online DeepConf; see the module docstring."""

    def __init__(self, params: DeepConfParams, n: int = 32, eta: float = 10.0) -> None:
        """``params``: the method's flags; ``n``: the trace budget (warmup included);
        ``eta``: percent of the warmup traces kept above the bar (low: 10, high: 90)."""
        params.check(n, eta)
        super().__init__()
        self.params, self.n, self.eta = params, n, eta
        self.n_warmup = min(params.warmup, n)
        self.conf: dict[int, _Conf] = {}
        self.warmup_ids: set[int] = set()
        self.threshold: float | None = None
        """The bar (None until the warmup has ended; -inf when no warmup trace completed)."""
        self.online = False
        """Whether the online phase has started."""
        self.early_stops = 0

    # -- life ----------------------------------------------------------------------------------
    def _spawn(self, k: int) -> list[Action]:
        acts: list[Action] = []
        for _ in range(k):
            n = self._new_root()
            self.conf[n.id] = _Conf()
            acts.append(Spawn(n.id))
        return acts

    def start(self, limit: int | None = None) -> list[Action]:
        """Every trace at once (``limit`` is for methods that use memory: this one gets None)."""
        acts = self._spawn(self.n_warmup)
        self.warmup_ids = {a.node for a in acts}
        return acts

    def _after_finished(self, event: Finished) -> None:
        pass  # its last tokens come in this step's Progress: decide there

    def _progress(self, event: Progress) -> list[Action]:
        self._on_progress(event)
        acts = self._confidences(event)
        if self.threshold is None and not self.num_active:
            acts += self._end_warmup()
        if self.threshold is not None and not self.num_active:
            self.done = True
        return acts

    def _confidences(self, e: Progress) -> list[Action]:
        cfg = self.params
        acts: list[Action] = []
        for node, d in e.deltas.items():
            if not d.token_ids:
                continue
            if d.logprobs is None or len(d.logprobs) < len(d.token_ids):
                raise MissingLogprobsError(
                    f"DeepConf needs the engine's top-{cfg.top_k} log-probs with every token: "
                    f"node {node} got {len(d.token_ids)} token(s) without them")
            n = self.nodes[node]
            c = self.conf[node]
            for lp in d.logprobs[: len(d.token_ids)]:
                m = c.add(token_confidence(lp.top_logprobs, cfg.top_k), cfg.window)
                if (m is not None and self.online and n.state is NodeState.RUNNING
                        and node not in self.warmup_ids and m < self.threshold):
                    self._end(n, NodeState.PRUNED)
                    self.counts["prunes"] += 1
                    self.early_stops += 1
                    acts.append(Prune(node))
                    break
        return acts

    def _end_warmup(self) -> list[Action]:
        lows = [self.conf[i].lowest for i in sorted(self.warmup_ids)
                if self.nodes[i].state is NodeState.COMPLETED]
        lows = [x for x in lows if x is not None]
        self.threshold = (float(np.percentile(lows, 100.0 - self.eta)) if lows
                          else -math.inf)
        rest = self.n - self.n_warmup
        if rest <= 0:
            return []
        self.online = True
        return self._spawn(rest)

    # -- reading -------------------------------------------------------------------------------
    def trace_confidence(self, node: int) -> float | None:
        c = self.conf.get(node)
        return c.lowest if c is not None else None

    def voters(self) -> list[int]:
        """Completed nodes that vote: warmup ones at or above the bar, every online one."""
        bar = self.threshold if self.threshold is not None else -math.inf
        warm = self.warmup_ids
        out = []
        for n in self.completed():
            conf = self.trace_confidence(n.id)
            if n.id in warm and (conf is None or conf < bar):
                continue
            out.append(n.id)
        return out

    def votes(self) -> list[tuple[int, str | None, float | None]]:
        """(node, answer, trace confidence) of every voter (see :meth:`voters`)."""
        return [(i, self.nodes[i].answer, self.trace_confidence(i)) for i in self.voters()]

    def stats(self) -> dict:
        s = super().stats()
        s["deepconf"] = {
            "threshold": None if self.threshold is None or not math.isfinite(self.threshold)
            else round(self.threshold, 6),
            "warmup": self.n_warmup, "early_stops": self.early_stops,
            "voters": len(self.voters()),
        }
        return s

    def tree(self) -> list[dict]:
        """NodeBook's rows plus ``confidence``, ``warmup``, and what ``--rescore`` reads:
        ``votes`` (whether the node votes) and ``vote_weight`` (its confidence)."""
        rows = super().tree()
        voters = set(self.voters())
        for r in rows:
            c = self.trace_confidence(r["id"])
            r["confidence"] = None if c is None else round(c, 6)
            r["warmup"] = r["id"] in self.warmup_ids
            r["votes"] = r["id"] in voters
            r["vote_weight"] = c
        return rows


def _slots(params: DeepConfParams, n: int) -> int:
    w = min(params.warmup, n)
    return max(w, n - w)


def _method(name: str, eta: float, keep: str) -> Method:
    def make(params: DeepConfParams, n: int, ctx=None) -> DeepConf:
        return DeepConf(params, n, eta)

    def check(params: DeepConfParams, n: int) -> None:
        params.check(n, eta)  # raises ValueError, one line

    return Method(
        name=name,
        summary=f"DeepConf online ({keep}): warmup threshold on lowest group confidence, "
                "early stop from top-k log-probs, confidence-weighted vote",
        make_policy=make,
        slots=_slots,
        params=DeepConfParams,
        flag_prefix="deepconf-",
        vote="weighted",
        logprobs=ENGINE_TOP_K,
        check=check,
    )


METHOD_LOW = _method("deepconf-low", 10.0, "eta=10, keeps the top 10%")
"""``deepconf-low`` (module :mod:`gambit_search.methods.deepconf_low`)."""
METHOD_HIGH = _method("deepconf-high", 90.0, "eta=90, keeps the top 90%")
"""``deepconf-high`` (module :mod:`gambit_search.methods.deepconf_high`)."""
