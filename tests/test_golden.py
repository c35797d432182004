"""Refactors keep behaviour: every method's results on the fake engine, for the same seed,
equal those recorded before the issue-18 refactor (tests/golden/fake_engine_results.json:
answers, vote tables, unique tokens and tree statistics per question)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gambit_search.solve import make_config, solve

GOLDEN = json.loads((Path(__file__).parent / "golden" / "fake_engine_results.json").read_text())


@pytest.mark.parametrize("method", sorted(GOLDEN["results"]))
def test_fake_engine_results_are_unchanged(tmp_path, fake_scorer, method):
    s = solve(make_config(engine="fake", dataset="toy:test:12", method=method, n=16,
                          scorer=fake_scorer, out=str(tmp_path / method)), progress=False)
    got = {r["id"]: {"answer": r["answer"], "votes": r["votes"],
                     "unique_tokens": r["unique_tokens"], "tree_stats": r["tree_stats"]}
           for r in s["results"]}
    assert got == GOLDEN["results"][method]
