"""gambit-train: train a thought scorer (STEP MLP or SeqScorer) on a harvest.

    gambit-train data.harvest=harvests/toy                          # STEP MLP on hidden states
    gambit-train data.harvest=harvests/toy scorer=seq data.features=hidden+conf
    gambit-train data.harvest=harvests/toy trainer=ddp              # or trainer.strategy=ddp trainer.devices=2
    gambit-train data.harvest=harvests/toy logger=wandb             # + wandb (offline unless WANDB_MODE=online)
    gambit-train --cfg job                                          # print the composed config

Configs live in ``gambit_scorer/conf`` (groups scorer, data, trainer, logger). Each run
writes ``runs/train/<date_time>/``: ``ckpt.pt`` (see ``checkpoint.py``), ``metrics.json``
(best epoch's validation metrics incl. AUROC by step, per-epoch history, data summary),
``config.yaml`` and ``csv/metrics.csv``.

From Python: ``train(compose(["data.harvest=...", "scorer=seq"]))`` returns a dict. (For DDP
from Python use ``trainer.strategy=ddp_spawn``; plain ``ddp`` re-launches the command line,
which is what the CLI wants.) Heavy imports happen inside functions so ``--help`` is fast.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def compose(overrides: Sequence[str] = ()) -> Any:
    """The composed config (as ``gambit-train`` would see it) for ``key=value`` overrides."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_module

    with initialize_config_module(config_module="gambit_scorer.conf", version_base="1.3"):
        return hydra_compose(config_name="train", overrides=list(overrides))


def _register_now() -> None:
    from omegaconf import OmegaConf

    if not OmegaConf.has_resolver(
        "now"
    ):  # Hydra registers it; direct train(cfg) callers may not have
        OmegaConf.register_new_resolver(
            "now", lambda fmt: _dt.datetime.now().strftime(fmt), use_cache=True
        )


def check_config(cfg) -> None:
    """Fail early, naming the fix."""
    from omegaconf import OmegaConf

    from gambit_scorer.kinds import get_kind
    from gambit_scorer.models import FEATURE_SETS, resolve_features

    kind = get_kind(OmegaConf.select(cfg, "scorer.name"))  # names the known kinds
    if OmegaConf.is_missing(cfg.data, "harvest"):
        raise ValueError("no harvest given: pass data.harvest=<dir written by gambit-harvest>")
    try:
        resolve_features(
            OmegaConf.to_object(cfg.data.features)
            if OmegaConf.is_config(cfg.data.features)
            else cfg.data.features
        )
    except ValueError as e:
        raise ValueError(f"{e} (data.features={'|'.join(FEATURE_SETS)})") from None
    kind.resolve_loss_position(OmegaConf.select(cfg, "scorer.loss_position"))
    from gambit_scorer.harvest_index import LABEL_KINDS

    labels = OmegaConf.select(cfg, "data.labels", default="outcome")
    if labels not in LABEL_KINDS:
        raise ValueError(f"data.labels={labels!r}: choose one of {'|'.join(LABEL_KINDS)}")


def _run_dir(cfg) -> Path:
    """Hydra's output dir when run by Hydra (same in every DDP process), else cfg.run_dir."""
    try:
        from hydra.core.hydra_config import HydraConfig

        if HydraConfig.initialized():
            return Path(HydraConfig.get().runtime.output_dir)
    except ImportError:  # pragma: no cover
        pass
    return Path(str(cfg.run_dir))


def _loggers(cfg, run_dir: Path) -> list:
    from lightning.pytorch.loggers import CSVLogger

    lcfg = cfg.get("logger") or {}
    csv = lcfg.get("csv") or {}
    loggers = [CSVLogger(save_dir=str(run_dir), name="", version="csv", **csv)]
    wb = lcfg.get("wandb")
    if wb is not None:
        from lightning.pytorch.loggers import WandbLogger

        mode = str(wb.get("mode") or os.environ.get("WANDB_MODE") or "offline")
        if mode == "dryrun":
            mode = "offline"
        loggers.append(
            WandbLogger(
                project=wb.get("project") or "gambit-scorer",
                name=wb.get("name") or run_dir.name,
                save_dir=str(run_dir),
                offline=mode == "offline",
                mode=mode,
                tags=list(wb.get("tags") or []),
            )
        )
    return loggers


