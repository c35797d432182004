"""``merge_deltas``: the vLLM engine's catch-up takes several engine steps in one ``step`` and
must still hand out one delta per trace (the interface's promise). Fast; no vLLM.

    .venv/bin/python -m pytest -q tests/test_merge_deltas.py
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gambit_search.engine import Delta, TokenLogprobs
from gambit_search.vllm_delivery import merge_deltas


def _lp(tok: int) -> TokenLogprobs:
    return TokenLogprobs(tok, -0.5 * tok, (), ())


@st.composite
def steps(draw) -> list[Delta]:
    """Deltas of several engine steps in arrival order: each trace's in its own order, the
    first one with ``num_cached_tokens``, at most the last one finishing."""
    n_traces = draw(st.integers(1, 5))
    out: list[tuple[int, int, Delta]] = []
    for t in range(n_traces):
        chunks = draw(st.lists(st.lists(st.integers(0, 50), max_size=3), min_size=1, max_size=4))
        finish = draw(st.sampled_from([None, "stop", "length"]))
        for k, toks in enumerate(chunks):
            last = k == len(chunks) - 1
            out.append((k, t, Delta(t, tuple(toks), "".join(chr(97 + x % 26) for x in toks),
                                    finish if last else None, tuple(_lp(x) for x in toks),
                                    7 * t if k == 0 else None)))
    # interleave the traces as engine steps would: step k holds every trace's k-th chunk
    out.sort(key=lambda r: (r[0], draw(st.integers(0, 3)), r[1]))
    return [d for _, _, d in out]


@given(steps())
def test_one_delta_per_trace_with_every_token_in_order(deltas: list[Delta]) -> None:
    merged = merge_deltas(deltas)
    traces = [d.trace for d in merged]
    assert len(traces) == len(set(traces)), "at most one delta per trace"
    assert traces == list(dict.fromkeys(d.trace for d in deltas)), "the first one's place"
    for m in merged:
        own = [d for d in deltas if d.trace == m.trace]
        assert m.token_ids == sum((d.token_ids for d in own), ())
        assert m.text == "".join(d.text for d in own)
        assert m.logprobs == sum((d.logprobs for d in own), ())
        assert m.finish_reason == own[-1].finish_reason
        assert m.num_cached_tokens == own[0].num_cached_tokens


def test_no_repeat_returns_the_same_list_and_missing_logprobs_stay_missing() -> None:
    one = [Delta(1, (3,), "c"), Delta(2, (4,), "d")]
    assert merge_deltas(one) is one
    two = merge_deltas([Delta(1, (3,), "c", logprobs=(_lp(3),)), Delta(1, (4,), "d", "error",
                                                                       error="boom")])
    assert two == [Delta(1, (3, 4), "cd", "error", None, None, "boom")]
