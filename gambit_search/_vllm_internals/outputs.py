"""Reading vLLM's outputs: the log-probabilities of a ``CompletionOutput``, and whether
more engine outputs are already waiting.

Used by :class:`~gambit_search.vllm_engine.VLLMEngine` for every delta of a trace whose
``SamplingSpec`` asks for log-probs (:func:`token_logprobs`). Gambit requests them with
``flat_logprobs=True`` (one flat list per delta instead of a dict of ``Logprob`` objects per
token): vLLM's ``FlatLogprobs`` (``token_ids``, ``logprobs``, ``ranks``, ``start_indices``,
``end_indices``; 0.26.0 and 0.32.0). The per-token dict layout (``{token id: Logprob(logprob,
rank)}``) is read too, for a build without flat log-probs.

:func:`outputs_waiting`: in vLLM's default multiprocess mode the engine core steps in its own
process (``EngineCoreProc.run_busy_loop``) whatever the driver does, and a thread of the
``SyncMPClient`` puts each step's ``EngineCoreOutputs`` on ``outputs_queue``, which
``LLMEngine.step()`` takes one at a time (read in 0.32.0; the same names in 0.26.0).
"""

from __future__ import annotations

from typing import Any

from gambit_search.engine import TokenLogprobs

__all__ = ["outputs_waiting", "token_logprobs"]


def outputs_waiting(llm_engine: Any) -> int:
    """How many engine-core outputs ``llm_engine.step()`` would return without waiting (0
    when unknown: an in-process engine core, or a vLLM without the queue)."""
    q = getattr(getattr(llm_engine, "engine_core", None), "outputs_queue", None)
    try:
        return int(q.qsize()) if q is not None else 0
    except (AttributeError, NotImplementedError, TypeError):
        return 0


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
