"""Train the toy reasoning policy from scratch with Lightning; save it in Hugging Face format.

The model is a small ``LlamaForCausalLM`` (head size 32, which vLLM's CPU attention
supports) trained on traces drawn from ``data_pipelines.toy.task`` (loss on the
completion only). The schedule is set by step count, not wall clock, so a run on 2 CPU
cores and a run on a GPU follow the same recipe.

    python -m data_pipelines.toy.train_policy --out checkpoints/toy-policy        # the shipped recipe
    python -m data_pipelines.toy.train_policy --out /tmp/p --steps 50             # smoke run

Writes ``config.json``, ``model.safetensors``, ``generation_config.json``, the tokenizer
files and ``train_meta.json`` (the exact config, seed, data counts, final losses).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

from data_pipelines.toy.task import (
    ToyTaskConfig,
    draw_question,
    reference_trace,
    sample_trace,
    split_of,
)


@dataclass
class PolicyTrainConfig:
    """Everything that decides the trained toy policy."""

    out: str = "checkpoints/toy-policy"
    """Output directory (Hugging Face model layout)."""
    seed: int = 0
    """Seed for data, initialisation and dropout-free training order."""
    n_layers: int = 4
    """Decoder layers."""
    hidden: int = 128
    """Model width."""
    n_heads: int = 4
    """Attention heads (head size = hidden / n_heads; vLLM CPU needs 32, 64, ...)."""
    ffn: int = 384
    """SwiGLU intermediate width."""
    steps: int = 2000
    """Optimizer steps (the schedule is by step count so runs reproduce on any hardware)."""
    batch_size: int = 32
    """Traces per step."""
    lr: float = 1.5e-3
    """Peak AdamW learning rate (cosine decay to 10%). With weight decay 0.1, 1.5e-3 and 200
    warmup steps learned in 4 of 5 GPU seeds and in the one run on 2 CPU cores; 3e-3 and 100
    warmup steps in 7 of 14 GPU runs and 0 of 2 CPU runs (docs/results/toy_policy/sweeps/README.md)."""
    warmup: int = 200
    """Linear warmup steps."""
    weight_decay: float = 0.1
    """AdamW weight decay. 0.1 learned the arithmetic in 6 of 8 GPU seeds, 0.01 in 2 of 7
    (docs/results/toy_policy/sweeps/README.md); stalled runs sit on a 0.03-0.06 val-loss plateau."""
    clean_frac: float = 0.0
    """Share of training traces drawn slip-free (the rest follow the task's error model)."""
    n_val: int = 512
    """Validation traces (val split) for the loss curve."""
    precision: str = "32-true"
    """Lightning precision; use bf16-mixed on a GPU."""
    accelerator: str = "auto"
    """Lightning accelerator."""
    workers: int = 2
    """Data-loader worker processes (the data does not depend on it)."""
    task: ToyTaskConfig = field(default_factory=ToyTaskConfig)
    """The toy world's question and slip distribution."""


class TraceStream:
    """An endless, seeded stream of tokenized (prompt, trace) training examples."""

    def __init__(self, cfg: PolicyTrainConfig, tokenizer, split: str = "train", key: str = "0"):
        self.cfg, self.tok, self.split = cfg, tokenizer, split
        self.rng = random.Random(f"policy-{split}-{cfg.seed}-{key}")

    def example(self) -> tuple[list[int], list[int]]:
        from gambit_core.prompts import build_prompt

        cfg = self.cfg
        while True:
            q = draw_question(self.rng, cfg.task)
            if split_of(q, cfg.task) == self.split:
                break
        trace = reference_trace(q) if self.rng.random() < cfg.clean_frac else sample_trace(q, self.rng, cfg.task).text
        prompt = [self.tok.bos_token_id] + self.tok.encode(build_prompt(q.text, self.tok), add_special_tokens=False)
        completion = self.tok.encode(trace, add_special_tokens=False) + [self.tok.eos_token_id]
        return prompt, completion

    def batch(self, n: int):
        import torch

        exs = [self.example() for _ in range(n)]
        L = max(len(p) + len(c) for p, c in exs)
        ids = torch.full((n, L), self.tok.pad_token_id, dtype=torch.long)
        labels = torch.full((n, L), -100, dtype=torch.long)
        mask = torch.zeros((n, L), dtype=torch.long)
        for i, (p, c) in enumerate(exs):
            seq = p + c
            ids[i, : len(seq)] = torch.tensor(seq)
            labels[i, len(p) : len(seq)] = torch.tensor(c)
            mask[i, : len(seq)] = 1
        return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def model_config(cfg: PolicyTrainConfig, tokenizer):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=len(tokenizer) if len(tokenizer) > 128 else 128,
        hidden_size=cfg.hidden,
        intermediate_size=cfg.ffn,
        num_hidden_layers=cfg.n_layers,
        num_attention_heads=cfg.n_heads,
        num_key_value_heads=cfg.n_heads,
        max_position_embeddings=512,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        torch_dtype="float32",
    )


