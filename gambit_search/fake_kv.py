"""The fake engine's KV memory: a small block manager that mimics vLLM's.

Fixed-size blocks with reference counts, a prefix cache over full blocks (a block's hash
chains over the token ids of every block before it, as vLLM's does) and an LRU free queue:
a freed block keeps its hash until it is reused, so a prompt revived soon is mostly a cache
hit. Used by :class:`~gambit_search.fake_engine.FakeEngine` for admission, growth,
preemption and its :class:`~gambit_search.engine.MemorySnapshot`.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

__all__ = ["BlockPool", "block_hashes"]


class BlockPool:
    """vLLM-like KV blocks: refcounts, a hash -> block prefix cache, LRU free queue."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.size = block_size
        self.total = num_blocks
        self.ref = [0] * num_blocks
        self.hash_of: dict[int, int] = {}  # block -> hash
        self.by_hash: dict[int, int] = {}  # hash -> block
        self.free: OrderedDict[int, None] = OrderedDict((b, None) for b in range(num_blocks))

    @property
    def num_free(self) -> int:
        return len(self.free)

    def _evict_hash(self, b: int) -> None:
        h = self.hash_of.pop(b, None)
        if h is not None and self.by_hash.get(h) == b:
            del self.by_hash[h]

    def allocate(self) -> int | None:
        if not self.free:
            return None
        b, _ = self.free.popitem(last=False)
        self._evict_hash(b)
        self.ref[b] = 1
        return b

    def touch(self, h: int) -> int | None:
        """Reuse the cached block of hash ``h`` (ref + 1), or None."""
        b = self.by_hash.get(h)
        if b is None:
            return None
        if self.ref[b] == 0:
            del self.free[b]
        self.ref[b] += 1
        return b

    def commit(self, b: int, h: int) -> None:
        """Block ``b`` just filled with content of hash ``h``."""
        if h not in self.by_hash:
            self.by_hash[h] = b
            self.hash_of[b] = h

    def release(self, blocks: list[int]) -> None:
        for b in reversed(blocks):  # tail blocks go to the front of the LRU queue first
            self.ref[b] -= 1
            if self.ref[b] == 0:
                self.free[b] = None
                if b not in self.hash_of:
                    self.free.move_to_end(b, last=False)


def block_hashes(seq: Sequence[int], size: int) -> list[int]:
    """The chained hash of every full block of ``seq`` (block i's covers blocks 0..i)."""
    out, h = [], 0
    for i in range(len(seq) // size):
        h = hash((h, tuple(seq[i * size : (i + 1) * size])))
        out.append(h)
    return out