def train(cfg) -> dict:
    """Train and export a scorer; returns {'run_dir', 'ckpt_path', 'best_epoch', 'metrics', 'data', ...}."""
    import lightning as L
    import torch
    from lightning.pytorch.callbacks import EarlyStopping
    from omegaconf import DictConfig, OmegaConf

    from gambit_scorer.checkpoint import save_checkpoint
    from gambit_scorer.data import HarvestDataModule
    from gambit_scorer.kinds import get_kind
    from gambit_scorer.lit import ScorerModule

    _register_now()
    if not isinstance(cfg, DictConfig):
        cfg = OmegaConf.create(cfg)
    check_config(cfg)
    kind = get_kind(cfg.scorer.name)
    run_dir = _run_dir(cfg)
    if cfg.get("threads"):
        torch.set_num_threads(int(cfg.threads))
    L.seed_everything(int(cfg.seed), workers=True, verbose=False)

    d = cfg.data
    harvest = OmegaConf.to_object(d.harvest) if OmegaConf.is_config(d.harvest) else d.harvest
    features = OmegaConf.to_object(d.features) if OmegaConf.is_config(d.features) else d.features
    dm = HarvestDataModule(
        harvest=harvest,
        kind=kind,
        features=features,
        batch_size=d.get("batch_size") or cfg.scorer.batch_size,
        eval_batch_size=d.get("eval_batch_size"),
        val_fraction=d.val_fraction,
        seed=cfg.seed,
        num_workers=d.num_workers,
        streaming=d.streaming,
        max_in_memory_gb=d.max_in_memory_gb,
        shuffle_buffer=d.shuffle_buffer,
        read_batch_size=d.read_batch_size,
        max_len=int(cfg.scorer.model.get("max_len", 4096)),
        labels=d.get("labels") or "outcome",
    )
    dm.setup("fit")
    model = kind.build(dm.input_size, **OmegaConf.to_container(cfg.scorer.model, resolve=True))
    loss_position = kind.resolve_loss_position(cfg.scorer.get("loss_position"))
    if dm.labels != "outcome" and loss_position is not None:
        loss_position = "every"  # process labels: the Seq loss is at every labelled position
    module = ScorerModule(
        model,
        kind,
        loss_position=loss_position or "last",
        pos_weight=dm.pos_weight,
        optim=OmegaConf.to_container(cfg.scorer.optim, resolve=True),
        selection=OmegaConf.to_container(cfg.selection, resolve=True),
    )
    es = cfg.get("early_stopping") or {}
    callbacks = [
        EarlyStopping(
            monitor="val/selection",
            mode="max",
            patience=int(es.get("patience", 5)),
            min_delta=float(es.get("min_delta", 0.0)),
            check_finite=True,
        )
    ]
    tkw = OmegaConf.to_container(cfg.trainer, resolve=True)
    tkw.setdefault("gradient_clip_val", cfg.scorer.get("gradient_clip_val"))
    trainer = L.Trainer(
        **tkw,
        logger=_loggers(cfg, run_dir),
        callbacks=callbacks,
        enable_checkpointing=False,
        use_distributed_sampler=False,  # the DataModule shards training data itself
        default_root_dir=str(run_dir),
    )
    trainer.fit(module, datamodule=dm)

    best_state = module.best_state or {k: v.detach().cpu() for k, v in model.state_dict().items()}
    model.load_state_dict(best_state)
    best = module.best_metrics or {}
    scalars = {
        k: v for k, v in best.items() if isinstance(v, (int, float)) and not isinstance(v, bool)
    }
    result = {
        "run_dir": str(run_dir),
        "ckpt_path": str(run_dir / cfg.export.filename),
        "kind": kind.name,
        "features": list(dm.features),
        "labels": dm.labels,
        "loss_position": loss_position,
        "best_epoch": module.best_epoch,
        "epochs": trainer.current_epoch,
        "world_size": trainer.world_size,
        "metrics": scalars,
        "by_step": best.get("by_step", {}),
        "data": dm.summary(),
    }
    if trainer.is_global_zero:
        run_dir.mkdir(parents=True, exist_ok=True)
        m = dm.manifest
        versions = {"lightning": L.__version__}
        save_checkpoint(
            result["ckpt_path"],
            model.cpu(),
            features=dm.features,
            hidden_size=dm.hidden_size,
            conf_norm=dm.conf_norm if len(dm.features) > 1 else None,
            policy_model=m.get("model"),
            policy_model_hash=m.get("model_hash"),
            boundary_token_ids=m.get("boundary_token_ids"),
            loss_position=loss_position,
            metrics={**scalars, "by_step": result["by_step"], "best_epoch": module.best_epoch},
            train_config=OmegaConf.to_yaml(cfg, resolve=True),
            versions=versions,
            extra={
                "harvest": result["data"]["harvest"],
                "harvest_model_hashes": [h.get("model_hash") for h in dm.index.manifests],
                "sampling": m.get("sampling"),
                "labels": dm.labels,
            },
        )
        (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
        (run_dir / "metrics.json").write_text(
            json.dumps(
                {**result, "history": module.history, "torch": torch.__version__},
                indent=2,
                default=str,
            )
        )
        for lg in (
            trainer.loggers
        ):  # close the wandb run so a later train() in this process starts its own
            if type(lg).__name__ == "WandbLogger":
                lg.experiment.finish()
    return result


def _exit_with_error(e: Exception) -> None:
    """A user error (bad config, missing or unusable harvest): one line on stderr, status 2."""
    import re
    import sys

    msg = re.sub(r"\s*[\r\n]+\s*", " ", str(e)).strip()
    print(f"gambit-train: error: {msg}", file=sys.stderr)
    sys.exit(2)


def _hydra_task(cfg) -> None:
    from gambit_scorer.harvest_io import HarvestError

    try:
        check_config(cfg)  # its ValueErrors name the fix; no traceback for them
    except ValueError as e:
        _exit_with_error(e)
    try:
        result = train(cfg)
    except HarvestError as e:
        _exit_with_error(e)
    from lightning.pytorch.utilities import rank_zero_only

    if rank_zero_only.rank == 0:
        m = result["metrics"]
        keys = (
            "selection",
            "trace_auroc_wq",
            "trace_auroc",
            "step_auroc",
            "trace_f1",
            "trace_brier",
        )
        print(
            json.dumps(
                {
                    "ckpt": result["ckpt_path"],
                    "best_epoch": result["best_epoch"],
                    **{k: round(m[k], 4) for k in keys if k in m},
                },
                indent=2,
            )
        )


def main() -> None:
    """Console entry point (``gambit-train``)."""
    import hydra

    hydra.main(version_base="1.3", config_path="conf", config_name="train")(_hydra_task)()


if __name__ == "__main__":
    main()
