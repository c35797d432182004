"""Scorer kinds (``gambit_scorer.kinds``): the registry, and the shipped checkpoints' scores
pinned (recorded before the kinds became classes; every scoring path must reproduce them)."""

from __future__ import annotations

import inspect
from pathlib import Path

import numpy as np
import pytest
import torch

from gambit_scorer.checkpoint import load_scorer
from gambit_scorer.kind_mlp import MLPKind, MLPNetwork, MLPRuntime, MLPTraining
from gambit_scorer.kind_seq import SeqKind, SeqNetwork, SeqRuntime, SeqTraining
from gambit_scorer.kinds import build_model, detect_kind, get_kind, kind_names, kind_of_model
from gambit_scorer.metrics import trace_scores_so_far
from gambit_scorer.models import SeqScorer, StepMLP
from gambit_scorer.scorer_kind import KindNetwork, KindRuntime, KindTraining, ScorerKind
from gambit_search.scoring import RuntimeScorer

torch.set_num_threads(1)
REPO = Path(__file__).resolve().parents[1]

# score_trace of np.random.default_rng(0).standard_normal((7, 128)), recorded with the
# kind == "mlp" / "seq" branches this module replaced
PINNED = {
    "mlp": [0.9975935, 0.5487264, 0.5204215, 0.6171528, 0.5181691, 0.4654052, 0.5080225],
    "seq": [0.594663, 0.3741929, 0.360117, 0.3427414, 0.2899165, 0.2489534, 0.350028],
}


@pytest.mark.parametrize("name", ["mlp", "seq"])
def test_shipped_checkpoints_score_as_pinned(name):
    s = load_scorer(REPO / "checkpoints" / f"toy-scorer-{name}" / "ckpt.pt")
    assert s.kind == name and s.scorer_kind is get_kind(name)
    x = np.random.default_rng(0).standard_normal((7, 128)).astype(np.float32)
    want = np.array(PINNED[name])
    np.testing.assert_allclose(s.score_trace(x), want, rtol=2e-6, atol=1e-7)
    # one step at a time, through the run-time scorer; a branch forked after 4 steps
    rs = RuntimeScorer(s, threads=None)
    rs.add("a")
    got = [rs.score([("a", x[t], t)])[0] for t in range(4)]
    rs.add("b", parent="a")
    got += [rs.score([("a", x[t], t), ("b", x[t], t)]) for t in range(4, 7)]
    np.testing.assert_allclose(got[:4], want[:4], rtol=2e-6, atol=1e-7)
    np.testing.assert_allclose(
        np.array(got[4:]), np.repeat(want[4:, None], 2, 1), rtol=2e-6, atol=1e-7
    )


def test_registry():
    assert kind_names() == ("mlp", "seq")
    assert isinstance(get_kind("mlp"), MLPKind) and isinstance(get_kind("seq"), SeqKind)
    assert get_kind(get_kind("seq")) is get_kind("seq")
    with pytest.raises(
        ValueError, match=r"^unknown scorer kind 'lstm': the known kinds are mlp, seq"
    ) as ei:
        get_kind("lstm")
    assert "\n" not in str(ei.value) and "scorer=mlp or scorer=seq" in str(ei.value)
    with pytest.raises(ValueError, match="unknown scorer kind None"):
        get_kind(None)
    assert kind_of_model(StepMLP(4)).name == "mlp"
    assert kind_of_model(SeqScorer(4, d_model=8, nhead=2, dim_feedforward=8)).name == "seq"
    with pytest.raises(TypeError, match="expected a StepMLP or SeqScorer, got Linear"):
        kind_of_model(torch.nn.Linear(2, 1))
    assert isinstance(build_model("mlp", 4, hidden_sizes=[3]), StepMLP)
    with pytest.raises(ValueError, match="known kinds are mlp, seq"):
        build_model("lstm", 4)


PARTS = {"seq": (SeqNetwork, SeqTraining, SeqRuntime), "mlp": (MLPNetwork, MLPTraining, MLPRuntime)}


@pytest.mark.parametrize("name", ["mlp", "seq"])
def test_a_kind_is_its_three_parts(name):
    """The registered kind is one part per interface plus ScorerKind, nothing of its own but
    ``name``; each part stands alone (instantiable: it implements every abstract method of its
    interface) and defines only its interface's names, so a method written in the wrong part
    fails here; an interface missing any of its abstract methods cannot be instantiated."""
    kind = type(get_kind(name))
    parts = PARTS[name]
    assert kind.__bases__ == (*parts, ScorerKind)
    assert {k for k in vars(kind) if not k.startswith("_")} == {"name"}
    for part, iface in zip(parts, (KindNetwork, KindTraining, KindRuntime), strict=True):
        assert part.__bases__ == (iface,)
        part()  # complete alone
        mine = {k for k in vars(part) if not k.startswith("_")}
        declared = set(dir(iface)) | set(inspect.get_annotations(iface))
        assert mine <= declared, (part, mine - declared)
        assert iface.__abstractmethods__
        for missing in iface.__abstractmethods__:
            half = type("Half", (iface,), {k: v for k, v in vars(part).items() if k != missing})
            with pytest.raises(TypeError, match=missing):
                half()


def test_detect_kind_and_rebuild():
    seq = SeqScorer(6, d_model=8, nhead=2, num_layers=2, dim_feedforward=12)
    sd, mc = seq.state_dict(), seq.model_config()
    assert detect_kind(sd, mc).name == "seq"
    assert detect_kind(sd, {}).name == "seq"  # from the weights' names alone
    back = get_kind("seq").from_state_dict(sd, mc)
    assert back.model_config() == {**mc, "dropout": 0.0}
    mlp = StepMLP(6, [5, 4])
    assert detect_kind(mlp.state_dict(), {}).name == "mlp"
    assert get_kind("mlp").from_state_dict(mlp.state_dict(), {}).hidden_sizes == [5, 4]
    assert detect_kind({"w": torch.zeros(1)}, {}) is None


def test_kind_behaviour():
    mlp, seq = get_kind("mlp"), get_kind("seq")
    st = seq.new_state()
    assert seq.fork(st) is st and mlp.fork(mlp.new_state()) == mlp.new_state()
    assert mlp.resolve_loss_position("anything") is None
    assert seq.resolve_loss_position("every") == "every"
    with pytest.raises(ValueError, match="choose last or every"):
        seq.resolve_loss_position("first")
    assert mlp.units(np.array([0, 3])).tolist() == [0, 3]
    assert seq.units(np.array([0, 3])).tolist() == [0, 1]
    with pytest.raises(TypeError, match="score_steps is for MLP"):
        seq.score_steps(None, torch.zeros(1, 4))
    trace, prob = np.array([0, 0, 1]), np.array([0.2, 0.4, 0.9])
    np.testing.assert_allclose(trace_scores_so_far(trace, None, prob, mlp), [0.2, 0.3, 0.9])
    np.testing.assert_allclose(trace_scores_so_far(trace, None, prob, "seq"), prob)
