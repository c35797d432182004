"""Reading vLLM's per-request outputs: the log-probabilities of a ``CompletionOutput``.

Used by :class:`~gambit_search.vllm_engine.VLLMEngine` for every delta of a trace whose
``SamplingSpec`` asks for log-probs (:func:`token_logprobs`). Gambit requests them with
``flat_logprobs=True`` (one flat list per delta instead of a dict of ``Logprob`` objects per
token): vLLM's ``FlatLogprobs`` (``token_ids``, ``logprobs``, ``ranks``, ``start_indices``,
``end_indices``; 0.26.0 and 0.32.0). The per-token dict layout (``{token id: Logprob(logprob,
rank)}``) is read too, for a build without flat log-probs.
"""

from __future__ import annotations

from typing import Any

from gambit_search.engine import TokenLogprobs

__all__ = ["token_logprobs"]


def token_logprobs(new: tuple[int, ...], lp: Any, k: int) -> tuple[TokenLogprobs, ...]:
    """One :class:`TokenLogprobs` per sampled token of ``new`` from vLLM's log-probs ``lp``
    of the same delta, with the top ``k`` (by rank) besides the sampled one."""
    if hasattr(lp, "start_indices"):  # vLLM's FlatLogprobs (flat_logprobs=True)
        ids, vals, ranks = lp.token_ids, lp.logprobs, lp.ranks
        res = []
        for tok, s, e in zip(new, lp.start_indices, lp.end_indices, strict=False):
            # entry s is the sampled token (vLLM puts it first), then the top-k by rank
            sampled = float(vals[s]) if e > s and ids[s] == tok else float("nan")
            top = [j for j in range(s + 1, e) if ranks[j] is not None and 1 <= ranks[j] <= k]
            res.append(TokenLogprobs(tok, sampled, tuple(ids[j] for j in top),
                                     tuple(float(vals[j]) for j in top)))
        return tuple(res)
    res = []
    for tok, pos in zip(new, lp, strict=False):
        if pos is None:
            continue
        items = sorted(pos.items(), key=lambda kv: kv[1].rank)
        top = [(i, float(v.logprob)) for i, v in items if 1 <= v.rank <= k]
        sampled = pos.get(tok)
        res.append(TokenLogprobs(
            tok, float(sampled.logprob) if sampled is not None else float("nan"),
            tuple(i for i, _ in top), tuple(v for _, v in top)))
    return tuple(res)
