"""Scorer networks: reference module names, causality, padding, RoPE."""

from __future__ import annotations

import pytest
import torch

from gambit_scorer.models import (
    RotaryEmbedding,
    SeqScorer,
    StepMLP,
    apply_rope,
    feature_size,
    resolve_features,
    step_features,
)

torch.set_num_threads(1)


def test_step_mlp_reference_layout():
    m = StepMLP(32)
    assert {k: tuple(v.shape) for k, v in m.state_dict().items()} == {
        "net.0.weight": (512, 32),
        "net.0.bias": (512,),
        "net.2.weight": (1, 512),
        "net.2.bias": (1,),
    }
    assert m(torch.randn(7, 32)).shape == (7,)
    assert m.model_config()["arch"] == "mlp"
    assert StepMLP(8, [16, 8]).model_config()["mlp_layers"] == 3


def test_seq_scorer_reference_names():
    m = SeqScorer(24, d_model=32, nhead=4, num_layers=2, dim_feedforward=64)
    keys = set(m.state_dict())
    for k in [
        "input_proj.0.weight",
        "input_proj.1.weight",
        "norm.weight",
        "head.weight",
        "head.bias",
    ]:
        assert k in keys
    for i in range(2):
        for part in [
            "norm1.weight",
            "norm2.weight",
            "attn.qkv.weight",
            "attn.out_proj.weight",
            "ffn.gate.weight",
            "ffn.up.weight",
            "ffn.down.weight",
        ]:
            assert f"layers.{i}.{part}" in keys
    assert "layers.0.attn.qkv.bias" not in keys  # fused qkv without bias
    assert m.state_dict()["layers.0.attn.qkv.weight"].shape == (96, 32)
    assert not any("inv_freq" in k for k in keys)
    cfg = m.model_config()
    assert (
        cfg["type"] == "sequence_transformer"
        and cfg["d_model"] == 32
        and cfg["rope_base"] == 10000.0
    )


def test_reference_default_size():
    m = SeqScorer(4096)
    n = sum(p.numel() for p in m.parameters())
    assert 1.5e6 < n < 2.2e6  # docs/REFERENCE.md: ~1.6M for d=4096 (exact count depends on biases/FFN)


def test_seq_is_causal_and_padding_free():
    torch.manual_seed(0)
    m = SeqScorer(6, d_model=16, nhead=2, num_layers=2, dim_feedforward=32).eval()
    x = torch.randn(1, 9, 6)
    y = m(x)
    x2 = x.clone()
    x2[0, 5:] = torch.randn(4, 6)
    y2 = m(x2)
    torch.testing.assert_close(y[0, :5], y2[0, :5])
    assert not torch.allclose(y[0, 5:], y2[0, 5:])
    # right padding never changes valid positions
    batch = torch.zeros(2, 12, 6)
    batch[0, :9] = x[0]
    batch[1] = torch.randn(12, 6)
    torch.testing.assert_close(m(batch)[0, :9], y[0])


def test_incremental_matches_full():
    torch.manual_seed(1)
    m = SeqScorer(5, d_model=16, nhead=4, num_layers=2, dim_feedforward=32).eval()
    x = torch.randn(2, 8, 5)
    full = m(x)
    a, cache = m.forward_with_cache(x[:, :3])
    b, cache = m.forward_with_cache(x[:, 3:4], cache, start=3)
    c, _ = m.forward_with_cache(x[:, 4:], cache, start=4)
    torch.testing.assert_close(torch.cat([a, b, c], 1), full, atol=1e-5, rtol=1e-5)


def test_rope_is_relative():
    rope = RotaryEmbedding(8, base=10000.0)
    q, k = torch.randn(8), torch.randn(8)

    def score(i, j):
        cos, sin = rope(torch.tensor([i, j]))
        qi = apply_rope(q[None], cos[:1], sin[:1])
        kj = apply_rope(k[None], cos[1:], sin[1:])
        return float(qi @ kj.T)

    assert score(3, 1) == pytest.approx(score(10, 8), abs=1e-5)
    assert score(3, 1) != pytest.approx(score(3, 2), abs=1e-3)
    cos, sin = rope(torch.tensor([0]))
    torch.testing.assert_close(apply_rope(q[None], cos, sin), q[None])  # position 0 is the identity


def test_features():
    assert resolve_features("hidden") == ("hidden",)
    assert resolve_features("hidden+conf") == ("hidden", "conf_mean", "conf_min")
    assert resolve_features(["hidden", "conf_mean", "conf_min"]) == (
        "hidden",
        "conf_mean",
        "conf_min",
    )
    assert feature_size(("hidden", "conf_mean", "conf_min"), 10) == 12
    with pytest.raises(ValueError, match="unknown feature set"):
        resolve_features("conf")
    h = torch.randn(4, 10)
    x = step_features(
        h,
        torch.full((4,), -1.0),
        torch.full((4,), -3.0),
        features=resolve_features("hidden+conf"),
        conf_norm={"mean": [-1.0, -2.0], "std": [1.0, 2.0]},
    )
    assert x.shape == (4, 12)
    torch.testing.assert_close(x[:, 10], torch.zeros(4))
    torch.testing.assert_close(x[:, 11], torch.full((4,), -0.5))
    with pytest.raises(ValueError, match="pass conf_mean"):
        step_features(h, features=resolve_features("hidden+conf"))
