"""Scorer networks: plain ``nn.Module``s, no Lightning.

Both read one feature vector per thought boundary (see :func:`step_features`: the policy
model's hidden state, optionally followed by the thought's token confidence) and return
*logits*; sigmoid gives probabilities.

- :class:`StepMLP`: the STEP scorer, Linear(d, 512) -> ReLU -> Linear(512, 1) on each step
  independently. Module names ``net.0`` / ``net.2`` match the reference checkpoints.
- :class:`SeqScorer`: the history-aware scorer, a small pre-norm causal transformer over the
  sequence of a trace's steps: LayerNorm -> Linear -> GELU input projection, N blocks of
  causal multi-head self-attention with RoPE and a SwiGLU feed-forward, final LayerNorm,
  Linear head. Position t sees steps 1..t only. Module names (``input_proj.{0,1}``,
  ``layers.N.{norm1,norm2,attn.qkv,attn.out_proj,ffn.gate,ffn.up,ffn.down}``, ``norm``,
  ``head``) match the reference checkpoints.

Batches of sequences are *right*-padded: since attention is causal, a valid position never
attends to a padded one, so no key-padding mask is needed and padded outputs are ignored.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.rnn import pad_sequence

# One layer's attention cache: keys and values [B, n_head, T, head_dim].
KVCache = tuple[Tensor, Tensor]


class StepMLP(nn.Module):
    """Per-step scorer: Linear -> ReLU (-> Linear -> ReLU ...) -> Linear(., 1)."""

    def __init__(self, input_size: int, hidden_sizes: Sequence[int] = (512,)):
        super().__init__()
        self.input_size = int(input_size)
        self.hidden_sizes = [int(h) for h in hidden_sizes]
        layers: list[nn.Module] = []
        d = self.input_size
        for h in self.hidden_sizes:
            layers += [nn.Linear(d, h), nn.ReLU()]
            d = h
        layers.append(nn.Linear(d, 1))
        self.net = nn.Sequential(*layers)

    def forward(self, x: Tensor) -> Tensor:
        """[..., input_size] -> logits [...]."""
        return self.net(x).squeeze(-1)

    def model_config(self) -> dict:
        """Reference-style ``model_config`` (``mlp_layers`` only where the reference defines it)."""
        cfg: dict = {
            "arch": "mlp",
            "input_dim": self.input_size,
            "hidden_sizes": list(self.hidden_sizes),
        }
        if len(self.hidden_sizes) in (2, 3):
            cfg["mlp_layers"] = len(self.hidden_sizes) + 1
        return cfg


# ----------------------------------------------------------------------------- RoPE


class RotaryEmbedding(nn.Module):
    """Rotary position embedding, "rotate halves" convention (as in Llama / HF).

    Pairs dimension i with i + head_dim/2 and rotates the pair by angle pos * base^(-2i/head_dim).
    """

    def __init__(self, head_dim: int, base: float = 10000.0):
        super().__init__()
        if head_dim % 2:
            raise ValueError(f"RoPE needs an even head size, got {head_dim}")
        inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)  # not in the state dict

    def forward(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        """positions [T] -> (cos, sin), each [T, head_dim]."""
        freqs = torch.outer(positions.to(self.inv_freq.dtype), self.inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos(), emb.sin()


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate x [..., T, head_dim] by the angles in cos/sin [T, head_dim]."""
    x1, x2 = x.chunk(2, dim=-1)
    rotated = torch.cat((-x2, x1), dim=-1)
    return x * cos.to(x.dtype) + rotated * sin.to(x.dtype)


# ----------------------------------------------------------------------------- SeqScorer


