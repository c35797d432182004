"""Refactors keep behaviour: every method's results on the fake engine, for the same seed,
equal those recorded before the issue-18 refactor (tests/golden/fake_engine_results.json:
answers, vote tables, unique tokens and tree statistics per question). It guards refactors,
not defaults: a method whose defaults have moved since runs its recorded settings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gambit_search.solve import make_config, solve

GOLDEN = json.loads((Path(__file__).parent / "golden" / "fake_engine_results.json").read_text())
RECORDED = {"gambit": {"capacity": 16, "swap": 2}}
"""Settings the golden file ran that are no longer the defaults (Gambit's C and K at N = 16
scale with N since issue 29: C = 8, K = 1)."""


@pytest.mark.parametrize("method", sorted(GOLDEN["results"]))
def test_fake_engine_results_are_unchanged(tmp_path, fake_scorer, method):
    s = solve(make_config(engine="fake", dataset="toy:test:12", method=method, n=16,
                          scorer=fake_scorer, out=str(tmp_path / method),
                          **RECORDED.get(method, {})), progress=False)
    got = {r["id"]: {"answer": r["answer"], "votes": r["votes"],
                     "unique_tokens": r["unique_tokens"], "tree_stats": r["tree_stats"]}
           for r in s["results"]}
    assert got == GOLDEN["results"][method]
