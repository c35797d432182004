"""LightningModule wrapping a scorer network (``models.py``) for training.

Loss (the kind's, ``scorer_kind.ScorerKind.loss``): BCE with logits and ``pos_weight`` =
negatives / positives.
- MLP: on every step sample.
- Seq, ``loss_position='last'`` (the reference): at each trace's last valid position.
- Seq, ``loss_position='every'``: at every valid position (a prefix is labelled with its
  trace's outcome), averaged per trace, then over traces.

Validation collects (trace, question, step, probability, label) for every step/position and
computes ``metrics.evaluate`` once per epoch; the best epoch by ``val/selection`` is kept
(weights and metrics) for export. Every DDP rank sees the whole validation split, so ranks
agree on metrics, early stopping and the best state.
"""

from __future__ import annotations

import math

import lightning as L
import numpy as np
import torch
from torch import nn

from gambit_scorer.kinds import get_kind
from gambit_scorer.metrics import evaluate, scalar_metrics
from gambit_scorer.scorer_kind import LOSS_POSITIONS, ScorerKind


class ScorerModule(L.LightningModule):
    def __init__(
        self,
        model: nn.Module,
        kind: str | ScorerKind,
        *,
        loss_position: str = "last",
        pos_weight: float = 1.0,
        optim: dict | None = None,
        selection: dict | None = None,
    ):
        super().__init__()
        self.scorer_kind = get_kind(kind)
        if loss_position not in LOSS_POSITIONS:
            raise ValueError(f"loss_position {loss_position!r}: choose one of {LOSS_POSITIONS}")
        self.model, self.kind, self.loss_position = model, self.scorer_kind.name, loss_position
        self.register_buffer("pos_weight", torch.tensor(float(pos_weight)), persistent=False)
        self.optim = dict(optim or {"name": "adam", "lr": 1e-4, "weight_decay": 1e-5})
        self.selection = dict(selection or {})
        self._val: list[tuple] = []
        self.best_score, self.best_epoch = -math.inf, -1
        self.best_state: dict | None = None
        self.best_metrics: dict | None = None
        self.history: list[dict] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)

    def loss(self, batch: dict, logits: torch.Tensor) -> torch.Tensor:
        return self.scorer_kind.loss(logits, batch, self.pos_weight, self.loss_position)

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        loss = self.loss(batch, self(batch["x"]))
        self.log(
            "train/loss",
            loss,
            on_step=True,
            on_epoch=True,
            prog_bar=True,
            batch_size=len(batch["y"]),
        )
        return loss

    def on_train_epoch_start(self) -> None:
        dm = getattr(self.trainer, "datamodule", None)
        if dm is not None and hasattr(dm, "set_epoch"):
            dm.set_epoch(self.current_epoch)

    def on_validation_epoch_start(self) -> None:
        self._val = []

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        logits = self(batch["x"])
        loss = self.loss(batch, logits)
        rec = self.scorer_kind.val_records(batch, torch.sigmoid(logits.float()))
        self._val.append(
            tuple(t.detach().cpu().numpy() for t in rec)
            + (float(loss) * len(batch["y"]), len(batch["y"]))
        )

    def on_validation_epoch_end(self) -> None:
        if self.trainer.sanity_checking or not self._val:
            self._val = []
            return
        cols = [np.concatenate([r[i] for r in self._val]) for i in range(5)]
        val_loss = sum(r[5] for r in self._val) / max(1, sum(r[6] for r in self._val))
        self._val = []
        m = evaluate(
            *cols,
            kind=self.scorer_kind,
            selection_auroc=self.selection.get("auroc", "trace_auroc_wq"),
            min_wq_questions=int(self.selection.get("min_wq_questions", 3)),
            weights=(
                float(self.selection.get("auroc_weight", 0.75)),
                float(self.selection.get("f1_weight", 0.25)),
            ),
        )
        m["loss"] = val_loss
        scalars = scalar_metrics(m)
        sync = self.trainer.world_size > 1
        self.log_dict({f"val/{k}": v for k, v in scalars.items()}, sync_dist=sync)
        self.log("val/sel", m["selection"], prog_bar=True, sync_dist=sync)
        self.history.append({"epoch": self.current_epoch, **scalars})
        if m["selection"] > self.best_score:
            self.best_score, self.best_epoch = m["selection"], self.current_epoch
            self.best_metrics = m
            self.best_state = {
                k: v.detach().cpu().clone() for k, v in self.model.state_dict().items()
            }

    def configure_optimizers(self):
        o = self.optim
        name = str(o.get("name", "adam")).lower()
        kw = {"lr": float(o.get("lr", 1e-4)), "weight_decay": float(o.get("weight_decay", 0.0))}
        if name == "adam":
            opt = torch.optim.Adam(self.parameters(), **kw)
        elif name == "adamw":
            opt = torch.optim.AdamW(self.parameters(), **kw)
        else:
            raise ValueError(f"unknown optimizer {name!r}: choose adam or adamw")
        schedule = str(o.get("schedule", "constant"))
        if schedule == "constant":
            return opt
        if schedule != "cosine":
            raise ValueError(f"unknown schedule {schedule!r}: choose constant or cosine")
        total = self.trainer.estimated_stepping_batches
        total = int(total) if math.isfinite(total) else 0
        warmup = (
            int(float(o.get("warmup_ratio", 0.05)) * total)
            if total
            else int(o.get("warmup_steps", 100))
        )
        floor = float(o.get("min_lr_ratio", 0.0))

        def lam(step: int) -> float:
            if step < warmup:
                return (step + 1) / max(1, warmup)
            if not total:
                return 1.0
            t = min(1.0, (step - warmup) / max(1, total - warmup))
            return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * t))

        sched = torch.optim.lr_scheduler.LambdaLR(opt, lam)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}