class CausalSelfAttention(nn.Module):
    def __init__(
        self,
        d_model: int,
        nhead: int,
        rope_base: float,
        dropout: float = 0.0,
        out_bias: bool = True,
    ):
        super().__init__()
        if d_model % nhead:
            raise ValueError(f"d_model={d_model} is not divisible by nhead={nhead}")
        self.nhead, self.head_dim, self.dropout = nhead, d_model // nhead, dropout
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)  # fused, split as q, k, v
        self.out_proj = nn.Linear(d_model, d_model, bias=out_bias)
        self.rope = RotaryEmbedding(self.head_dim, rope_base)

    def forward(
        self, x: Tensor, past: KVCache | None = None, start: int = 0
    ) -> tuple[Tensor, KVCache]:
        """x [B, T, d_model] at positions start..start+T-1; past: cached keys/values before them."""
        B, T, D = x.shape
        q, k, v = self.qkv(x).split(D, dim=-1)
        q, k, v = (t.view(B, T, self.nhead, self.head_dim).transpose(1, 2) for t in (q, k, v))
        cos, sin = self.rope(torch.arange(start, start + T, device=x.device))
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if past is not None:
            k, v = torch.cat((past[0], k), dim=2), torch.cat((past[1], v), dim=2)
        n_past = k.shape[2] - T
        p = self.dropout if self.training else 0.0
        if n_past == 0:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=p)
        elif T == 1:  # one new step sees the whole cache
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=p)
        else:  # new step i sees the cache and new steps <= i
            allowed = torch.ones(T, n_past + T, dtype=torch.bool, device=x.device).tril(
                diagonal=n_past
            )
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, dropout_p=p)
        y = y.transpose(1, 2).reshape(B, T, D)
        return self.out_proj(y), (k, v)


