"""Sampled-token log-probabilities from the logits the worker already computes.

Used by :class:`~gambit_search._vllm_internals.capture.RowCapture` when the capture spec asks
for them (``VLLMEngineConfig(sampled_logprobs=True)``): each step's rows get the log-prob of
their input token under the previous step's logits, shipped with the row message, so the
driver learns every fed-back token's log-prob without vLLM's per-request logprob path. Pure
torch: the logits come from the runner hook
(:mod:`~gambit_search._vllm_internals.runner_hooks`), which reads them from
``compute_logits`` (vLLM 0.26.0 MRV2, 0.32.0 MRV1).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["SampledLogprobs"]


class SampledLogprobs:
    """The log-probability of each request's sampled tokens, from the logits the worker
    already computes, without vLLM's per-request logprob path.

    Each step, :meth:`step` keeps ``log_softmax(logits)`` of every row (one row per request:
    the distribution its next token was sampled from) and returns, for each row, the entry
    of the *previous* step's row of the same request at this row's input token, which is
    the token sampled there. The value is vLLM's ``raw_logprobs`` (the model's logits before
    temperature, penalties, top-k/top-p; ``logprobs_mode`` default) of that token, NaN where
    the previous step did not see the request at the position before (a request's first
    step, the step after a preemption or an evicted trace's revive, recomputed positions).
    The last token of a request is never fed back, so its value is never produced.
    One ``log_softmax`` over [n, vocab] and one gather per step, all on the device; one
    step's [n, vocab] float32 is kept (n=256, vocab=152k: 156 MB). Logits are read as
    ``compute_logits`` returns them, before a structured-output grammar mask (vLLM's raw
    log-probs of a grammar-constrained request see the mask; Gambit does not use grammars).
    """

    def __init__(self) -> None:
        self._lsm: torch.Tensor | None = None  # [n_prev, V] float32
        self._next: torch.Tensor | None = None  # [n_prev] positions of the previous rows + 1
        self._ids: list[str] = []  # request id of each previous row
        self._index: dict[str, int] | None = {}  # request id -> previous row (lazily built)

    def step(self, req_ids: Sequence[str], positions: torch.Tensor, tokens: torch.Tensor,
             logits: torch.Tensor) -> torch.Tensor:
        """float32 [n]: log-prob of ``tokens[i]`` (the input token of row i, at
        ``positions[i]``) as sampled at the previous step; NaN where unknown."""
        ids = req_ids if isinstance(req_ids, list) else list(req_ids)
        n = len(ids)
        pos = positions[:n].long()
        tok = tokens[:n].long()
        lsm = self._lsm
        lp: torch.Tensor | None = None
        same = ids == self._ids
        if lsm is not None and same:
            # the common decode step: the same requests in the same rows, so row i's
            # previous row is row i (one gather, no host-built index)
            vocab = lsm.shape[1]
            ok = (pos == self._next) & (tok < vocab)
            vals = lsm.gather(1, tok.clamp(0, vocab - 1).unsqueeze(1)).squeeze(1)
            lp = vals.masked_fill(~ok, float("nan"))
        elif lsm is not None:
            if self._index is None:
                self._index = {r: i for i, r in enumerate(self._ids)}
            prev = self._index
            src = [prev.get(r, -1) for r in ids]
            if any(s >= 0 for s in src):
                vocab = lsm.shape[1]
                src_t = torch.tensor(src, dtype=torch.long).to(logits.device, non_blocking=True)
                rows = src_t.clamp(min=0)
                ok = (src_t >= 0) & (pos == self._next.index_select(0, rows)) & (tok < vocab)
                lp = lsm[rows, tok.clamp(0, vocab - 1)].masked_fill(~ok, float("nan"))
        if lp is None:
            lp = torch.full((n,), float("nan"), dtype=torch.float32, device=logits.device)
        self._lsm = torch.log_softmax(logits[:n].float(), dim=-1)
        self._next = pos + 1  # a new tensor: the runner's buffers may be overwritten
        if not same:
            self._ids = list(ids)
            self._index = None
        return lp
