"""Test doubles shared by the search tests."""

from __future__ import annotations

import random


class RandomScorer:
    """The RuntimeScorer interface with pseudo-random scores (a function of trace and step)."""

    needs_confidence = False

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed
        self.keys: set = set()

    def add(self, key, parent=None) -> None:
        self.keys.add(key)

    def drop(self, key) -> None:
        self.keys.discard(key)

    def __contains__(self, key) -> bool:
        return key in self.keys

    def score(self, items, logprobs=None):
        return [random.Random(hash((self.seed, k, j))).random() for k, _, j in items]


def count_starts(engines, setattr=setattr) -> dict[int, int]:
    """Traces started (spawned or forked) on each rank's engine, counted as they happen
    (``setattr``: ``monkeypatch.setattr`` to put the engines back after the test)."""
    started = {r: 0 for r in range(len(engines))}
    for rank, eng in enumerate(engines):
        for name in ("add_trace", "fork"):
            real = getattr(eng, name)

            def counted(*a, _real=real, _rank=rank, **kw):
                started[_rank] += 1
                return _real(*a, **kw)

            setattr(eng, name, counted)
    return started
