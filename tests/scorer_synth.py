"""Test helper: fabricate a harvest directory (gambit_scorer.harvest_io format) with synthetic data.

Synthetic, not a model's: labels are learnable by construction.
- Question q has a difficulty z_q; its traces are correct with probability sigmoid(-1.5 z_q).
  Every hidden state carries the question's embedding, which includes z_q along a fixed
  direction: a probe can tell hard from easy questions (pooled AUROC), which does not
  help to rank traces of one question (within-question AUROC).
- A wrong trace makes its error at a random step e. From e on its hidden states shift by
  ``hidden_signal`` along a fixed direction (the model "registers" the error, weakly);
  at step e the thought's token confidence drops (``conf_signal``: a low-probability token).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from gambit_scorer.harvest_io import HarvestTrace, traces_to_table


def make_traces(
    *,
    n_questions: int = 40,
    traces_per_question: int = 8,
    hidden_size: int = 16,
    min_steps: int = 3,
    max_steps: int = 10,
    hidden_signal: float = 0.6,
    conf_signal: float = 1.0,
    difficulty_signal: float = 1.0,
    noise: float = 1.0,
    only_class: bool | None = None,
    seed: int = 0,
    qid_prefix: str = "q",
) -> list[HarvestTrace]:
    rng = np.random.default_rng(seed)
    d = hidden_size
    u_diff, v_err = rng.standard_normal((2, d))
    u_diff /= np.linalg.norm(u_diff)
    v_err /= np.linalg.norm(v_err)
    out = []
    for qi in range(n_questions):
        z = rng.standard_normal()
        p = 1 / (1 + np.exp(1.5 * z))
        q_emb = rng.standard_normal(d) * 0.5 + difficulty_signal * z * u_diff
        for ti in range(traces_per_question):
            correct = bool(rng.random() < p) if only_class is None else only_class
            n = int(rng.integers(min_steps, max_steps + 1))
            err = n + 1 if correct else int(rng.integers(1, n + 1))
            steps = np.arange(1, n + 1)
            after = (steps >= err)[:, None]
            h = q_emb + noise * rng.standard_normal((n, d)) + hidden_signal * after * v_err
            cmean = rng.normal(-0.4, 0.15, n) - conf_signal * 0.5 * (steps == err)
            cmin = rng.normal(-2.5, 0.8, n) - conf_signal * 3.0 * (steps == err)
            n_tok = int(n * 12 + 5)
            bpos = [int(x) for x in (np.arange(1, n + 1) * 12)]
            answer = str(qi) if correct else str(qi + 1 + int(rng.integers(0, 9)))
            out.append(
                HarvestTrace(
                    question_id=f"{qid_prefix}{qi:04d}",
                    question=f"synthetic question {qi}",
                    gold=str(qi),
                    trace_index=ti,
                    token_ids=[int(x) for x in rng.integers(3, 100, n_tok)],
                    text="".join(f"Step {k}: ...\n\n" for k in range(1, n + 1))
                    + f"Answer: \\boxed{{{answer}}}",
                    answer=answer,
                    correct=correct,
                    boundary_positions=bpos,
                    hidden_states=h.astype(np.float16),
                    conf_mean=cmean.astype(np.float32),
                    conf_min=cmin.astype(np.float32),
                    n_tokens=n_tok,
                )
            )
    return out


def write_harvest(
    path: str | Path,
    traces: list[HarvestTrace],
    *,
    hidden_size: int,
    n_shards: int = 2,
    model: str = "synthetic/policy",
    subdir: str = "data",
) -> Path:
    """Write ``traces`` as ``<path>/<subdir>/shard-*.parquet`` + ``manifest.json`` (as gambit-harvest does)."""
    path = Path(path)
    (path / subdir).mkdir(parents=True, exist_ok=True)
    for i in range(n_shards):
        part = traces[i::n_shards]
        if part:
            pq.write_table(
                traces_to_table(part), path / subdir / f"shard-{i:05d}.parquet", row_group_size=64
            )
    manifest = {
        "model": model,
        "model_hash": "sha256:synthetic",
        "hidden_size": hidden_size,
        "boundary_token_ids": [5, 17],
        "sampling": {"temperature": 0.7, "top_p": 0.95, "n": 8},
        "seed": 0,
        "counts": {"questions": len({t.question_id for t in traces}), "traces": len(traces)},
    }
    (path / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return path


def make_harvest(path: str | Path, *, hidden_size: int = 16, n_shards: int = 2, **kw) -> Path:
    """Fabricate a harvest directory at ``path``; ``kw`` go to :func:`make_traces`."""
    return write_harvest(
        path, make_traces(hidden_size=hidden_size, **kw), hidden_size=hidden_size, n_shards=n_shards
    )
