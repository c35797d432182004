"""Monte-Carlo process labels (data_pipelines.labels) on the scripted fake engine.

A hand-made policy decides the answer from the prefix: a continuation of a prefix holding
token 30 always writes the gold answer, one without it never does, and one holding token 31
does so only for some seeds. So the label of each boundary is known by hand, and the
continuations must start from exactly that boundary's prefix to get it."""

from __future__ import annotations

import numpy as np
import pytest

from data_pipelines.labels import MCTrace, mc_boundaries, mc_label_traces, mc_seed
from gambit_search.engine import SamplingSpec
from gambit_search.fake_engine import EOS, FakeEngine, FakeEngineConfig

GOLD_TOK, WRONG_TOK = 40, 41


def policy(seq, seed):
    if seq[-1] in (GOLD_TOK, WRONG_TOK):
        return EOS
    if 30 in seq:
        return GOLD_TOK
    if 31 in seq:
        return GOLD_TOK if seed % 3 == 0 else WRONG_TOK
    return WRONG_TOK


def decode(ids):
    words = {4: "\n\n", GOLD_TOK: "\\boxed{7}", WRONG_TOK: "\\boxed{3}", EOS: ""}
    return "".join(words.get(int(i), "x") for i in ids)


class Recording(FakeEngine):
    """Records every continuation's prompt, its parent and fork point."""

    def __init__(self, cfg):
        super().__init__(cfg)
        self.made = []

    def add_trace(self, prompt_ids, spec, seed=None):
        t = super().add_trace(prompt_ids, spec, seed)
        self.made.append(("add", t, tuple(prompt_ids), None, seed))
        return t

    def fork(self, parent, temperature_multiplier=1.0, seed=None, max_tokens=None, at=None):
        t = super().fork(parent, temperature_multiplier, seed, max_tokens, at)
        self.made.append(("fork", t, tuple(self.trace_info(t).prompt_ids), (parent, at), seed))
        return t


PROMPT = (1, 10)
# output: x \n\n 30 \n\n x \n\n answer: boundaries after "x", after "30", after the second "x"
OUTPUT = (11, 4, 30, 4, 12, 4, WRONG_TOK, EOS)
BOUNDS = (1, 3, 5)


def trace(output=OUTPUT, bounds=BOUNDS, qid="q0"):
    return MCTrace(qid, 0, "7", PROMPT, tuple(output), tuple(bounds))


def run(traces, k, every=1, seed=0, max_live=256):
    eng = Recording(FakeEngineConfig(policy=policy, num_blocks=256))
    spec = SamplingSpec(temperature=1.0, top_p=1.0, top_k=0, max_tokens=64, stream=False)
    done = []
    res = mc_label_traces(eng, traces, spec, k=k, every=every, seed=seed, decode=decode,
                          max_live=max_live, on_done=done.append)
    return eng, res, sum(done)


def test_label_is_1_after_the_deciding_token_and_0_before_it():
    eng, [(labels, hits)], n_done = run([trace()], k=3)
    # boundary 0: prefix "x" -> every continuation answers 3 (wrong); boundaries 1, 2 hold 30
    assert labels.tolist() == [0, 1, 1] and hits.tolist() == [0, 3, 3]
    assert n_done == 9 and not eng.has_unfinished()


def test_every_continuation_starts_from_its_boundarys_prefix():
    eng, _, _ = run([trace()], k=3)
    stems = [m for m in eng.made if m[0] == "add"]
    forks = [m for m in eng.made if m[0] == "fork"]
    assert [m[2] for m in stems] == [PROMPT + OUTPUT[: b + 1] for b in BOUNDS]
    assert len(forks) == 2 * len(stems)
    by_id = {m[1]: m for m in stems}
    for f in forks:
        parent, at = f[3]
        assert at == 0 and parent in by_id  # a fork of that boundary's first continuation
        assert f[2] == by_id[parent][2]  # ... so its prompt is the same prefix
    seeds = [m[4] for m in eng.made]
    assert len(set(seeds)) == len(seeds)  # k different samples, not k copies


def test_any_hit_counts_and_seeds_decide_the_noisy_case():
    out = (11, 4, 31, 4, WRONG_TOK, EOS)  # after 31 a continuation is right iff its seed % 3 == 0
    k = 4
    _, [(labels, hits)], _ = run([trace(out, (1, 3), qid="noisy")], k=k, seed=5)
    want = sum(mc_seed(5, "noisy", 0, 1, j) % 3 == 0 for j in range(k))
    assert hits.tolist() == [0, want] and labels.tolist() == [0, int(want > 0)]


def test_every_and_max_live_and_order_do_not_change_the_labels():
    ts = [trace(qid=f"q{i}") for i in range(4)]
    _, a, n_a = run(ts, k=2, every=2)
    _, b, _ = run(ts[::-1], k=2, every=2, max_live=2)
    assert mc_boundaries(3, 2) == [0, 2]
    for (la, ha), (lb, hb) in zip(a, b[::-1], strict=True):
        assert la.tolist() == lb.tolist() == [0, -1, 1]  # the middle boundary is not labelled
        assert ha.tolist() == hb.tolist()
    assert n_a == 4 * 2 * 2


def test_bad_k_is_refused():
    with pytest.raises(ValueError, match="k >= 1"):
        run([trace()], k=0)


def test_harvest_mc_pass_is_resumable_within_a_budget(tmp_path):
    from data_pipelines.harvest import HarvestConfig, harvest
    from gambit_scorer.harvest_io import HarvestError, iter_traces, read_mc_labels

    base = dict(out=str(tmp_path / "h"), engine="fake", dataset="toy:train:6", n=3, questions_per_shard=3,
                max_tokens=48)
    harvest(HarvestConfig(**base))  # the sampling, no MC labels yet
    with pytest.raises(HarvestError, match="Monte-Carlo labels for 0 of 2 shards"):
        read_mc_labels(tmp_path / "h")
    bounds = {(t.question_id, t.trace_index): len(t.boundary_positions) for t in iter_traces(tmp_path / "h")}
    first = sum(2 * len(mc_boundaries(n, 2)) for (q, _), n in bounds.items() if q.endswith(("-0", "-1", "-2")))
    s = harvest(HarvestConfig(**base, mc_labels=2, mc_every=2, mc_max_forks=first))  # one shard fits
    assert s["mc_shards_done"] == 1 and s["mc_shards_left"] == 1
    s = harvest(HarvestConfig(**base, mc_labels=2, mc_every=2))  # the rest
    assert s["mc_shards_done"] == 1 and s["mc_shards_left"] == 0
    mc = read_mc_labels(tmp_path / "h")
    assert mc.keys() == bounds.keys()
    for key, (lab, hits) in mc.items():
        assert len(lab) == bounds[key]
        assert ((lab >= 0) == np.isin(np.arange(len(lab)), mc_boundaries(len(lab), 2))).all()
        assert ((lab == 1) == (hits > 0)).all()
    from data_pipelines.harvest import _label_kinds

    assert _label_kinds(tmp_path / "h")["mc"]["k"] == 2
    with pytest.raises(Exception, match="another config"):  # k is pinned for the directory
        harvest(HarvestConfig(**base, mc_labels=3, mc_every=2))