class SwiGLU(nn.Module):
    def __init__(self, d_model: int, dim_feedforward: int, bias: bool = False):
        super().__init__()
        self.gate = nn.Linear(d_model, dim_feedforward, bias=bias)
        self.up = nn.Linear(d_model, dim_feedforward, bias=bias)
        self.down = nn.Linear(dim_feedforward, d_model, bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(norm1(x)), then + ffn(norm2(x))."""

    def __init__(
        self,
        d_model,
        nhead,
        dim_feedforward,
        rope_base,
        dropout=0.0,
        attn_out_bias=True,
        ffn_bias=False,
    ):
        super().__init__()
        self.norm1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, nhead, rope_base, dropout, attn_out_bias)
        self.norm2 = nn.LayerNorm(d_model)
        self.ffn = SwiGLU(d_model, dim_feedforward, ffn_bias)
        self.drop = nn.Dropout(dropout)

    def forward(
        self, x: Tensor, past: KVCache | None = None, start: int = 0
    ) -> tuple[Tensor, KVCache]:
        a, kv = self.attn(self.norm1(x), past, start)
        x = x + self.drop(a)
        x = x + self.drop(self.ffn(self.norm2(x)))
        return x, kv


class SeqScorer(nn.Module):
    """Causal transformer over a trace's step features; logits at every position."""

    def __init__(
        self,
        input_size: int,
        d_model: int = 256,
        nhead: int = 4,
        num_layers: int = 1,
        dim_feedforward: int = 1024,
        max_len: int = 4096,
        rope_base: float = 10000.0,
        dropout: float = 0.0,
        attn_out_bias: bool = True,
        ffn_bias: bool = False,
    ):
        super().__init__()
        self.cfg = dict(
            input_dim=int(input_size),
            d_model=int(d_model),
            nhead=int(nhead),
            num_layers=int(num_layers),
            dim_feedforward=int(dim_feedforward),
            max_len=int(max_len),
            rope_base=float(rope_base),
            dropout=float(dropout),
            attn_out_bias=bool(attn_out_bias),
            ffn_bias=bool(ffn_bias),
        )
        self.input_size, self.max_len = int(input_size), int(max_len)
        self.input_proj = nn.Sequential(
            nn.LayerNorm(input_size), nn.Linear(input_size, d_model), nn.GELU()
        )
        self.layers = nn.ModuleList(
            Block(d_model, nhead, dim_feedforward, rope_base, dropout, attn_out_bias, ffn_bias)
            for _ in range(num_layers)
        )
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, 1)

    def forward(self, x: Tensor, past: list[KVCache] | None = None, start: int = 0) -> Tensor:
        """x [B, T, input_size] (right-padded) -> logits [B, T]; logit t uses steps <= t only."""
        return self.forward_with_cache(x, past, start)[0]

    def forward_with_cache(
        self, x: Tensor, past: list[KVCache] | None = None, start: int = 0
    ) -> tuple[Tensor, list[KVCache]]:
        """Like forward, continuing after cached steps; also returns the extended per-layer cache."""
        h = self.input_proj(x)
        cache = []
        for i, layer in enumerate(self.layers):
            h, kv = layer(h, None if past is None else past[i], start)
            cache.append(kv)
        return self.head(self.norm(h)).squeeze(-1), cache

    @staticmethod
    def step_qkv(layer: nn.Module, h: Tensor, pos: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """One new step per trace through ``layer``'s attention input: queries, keys, values
        [B, n_head, 1, head_dim] for states ``h`` [B, 1, D] at positions ``pos`` [B] (RoPE
        applied to queries and keys)."""
        attn = layer.attn
        B, D = h.shape[0], h.shape[-1]
        q, k, v = attn.qkv(layer.norm1(h)).split(D, dim=-1)
        q, k, v = (t.view(B, 1, attn.nhead, attn.head_dim).transpose(1, 2) for t in (q, k, v))
        cos, sin = attn.rope(pos)  # [B, head_dim]
        cos, sin = cos[:, None, None, :], sin[:, None, None, :]
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    @staticmethod
    def step_out(layer: nn.Module, h: Tensor, y: Tensor) -> Tensor:
        """``layer``'s output for one new step per trace: ``h`` [B, 1, D] plus the attention
        result ``y`` [B, n_head, 1, head_dim] projected, then the feed-forward block."""
        B, D = h.shape[0], h.shape[-1]
        h = h + layer.drop(layer.attn.out_proj(y.transpose(1, 2).reshape(B, 1, D)))
        return h + layer.drop(layer.ffn(layer.norm2(h)))

    def step_batch(
        self, x: Tensor, pasts: Sequence[Sequence[KVCache] | None], starts: Sequence[int]
    ) -> tuple[Tensor, list[list[KVCache]]]:
        """One new step for each of B independent traces, in one forward.

        ``x`` [B, input_size]: each trace's new step; ``pasts[i]``: trace i's per-layer cache
        (keys/values [1, n_head, L_i, head_dim], None for an empty history); ``starts[i]``:
        the new step's absolute position (RoPE). Caches of different lengths are padded and
        masked, so row i equals ``forward_with_cache(x[i:i+1, None], pasts[i], starts[i])``.
        Returns logits [B] and each trace's extended cache (its own tensors: a parent's cache
        is never changed, so a branch may share it)."""
        B = x.shape[0]
        lens = [0 if p is None else int(p[0][0].shape[2]) for p in pasts]
        L = max(lens, default=0)
        dev = x.device
        h = self.input_proj(x).unsqueeze(1)  # [B, 1, D]
        pos = torch.as_tensor(list(starts), device=dev)
        valid = torch.zeros(B, L + 1, dtype=torch.bool, device=dev)
        for i, n in enumerate(lens):
            valid[i, :n] = True
        valid[:, L] = True
        mask = valid[:, None, None, :]  # [B, 1, 1, L + 1]
        new: list[list[KVCache]] = [[] for _ in range(B)]
        for li, layer in enumerate(self.layers):
            attn = layer.attn
            q, k, v = self.step_qkv(layer, h, pos)
            # pad the past keys/values to L in one call each, then append the new step
            empty = k.new_zeros(0, attn.nhead, attn.head_dim)
            ks = [empty if p is None else p[li][0][0].transpose(0, 1) for p in pasts]
            vs = [empty if p is None else p[li][1][0].transpose(0, 1) for p in pasts]
            if L:
                K = torch.cat((pad_sequence(ks, batch_first=True).transpose(1, 2), k), dim=2)
                V = torch.cat((pad_sequence(vs, batch_first=True).transpose(1, 2), v), dim=2)
            else:
                K, V = k, v
            h = self.step_out(layer, h, F.scaled_dot_product_attention(q, K, V, attn_mask=mask))
            for i, p in enumerate(pasts):
                ki, vi = k[i : i + 1], v[i : i + 1]
                if p is not None and lens[i]:
                    ki = torch.cat((p[li][0], ki), dim=2)
                    vi = torch.cat((p[li][1], vi), dim=2)
                new[i].append((ki, vi))
        return self.head(self.norm(h)).squeeze(-1).squeeze(-1), new

    def model_config(self) -> dict:
        """Reference-style ``model_config`` (plus our input_dim and bias flags)."""
        return {"type": "sequence_transformer", **self.cfg}


# ----------------------------------------------------------------------------- features

# Per-step input features. "hidden" is the paper's scorer; "conf_mean"/"conf_min" are the
# thought's mean and minimum sampled-token log-probability (standardised with the training
# split's mean/std, stored in the checkpoint as ``conf_norm``). The order here is the
# order of the columns appended after the hidden state.
CONF_FEATURES = ("conf_mean", "conf_min")
FEATURE_SETS: dict[str, tuple[str, ...]] = {
    "hidden": ("hidden",),
    "hidden+conf": ("hidden", *CONF_FEATURES),
}


def _tensor(a) -> Tensor:
    if isinstance(a, Tensor):
        return a
    a = np.asarray(a)
    if not a.flags.writeable:  # e.g. states decoded with np.frombuffer
        a = a.copy()
    return torch.from_numpy(a)


def resolve_features(spec: str | Sequence[str]) -> tuple[str, ...]:
    """'hidden' | 'hidden+conf' | a list such as ['hidden', 'conf_mean', 'conf_min'] -> canonical tuple."""
    if isinstance(spec, str):
        if spec not in FEATURE_SETS:
            raise ValueError(f"unknown feature set {spec!r}: choose one of {sorted(FEATURE_SETS)}")
        return FEATURE_SETS[spec]
    feats = tuple(str(f) for f in spec)
    if feats not in FEATURE_SETS.values():
        raise ValueError(
            f"unsupported features {list(feats)}: choose one of {list(FEATURE_SETS.values())}"
        )
    return feats


def feature_size(features: Sequence[str], hidden_size: int) -> int:
    """Width of one step's feature vector."""
    return hidden_size + sum(1 for f in features if f != "hidden")


def step_features(
    hidden,
    conf_mean=None,
    conf_min=None,
    *,
    features: Sequence[str],
    conf_norm: dict | None = None,
) -> Tensor:
    """Build the scorer input [..., F] (float32) from per-step hidden states [..., d] and confidences [...].

    The single definition of a scorer's input, used by training and by the search runtime.
    """
    h = _tensor(hidden).float()
    extra = [f for f in features if f != "hidden"]
    if not extra:
        return h
    vals = {"conf_mean": conf_mean, "conf_min": conf_min}
    cols = []
    for i, name in enumerate(extra):
        v = vals[name]
        if v is None:
            raise ValueError(
                f"this scorer was trained on features {list(features)}: pass {name} "
                "(per-thought token log-probabilities) with the hidden states"
            )
        v = _tensor(v).float()
        if v.shape != h.shape[:-1]:
            raise ValueError(
                f"{name} has shape {tuple(v.shape)}, expected {tuple(h.shape[:-1])} (one value per step)"
            )
        v = torch.nan_to_num(v, nan=0.0, neginf=-100.0).clamp(min=-100.0)
        if conf_norm is not None:
            v = (v - float(conf_norm["mean"][i])) / float(conf_norm["std"][i])
        cols.append(v.unsqueeze(-1))
    return torch.cat([h, *cols], dim=-1)