def train(cfg: PolicyTrainConfig) -> dict:
    """Train and save the policy; returns the metadata written to ``train_meta.json``."""
    import lightning as L
    import torch
    from transformers import LlamaForCausalLM

    from data_pipelines.toy.tokenizer import build_tokenizer

    L.seed_everything(cfg.seed, workers=True)
    tok = build_tokenizer()
    model = LlamaForCausalLM(model_config(cfg, tok))

    class Batches(torch.utils.data.Dataset):
        """Batch k is drawn from its own seeded stream: the data is the same for any worker count."""

        def __init__(self, split: str, n_batches: int):
            self.split, self.n = split, n_batches

        def __len__(self) -> int:
            return self.n

        def __getitem__(self, k: int):
            return TraceStream(cfg, tok, self.split, str(k)).batch(cfg.batch_size)

    class Module(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.model = model
            self.t0 = time.time()
            self.tokens = 0

        def training_step(self, batch, _):
            out = self.model(**batch)
            self.tokens += int(batch["attention_mask"].sum())
            self.log("train/loss", out.loss, prog_bar=True)
            self.log("train/tok_per_s", self.tokens / max(time.time() - self.t0, 1e-6), prog_bar=True)
            return out.loss

        def validation_step(self, batch, _):
            self.log("val/loss", self.model(**batch).loss, prog_bar=True)

        def on_validation_epoch_end(self):
            # one plain line per validation, readable in a log file (the bar is off without a TTY);
            # a learned policy ends near 0.02, a stalled one on a plateau above 0.03
            m = self.trainer.callback_metrics
            print(f"step {self.global_step}/{cfg.steps}  train/loss {float(m.get('train/loss', float('nan'))):.4f}  "
                  f"val/loss {float(m['val/loss']):.4f}  {self.tokens / max(time.time() - self.t0, 1e-6):,.0f} tok/s  "
                  f"{time.time() - self.t0:,.0f} s", flush=True)

        def configure_optimizers(self):
            opt = torch.optim.AdamW(self.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.95))

            def lam(step: int) -> float:
                if step < cfg.warmup:
                    return (step + 1) / cfg.warmup
                t = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
                return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(t, 1.0)))

            return {"optimizer": opt, "lr_scheduler": {"scheduler": torch.optim.lr_scheduler.LambdaLR(opt, lam), "interval": "step"}}

    module = Module()
    n_val_batches = max(1, cfg.n_val // cfg.batch_size)
    trainer = L.Trainer(
        max_steps=cfg.steps,
        accelerator=cfg.accelerator,
        devices=1,
        precision=cfg.precision,
        gradient_clip_val=1.0,
        logger=False,
        enable_checkpointing=False,
        val_check_interval=max(1, cfg.steps // 4),
        check_val_every_n_epoch=None,
        num_sanity_val_steps=0,
        enable_model_summary=False,
    )
    t0 = time.time()
    trainer.fit(
        module,
        train_dataloaders=torch.utils.data.DataLoader(Batches("train", cfg.steps), batch_size=None, num_workers=cfg.workers, persistent_workers=cfg.workers > 0),
        val_dataloaders=torch.utils.data.DataLoader(Batches("val", n_val_batches), batch_size=None),
    )
    wall = time.time() - t0
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    model = module.model.to("cpu", dtype=torch.float32)
    model.save_pretrained(str(out), safe_serialization=True)
    tok.save_pretrained(str(out))
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
    meta = {
        "config": dataclasses.asdict(cfg),
        "n_params": sum(p.numel() for p in model.parameters()),
        "train_tokens": module.tokens,
        "wall_seconds": round(wall, 1),
        "device": str(trainer.strategy.root_device),
        "metrics": metrics,
        "torch": torch.__version__,
    }
    (out / "train_meta.json").write_text(json.dumps(meta, indent=2))
    return meta


def _parse(argv: list[str] | None = None) -> PolicyTrainConfig:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    from gambit_core.cli import add_dataclass_args

    add_dataclass_args(p, PolicyTrainConfig, skip=("task",))
    add_dataclass_args(p, ToyTaskConfig, skip=("split_weights",), prefix="task-")
    a = vars(p.parse_args(argv))
    task = ToyTaskConfig(**{f.name: a.pop(f"task_{f.name}") for f in dataclasses.fields(ToyTaskConfig) if f.name != "split_weights"})
    return PolicyTrainConfig(**a, task=task)


def main(argv: list[str] | None = None) -> None:
    meta = train(_parse(argv))
    print(json.dumps({k: meta[k] for k in ("n_params", "train_tokens", "wall_seconds", "metrics")}, indent=2))


if __name__ == "__main__":
    main()
