"""Checkpoints: our format, reference STEP/Gambit layouts, the runtime API, clear load errors."""

from __future__ import annotations

import math
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from gambit_scorer.checkpoint import (
    BoundaryTokenMismatchError,
    HiddenSizeMismatchError,
    ScorerLoadError,
    load_scorer,
    save_checkpoint,
)
from gambit_scorer.models import SeqScorer, StepMLP

torch.set_num_threads(1)


# --------------------------------------------------------------------------- a reference-layout
# sequence scorer written independently from docs/REFERENCE.md (naive loops), to check that
# gambit_scorer.models computes the same function from the same state dict.


class _RefAttn(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.out_proj = nn.Linear(d, d)


class _RefFFN(nn.Module):
    def __init__(self, d, ff, bias):
        super().__init__()
        self.gate, self.up, self.down = (
            nn.Linear(d, ff, bias=bias),
            nn.Linear(d, ff, bias=bias),
            nn.Linear(ff, d, bias=bias),
        )


class _RefLayer(nn.Module):
    def __init__(self, d, ff, bias):
        super().__init__()
        self.norm1, self.attn, self.norm2, self.ffn = (
            nn.LayerNorm(d),
            _RefAttn(d),
            nn.LayerNorm(d),
            _RefFFN(d, ff, bias),
        )


class RefSeq(nn.Module):
    def __init__(self, d_in, d=32, nhead=4, layers=2, ff=64, base=10000.0, ffn_bias=False):
        super().__init__()
        self.nhead, self.base = nhead, base
        self.input_proj = nn.Sequential(nn.LayerNorm(d_in), nn.Linear(d_in, d), nn.GELU())
        self.layers = nn.ModuleList(_RefLayer(d, ff, ffn_bias) for _ in range(layers))
        self.norm, self.head = nn.LayerNorm(d), nn.Linear(d, 1)

    def rope(self, v, pos):  # v [hd]; pair i with i + hd/2, angle pos * base^(-2i/hd)
        hd = v.shape[0]
        out = v.clone()
        for i in range(hd // 2):
            a = pos * self.base ** (-2 * i / hd)
            x1, x2 = v[i], v[i + hd // 2]
            out[i] = x1 * math.cos(a) - x2 * math.sin(a)
            out[i + hd // 2] = x2 * math.cos(a) + x1 * math.sin(a)
        return out

    @torch.no_grad()
    def forward(self, x):  # x [T, d_in] -> logits [T]
        h = self.input_proj(x)
        T, D = h.shape
        hd = D // self.nhead
        for L in self.layers:
            q, k, v = L.attn.qkv(L.norm1(h)).split(D, -1)
            att = torch.zeros(T, D)
            for head in range(self.nhead):
                sl = slice(head * hd, (head + 1) * hd)
                for t in range(T):
                    qt = self.rope(q[t, sl], t)
                    ks = torch.stack([self.rope(k[j, sl], j) for j in range(t + 1)])
                    w = torch.softmax(ks @ qt / math.sqrt(hd), 0)
                    att[t, sl] = w @ v[: t + 1, sl]
            h = h + L.attn.out_proj(att)
            g = L.norm2(h)
            h = h + L.ffn.down(torch.nn.functional.silu(L.ffn.gate(g)) * L.ffn.up(g))
        return self.head(self.norm(h)).squeeze(-1)


def _randomize(m, std=0.2):
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in m.named_parameters():
            is_norm_weight = "norm" in name or "input_proj.0" in name
            p.copy_(
                torch.randn(p.shape, generator=g) * std
                + (1.0 if is_norm_weight and name.endswith("weight") else 0.0)
            )
    return m


@pytest.mark.parametrize("ffn_bias", [False, True])
def test_reference_sequence_checkpoint(tmp_path, ffn_bias):
    ref = _randomize(RefSeq(12, ffn_bias=ffn_bias)).eval()
    cfg = {
        "type": "sequence_transformer",
        "d_model": 32,
        "nhead": 4,
        "num_layers": 2,
        "dim_feedforward": 64,
        "max_len": 64,
        "rope_base": 10000.0,
    }
    p = tmp_path / "seq_ref.pt"
    torch.save({"model_state_dict": ref.state_dict(), "model_config": cfg}, p)
    s = load_scorer(p, expected_hidden_size=12)
    assert s.kind == "seq" and s.features == ("hidden",) and s.is_reference and s.hidden_size == 12
    x = torch.randn(6, 12)
    np.testing.assert_allclose(s.score_trace(x), torch.sigmoid(ref(x)).numpy(), atol=1e-5)
    # incremental history == full pass, and branching shares the parent's history safely
    h = s.init_history()
    scores = []
    for t in range(4):
        h, sc = s.append(h, x[t])
        scores.append(sc)
    child = s.copy_history(h)
    h_a, sa = s.append(h, x[4])
    h_b, sb = s.append(child, x[5])
    full_a = torch.sigmoid(ref(x[:5]))
    full_b = torch.sigmoid(ref(torch.cat([x[:4], x[5:6]])))
    np.testing.assert_allclose(scores, full_a[:4].numpy(), atol=1e-5)
    assert sa == pytest.approx(float(full_a[4]), abs=1e-5) and sb == pytest.approx(
        float(full_b[4]), abs=1e-5
    )
    assert h.n_steps == 4 and h_a.n_steps == h_b.n_steps == 5
    with pytest.raises(TypeError, match="score_steps is for MLP"):
        s.score_steps(x)


@pytest.mark.parametrize(
    "hidden, cfg",
    [
        ([512], None),
        ([512], {"arch": "mlp"}),
        ([24, 12], {"arch": "mlp", "mlp_layers": 3}),
        ([48, 24, 12], {"arch": "mlp", "mlp_layers": 4}),
    ],
)
def test_reference_mlp_checkpoint(tmp_path, hidden, cfg):
    layers, d = [], 20
    for h in hidden:
        layers += [nn.Linear(d, h), nn.ReLU()]
        d = h
    net = nn.Sequential(*layers, nn.Linear(d, 1))
    obj = {"model_state_dict": {f"net.{k}": v for k, v in net.state_dict().items()}}
    if cfg is None:  # also a bare Sequential state dict
        obj = {"model_state_dict": net.state_dict()}
    if cfg is not None:
        obj["model_config"] = cfg
    p = tmp_path / "mlp_ref.pt"
    torch.save(obj, p)
    s = load_scorer(p, expected_hidden_size=20)
    assert s.kind == "mlp" and s.features == ("hidden",) and s.is_reference
    x = torch.randn(5, 20)
    want = torch.sigmoid(net(x).squeeze(-1)).detach().numpy()
    np.testing.assert_allclose(s.score_steps(x), want, atol=1e-6)
    np.testing.assert_allclose(s.score_trace(x), np.cumsum(want) / np.arange(1, 6), atol=1e-6)
    h, score = s.init_history(), None
    for t in range(5):
        h, score = s.append(h, x[t])
    assert score == pytest.approx(want.mean(), abs=1e-6) and h.n_steps == 5
    hs, sc = s.append_many([s.init_history(), h], x[:2])
    assert sc[0] == pytest.approx(want[0], abs=1e-6)
    assert sc[1] == pytest.approx((want.sum() + want[1]) / 6, abs=1e-6)


def test_our_checkpoint_roundtrip_weights_only(tmp_path):
    m = StepMLP(18)
    p = tmp_path / "ckpt.pt"
    save_checkpoint(
        p,
        m,
        features=["hidden", "conf_mean", "conf_min"],
        hidden_size=16,
        conf_norm={"mean": [-0.4, -2.5], "std": [0.2, 1.0]},
        policy_model="/models/toy",
        policy_model_hash="abc",
        boundary_token_ids=[5],
        metrics={"trace_auroc": np.float64(0.7)},
        train_config="seed: 0\n",
    )
    raw = torch.load(p, weights_only=True)
    assert set(raw) == {"model_state_dict", "model_config", "gambit"}
    assert set(raw["model_state_dict"]) == {
        "net.0.weight",
        "net.0.bias",
        "net.2.weight",
        "net.2.bias",
    }
    meta = raw["gambit"]
    assert meta["arch"] == "mlp" and meta["input_size"] == 18 and meta["hidden_size"] == 16
    assert meta["policy_model"] == "/models/toy" and meta["boundary_token_ids"] == [5]
    assert type(meta["versions"]["torch"]) is str and isinstance(
        meta["metrics"]["trace_auroc"], float
    )
    s = load_scorer(p, expected_hidden_size=16)
    assert (
        s.features == ("hidden", "conf_mean", "conf_min")
        and s.needs_confidence
        and not s.is_reference
    )
    h = np.random.default_rng(0).standard_normal((3, 16))
    with pytest.raises(ValueError, match="pass conf_mean"):
        s.score_steps(h)
    x = torch.cat(
        [
            torch.as_tensor(h).float(),
            ((torch.tensor([-0.4] * 3) - -0.4) / 0.2)[:, None],
            ((torch.tensor([-1.5] * 3) - -2.5) / 1.0)[:, None],
        ],
        1,
    )
    want = torch.sigmoid(m(x)).detach().numpy()
    np.testing.assert_allclose(s.score_steps(h, [-0.4] * 3, [-1.5] * 3), want, atol=1e-6)


def test_load_errors(tmp_path):
    p = tmp_path / "seq.pt"
    save_checkpoint(
        p,
        SeqScorer(16, d_model=16, nhead=2, dim_feedforward=32),
        features=["hidden"],
        hidden_size=16,
        policy_model="toy-policy",
    )
    with pytest.raises(HiddenSizeMismatchError, match=r"size 16 \(toy-policy\).*hidden size 4096") as ei:
        load_scorer(p, expected_hidden_size=4096)
    assert "\n" not in str(ei.value)
    s = load_scorer(p)
    with pytest.raises(HiddenSizeMismatchError):
        s.append(s.init_history(), np.zeros(8))
    with pytest.raises(ScorerLoadError, match="does not exist"):
        load_scorer(tmp_path / "nope.pt")
    torch.save({"model_state_dict": {"foo.weight": torch.zeros(2)}}, tmp_path / "bad.pt")
    with pytest.raises(ScorerLoadError, match="unknown scorer architecture"):
        load_scorer(tmp_path / "bad.pt")
    sd = SeqScorer(8, d_model=16, nhead=2, dim_feedforward=32).state_dict()
    torch.save(
        {"model_state_dict": sd, "model_config": {"type": "sequence_transformer", "d_model": 32}},
        tmp_path / "c.pt",
    )
    with pytest.raises(ScorerLoadError, match="d_model=32 but the weights have d_model=16"):
        load_scorer(tmp_path / "c.pt")


REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("config", ["without_nhead", "no_model_config"])
def test_reference_sequence_checkpoint_without_nhead_is_refused(tmp_path, config):
    """The head count cannot be read off the fused qkv: a missing nhead used to load as 4 heads."""
    ref = _randomize(RefSeq(12, nhead=2)).eval()
    obj = {"model_state_dict": ref.state_dict()}
    if config == "without_nhead":
        obj["model_config"] = {"type": "sequence_transformer", "d_model": 32, "num_layers": 2}
    p = tmp_path / "seq_ref.pt"
    torch.save(obj, p)
    with pytest.raises(ScorerLoadError, match=r"model_config has no 'nhead'.*cannot be inferred") as ei:
        load_scorer(p, expected_hidden_size=12)
    assert str(p) in str(ei.value) and "\n" not in str(ei.value)
    obj["model_config"] = {"type": "sequence_transformer", "nhead": 2}  # with it: the same function
    torch.save(obj, p)
    x = torch.randn(5, 12)
    np.testing.assert_allclose(load_scorer(p).score_trace(x), torch.sigmoid(ref(x)).numpy(), atol=1e-5)
    obj["model_config"]["nhead"] = "two"
    torch.save(obj, p)
    with pytest.raises(ScorerLoadError, match="nhead='two'"):
        load_scorer(p)


@pytest.mark.parametrize("name", ["toy-scorer-seq", "toy-scorer-mlp"])
def test_shipped_checkpoints_load(name):
    s = load_scorer(REPO / "checkpoints" / name / "ckpt.pt", expected_hidden_size=128,
                    expected_boundary_token_ids=[4])
    assert s.kind == name.rsplit("-", 1)[1] and not s.is_reference
    if s.kind == "seq":
        assert s.model.layers[0].attn.nhead == s.model_config["nhead"] == 4
    assert s.score_trace(np.zeros((3, 128), np.float32)).shape == (3,)


def _zip_ckpt_bytes(tmp_path) -> bytes:
    p = tmp_path / "whole.pt"
    save_checkpoint(p, StepMLP(8), features=["hidden"], hidden_size=8)
    return p.read_bytes()


@pytest.mark.parametrize(
    "kind, want",
    [
        ("random_bytes", "not a torch checkpoint"),
        ("text_file", "not a torch checkpoint"),
        ("empty_file", "empty"),
        ("truncated_zip", "damaged torch checkpoint"),
        ("pickled_list", "damaged pickle"),  # pickle.dump, not torch.save
        ("torch_saved_list", "holds a list, not a checkpoint dict"),
        ("torch_saved_tensor", "holds a Tensor, not a checkpoint dict"),
        ("numpy_inside", "objects other than tensors"),
        ("state_dict_not_a_dict", "state dict is a list"),
        ("state_dict_with_a_string", "'net.0.weight' is a str, expected a tensor"),
        ("config_not_a_dict", "'model_config' is a str"),
        ("wrong_shapes", "weights do not fit the mlp scorer"),
        ("directory", "is a directory"),
    ],
)
def test_corrupt_checkpoint_is_one_line_error_naming_the_file(tmp_path, kind, want):
    p = tmp_path / "ckpt.pt"
    mlp_sd = dict(StepMLP(8).state_dict())  # keys net.0.weight, ...
    if kind == "random_bytes":
        p.write_bytes(bytes([0x17]) + np.random.default_rng(0).bytes(4095))
    elif kind == "text_file":
        p.write_text("model_state_dict: not really\nsecond line\n")
    elif kind == "empty_file":
        p.write_bytes(b"")
    elif kind == "truncated_zip":
        b = _zip_ckpt_bytes(tmp_path)
        p.write_bytes(b[: len(b) // 2])
    elif kind == "pickled_list":
        p.write_bytes(pickle.dumps([1, 2, 3]))
    elif kind == "torch_saved_list":
        torch.save([1, 2, 3], p)
    elif kind == "torch_saved_tensor":
        torch.save(torch.zeros(3), p)
    elif kind == "numpy_inside":
        torch.save({"model_state_dict": {"net.0.weight": np.zeros((2, 2))}}, p)
    elif kind == "state_dict_not_a_dict":
        torch.save({"model_state_dict": [torch.zeros(2)]}, p)
    elif kind == "state_dict_with_a_string":
        torch.save({"model_state_dict": {**mlp_sd, "net.0.weight": "w"}}, p)
    elif kind == "config_not_a_dict":
        torch.save({"model_state_dict": mlp_sd, "model_config": "mlp"}, p)
    elif kind == "wrong_shapes":  # torch's load_state_dict error is several lines
        torch.save({"model_state_dict": {**mlp_sd, "net.0.bias": torch.zeros(3)}}, p)
    elif kind == "directory":
        p.mkdir()
    with pytest.raises(ScorerLoadError) as ei:
        load_scorer(p)
    msg = str(ei.value)
    assert "\n" not in msg and "\x1b" not in msg, msg
    assert str(p) in msg and want in msg, msg
    assert "Traceback" not in msg and len(msg) < 600, msg


def test_boundary_token_ids_are_checked_when_given(tmp_path):
    p = tmp_path / "ckpt.pt"
    save_checkpoint(p, StepMLP(16), features=["hidden"], hidden_size=16, boundary_token_ids=[271, 4],
                    policy_model="toy-policy")
    load_scorer(p, expected_boundary_token_ids=[4, 271])  # compared as sets
    load_scorer(p, expected_boundary_token_ids=(271, 4, 4))
    load_scorer(p)  # not given: not checked
    with pytest.raises(BoundaryTokenMismatchError) as ei:
        load_scorer(p, expected_hidden_size=16, expected_boundary_token_ids=[198])
    msg = str(ei.value)
    assert isinstance(ei.value, ScorerLoadError) and "\n" not in msg
    assert "[4, 271]" in msg and "[198]" in msg and "another tokenizer's boundaries" in msg
    assert str(p) in msg
    with pytest.raises(TypeError):  # keyword-only
        load_scorer(p, 16, [4, 271])
    # no record: a reference checkpoint, or ours saved without boundary ids
    ref = tmp_path / "ref.pt"
    torch.save({"model_state_dict": StepMLP(16).state_dict()}, ref)
    assert load_scorer(ref, expected_boundary_token_ids=[198]).is_reference
    unrec = tmp_path / "unrecorded.pt"
    save_checkpoint(unrec, StepMLP(16), features=["hidden"], hidden_size=16)
    load_scorer(unrec, expected_boundary_token_ids=[198])


def test_hidden_size_mismatch_message_is_one_line(tmp_path):
    p = tmp_path / "ckpt.pt"
    save_checkpoint(p, StepMLP(16), features=["hidden"], hidden_size=16, policy_model="my\nmodel")
    with pytest.raises(HiddenSizeMismatchError) as ei:
        load_scorer(p, expected_hidden_size=32)
    assert "\n" not in str(ei.value) and "hidden size 32" in str(ei.value)


def test_loading_imports_neither_lightning_nor_hydra(tmp_path):
    p = tmp_path / "m.pt"
    save_checkpoint(p, StepMLP(8), features=["hidden"], hidden_size=8)
    code = (
        "import sys; from gambit_scorer.checkpoint import load_scorer; "
        f"s = load_scorer({str(p)!r}, expected_hidden_size=8); s.score_steps([[0.0] * 8]); "
        "bad = sorted({m.split('.')[0] for m in sys.modules} & {'lightning', 'pytorch_lightning', 'hydra', 'omegaconf'}); "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
