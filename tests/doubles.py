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
