"""SeqScorer run-time caches in one preallocated tensor: a batched step costs the same
number of tensor ops whatever the number of traces.

:meth:`SeqScorer.step_batch` takes one cache per trace and pads them together, then builds
each trace's new cache with its own ``torch.cat``: two ops per trace per layer, ~170 small
ops for a step of 40 boundaries, a cost paid on every engine step. A :class:`SeqPool` keeps every trace's keys/values in one tensor per
kind ``[layers, slots, length, heads, head_dim]``, grown by doubling: a step gathers its
traces' rows in one indexing op per layer and writes the new step's keys/values back in
one more, as vLLM's paged attention does for the policy's KV.

    pool = SeqPool(loaded.model)             # on the model's device
    pool.add(7)                              # a fresh trace
    p = pool.step([7], x)                    # x [1, F] features -> probabilities [1]
    pool.add(9, src=7)                       # a branch: a copy of 7's cache (one copy op)
    pool.add(9, src=7, k=3)                  # ... or of its first 3 steps only
    pool.drop(7)

Scores equal :meth:`SeqScorer.step_batch`'s (the same layers, the same masked attention;
checked in tests/test_seq_pool.py). The sliding window (``max_len``) is kept as a ring: past
``max_len`` steps a trace's oldest entry is overwritten, exactly what ``kind_seq._trim`` keeps; a
prefix of such a trace can no longer be cut (:class:`ValueError`).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from gambit_scorer.models import SeqScorer

__all__ = ["SeqPool"]


class SeqPool:
    """Per-trace SeqScorer caches, keyed by any hashable (see the module docstring)."""

    def __init__(self, model: SeqScorer, slots: int = 64, length: int = 32) -> None:
        """``slots``, ``length``: the starting capacity (traces, steps per trace); both
        double when exceeded. Memory: ``2 * layers * slots * length * d_model`` floats."""
        p = next(model.parameters())
        self.model = model
        self.window = int(model.max_len)
        a = model.layers[0].attn
        self._shape = (len(model.layers), a.nhead, a.head_dim)
        self._dev, self._dtype = p.device, p.dtype
        self._k = self._v = None
        self._alloc(max(1, slots), max(1, min(length, self.window)))
        self._n = np.zeros(self._slots, dtype=np.int64)  # steps seen per slot
        self._free = list(range(self._slots - 1, -1, -1))
        self._slot: dict[Hashable, int] = {}

    # -- capacity (the buffers are inference tensors: every touch runs in inference mode)
    @torch.inference_mode()
    def _alloc(self, slots: int, length: int) -> None:
        layers, h, hd = self._shape
        k = torch.zeros(layers, slots, length, h, hd, device=self._dev, dtype=self._dtype)
        v = torch.zeros_like(k)
        if self._k is not None:
            s, n = self._k.shape[1], self._k.shape[2]
            k[:, :s, :n], v[:, :s, :n] = self._k, self._v
            if self._k.is_cuda:  # the copy runs on this stream (the worker's scorer's own):
                stream = torch.cuda.current_stream(self._dev)  # keep the old buffers
                self._k.record_stream(stream)  # until it is done with them
                self._v.record_stream(stream)
        self._k, self._v = k, v
        self._slots, self._length = slots, length

    def _take_slot(self) -> int:
        if not self._free:
            old = self._slots
            self._alloc(2 * old, self._length)
            self._n = np.concatenate([self._n, np.zeros(old, dtype=np.int64)])
            self._free = list(range(2 * old - 1, old - 1, -1))
        return self._free.pop()

    # -- traces
    def __contains__(self, key: Hashable) -> bool:
        return key in self._slot

    def __len__(self) -> int:
        return len(self._slot)

    def n_steps(self, key: Hashable) -> int:
        """Steps ``key`` has seen."""
        return int(self._n[self._slot[key]])

    @torch.inference_mode()
    def add(self, key: Hashable, src: Hashable | None = None, k: int | None = None) -> None:
        """Start ``key``: fresh, or a copy of ``src``'s cache (its first ``k`` steps; all of
        them when None). ``key`` may be ``src`` itself (cut back) or replace a live key."""
        slot = self._take_slot()
        n = 0
        if src is not None:
            s = self._slot[src]
            have = int(self._n[s])
            n = have if k is None else min(int(k), have)
            if 0 < n < have and have > self.window:  # (a cut to nothing is a fresh start)
                raise ValueError(f"trace {src!r} has {have} steps, past the scorer's window of "
                                 f"{self.window}: its first {n} can no longer be cut out")
            m = min(n, self.window)
            if m:
                self._k[:, slot, :m] = self._k[:, s, :m]
                self._v[:, slot, :m] = self._v[:, s, :m]
        self._n[slot] = n
        old = self._slot.get(key)
        self._slot[key] = slot
        if old is not None:
            self._free.append(old)

    def drop(self, key: Hashable) -> None:
        """Forget ``key`` (no-op when unknown)."""
        slot = self._slot.pop(key, None)
        if slot is not None:
            self._free.append(slot)

    # -- scoring
    @torch.inference_mode()
    def step(self, keys: Sequence[Hashable], x: Tensor, to_host: bool = True
             ) -> np.ndarray | Tensor:
        """One new step ``x[i]`` ([B, F] features, on any device) for each of the distinct
        ``keys``, in one forward -> each trace's new probability, float64 [B]; with
        ``to_host=False`` a float32 tensor on the pool's device, not waited for."""
        model = self.model
        slots = [self._slot[k] for k in keys]
        n = self._n[slots]
        held = np.minimum(n, self.window)  # past entries each trace attends to
        write = n % self.window
        need = int(write.max()) + 1 if len(n) else 0
        if need > self._length:
            self._alloc(self._slots, min(self.window, max(2 * self._length, need)))
        lg = int(held.max()) if len(n) else 0
        dev = self._dev
        idx = torch.as_tensor(slots, device=dev)
        w = torch.as_tensor(write, device=dev)
        B = len(slots)
        mask = None  # every trace holds lg past entries: nothing to mask
        if lg and int(held.min()) < lg:
            valid = torch.ones(B, lg + 1, dtype=torch.bool, device=dev)
            valid[:, :lg] = (torch.arange(lg, device=dev)[None, :]
                             < torch.as_tensor(held, device=dev)[:, None])
            mask = valid[:, None, None, :]
        h = model.input_proj(x.to(device=dev, dtype=self._dtype)).unsqueeze(1)  # [B, 1, D]
        pos = torch.as_tensor(n, device=dev)
        for li, layer in enumerate(model.layers):
            q, k, v = model.step_qkv(layer, h, pos)
            if lg:
                K = torch.cat((self._k[li, idx, :lg].transpose(1, 2), k), dim=2)
                V = torch.cat((self._v[li, idx, :lg].transpose(1, 2), v), dim=2)
            else:
                K, V = k, v
            h = model.step_out(layer, h, F.scaled_dot_product_attention(q, K, V, attn_mask=mask))
            self._k[li, idx, w] = k[:, :, 0]
            self._v[li, idx, w] = v[:, :, 0]
        self._n[slots] = n + 1
        probs = torch.sigmoid(model.head(model.norm(h)).reshape(B)).float()
        if not to_host:
            return probs
        return probs.cpu().numpy().astype(np.float64)
