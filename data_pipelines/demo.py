"""gambit-demo: sample and grade questions through vLLM with the shipped toy policy.

A quick check of the sampling path (the quick start itself is gambit-solve): it loads questions (toy test
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

from gambit_core.errors import InputError
from gambit_core.sampling import SamplingConfig

DEFAULT_MODEL = str(Path(__file__).resolve().parents[1] / "checkpoints" / "toy-policy")


@dataclass(kw_only=True)
class DemoConfig(SamplingConfig):
    """What to sample and how (the sampling fields: :class:`gambit_core.sampling.SamplingConfig`)."""

    model: str = DEFAULT_MODEL
    """Model path or Hugging Face name (must be available offline)."""
    dataset: str = "toy:test:20"
    """Questions: JSONL path, local HF dataset, or toy:<split>[:count]."""
    n: int = 8
    """Samples per question."""
    kv_cache: float = 1.0
    """KV-cache size in GiB."""


def grade_question(gold: str, texts: list[str]) -> tuple[int, str | None, bool]:
    """(traces right, majority answer, whether it is right) for one question's completions.

    Each completion is graded by its last boxed answer (math-verify equivalence); the vote
    pools equivalent answers ("1/2", "0.5") in one bin, as gambit-harvest's summary does
    (``data_pipelines.harvest.majority_correct``)."""
    from data_pipelines.harvest import majority_correct
    from gambit_core.grading import grade

    graded = [grade(gold, t) for t in texts]
    ok = [c for _, c in graded]
    winner, won = majority_correct([a for a, _ in graded], ok)
    return sum(ok), winner, won


def run(cfg: DemoConfig) -> dict:
    """Sample, grade and summarise; returns the summary numbers. Bad input: :class:`~gambit_core.errors.InputError`."""
    import os

    cfg.check_sampling()
    if cfg.kv_cache <= 0:
        raise InputError(f"--kv-cache must be > 0 GiB, got {cfg.kv_cache}")
    if cfg.n < 1:
        raise InputError(f"--n must be >= 1, got {cfg.n}")
    if cfg.model.startswith((".", "/", "~")) and not os.path.exists(os.path.expanduser(cfg.model)):
        raise InputError(f"model path {cfg.model} does not exist")
    from gambit_core.questions import DatasetError, load_questions

    try:  # before the heavy imports: a typo in --dataset fails at once
        questions = load_questions(cfg.dataset)
    except (DatasetError, OSError, ValueError) as e:
        raise InputError(f"cannot read dataset {cfg.dataset!r}: {e}") from None

    from rich.console import Console
    from rich.table import Table
    from transformers import AutoTokenizer
    from vllm import LLM, SamplingParams, TokensPrompt

    from gambit_core.prompts import build_prompt_ids

    tok = AutoTokenizer.from_pretrained(cfg.model)
    # An explicit KV size: vLLM-CPU otherwise reserves 92% of the NUMA node's memory and
    # refuses to start when anything else is running.
    from gambit_search._vllm_internals import llm_workaround_kwargs

    llm = LLM(model=cfg.model, enforce_eager=True, seed=cfg.seed, enable_prefix_caching=True,
              **llm_workaround_kwargs(),  # seeded requests on vLLM-CPU: no chunked prefill
              max_model_len=min(4096, getattr(tok, "model_max_length", 4096) or 4096),
              kv_cache_memory_bytes=int(cfg.kv_cache * (1 << 30)))
    sp = SamplingParams(n=cfg.n, temperature=cfg.temperature, top_p=cfg.top_p,
                        top_k=cfg.top_k,  # 0: off
                        max_tokens=cfg.max_tokens, seed=cfg.seed)
    t0 = time.time()
    outs = llm.generate([TokensPrompt(prompt_token_ids=build_prompt_ids(q.question, tok)) for q in questions], sp)
    wall = time.time() - t0
    table = Table(title=f"{len(questions)} questions x {cfg.n} samples")
    for col in ("question", "gold", "majority", "correct"):
        table.add_column(col)
    acc = pas = maj = tokens = 0
    for q, o in zip(questions, outs, strict=True):
        right, winner, won = grade_question(q.answer, [c.text for c in o.outputs])
        tokens += sum(len(c.token_ids) for c in o.outputs)
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
    from gambit_core.cli import add_dataclass_args, input_errors

    p = argparse.ArgumentParser(prog="gambit-demo", description=__doc__.split("\n\n")[0])
    add_dataclass_args(p, DemoConfig)
    cfg = DemoConfig(**vars(p.parse_args(argv)))
    with input_errors(p.prog):
        run(cfg)


if __name__ == "__main__":
    main()
