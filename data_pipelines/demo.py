"""gambit-demo: sample and grade questions through vLLM with the shipped toy policy.

The quick start's main job until ``gambit-solve`` lands: it loads questions (toy test
split by default), samples ``--n`` traces per question on vLLM, grades each with
math-verify and prints per-trace accuracy, pass@n and majority@n.

    gambit-demo                                   # 20 toy test questions x 8 samples
    gambit-demo --model Qwen/Qwen3-4B --dataset ../shared/benchmarks/aime_2025.jsonl --n 4
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from pathlib import Path

DEFAULT_MODEL = str(Path(__file__).resolve().parents[1] / "checkpoints" / "toy-policy")


@dataclass
class DemoConfig:
    """What to sample and how."""

    model: str = DEFAULT_MODEL
    """Model path or Hugging Face name (must be available offline)."""
    dataset: str = "toy:test:20"
    """Questions: JSONL path, local HF dataset, or toy:<split>[:count]."""
    n: int = 8
    """Samples per question."""
    temperature: float = 1.0
    """Sampling temperature."""
    top_p: float = 1.0
    """Nucleus sampling."""
    max_tokens: int = 400
    """Generation cap per trace."""
    seed: int = 0
    """Sampling seed."""
    kv_cache_gib: int = 1
    """KV-cache size in GiB."""


def run(cfg: DemoConfig) -> dict:
    """Sample, grade and summarise; returns the summary numbers."""
    import os

    if not os.path.exists(cfg.model) and cfg.model.startswith((".", "/")):
        raise SystemExit(f"gambit-demo: model path {cfg.model} does not exist")

    from rich.console import Console
    from rich.table import Table
    from transformers import AutoTokenizer
    from vllm import LLM, SamplingParams, TokensPrompt

    from data_pipelines.prompts import build_prompt_ids
    from data_pipelines.questions import load_questions
    from gambit_search.grading import VoteBins, grade

    questions = load_questions(cfg.dataset)
    tok = AutoTokenizer.from_pretrained(cfg.model)
    # An explicit KV size: vLLM-CPU otherwise reserves 92% of the NUMA node's memory and
    # refuses to start when anything else is running.
    from gambit_search._vllm_internals import llm_workaround_kwargs

    llm = LLM(model=cfg.model, enforce_eager=True, seed=cfg.seed, enable_prefix_caching=True,
              **llm_workaround_kwargs(),  # seeded requests on vLLM-CPU: no chunked prefill
              max_model_len=min(4096, getattr(tok, "model_max_length", 4096) or 4096),
              kv_cache_memory_bytes=cfg.kv_cache_gib << 30)
    sp = SamplingParams(n=cfg.n, temperature=cfg.temperature, top_p=cfg.top_p, max_tokens=cfg.max_tokens, seed=cfg.seed)
    t0 = time.time()
    outs = llm.generate([TokensPrompt(prompt_token_ids=build_prompt_ids(q.question, tok)) for q in questions], sp)
    wall = time.time() - t0
    table = Table(title=f"{len(questions)} questions x {cfg.n} samples")
    for col in ("question", "gold", "majority", "correct"):
        table.add_column(col)
    acc = pas = maj = tokens = 0
    for q, o in zip(questions, outs, strict=True):
        graded = [grade(q.answer, c.text) for c in o.outputs]
        tokens += sum(len(c.token_ids) for c in o.outputs)
        right = sum(ok for _, ok in graded)
        bins = VoteBins([a for a, _ in graded if a is not None])
        winner = bins.winner()
        won = winner is not None and grade(q.answer, f"\\boxed{{{winner}}}")[1]
        acc += right / cfg.n
        pas += right > 0
        maj += won
        table.add_row(q.question[:60], q.answer, str(winner), f"{right}/{cfg.n}")
    n = len(questions)
    summary = {"per_trace_accuracy": acc / n, f"pass@{cfg.n}": pas / n, f"majority@{cfg.n}": maj / n,
               "tokens_per_s": tokens / wall, "questions": n}
    console = Console()
    console.print(table)
    console.print(summary)
    return summary


def main(argv: list[str] | None = None) -> None:
    from data_pipelines.cli import add_dataclass_args

    p = argparse.ArgumentParser(prog="gambit-demo", description=__doc__.split("\n\n")[0])
    add_dataclass_args(p, DemoConfig)
    run(DemoConfig(**vars(p.parse_args(argv))))


if __name__ == "__main__":
    main()
