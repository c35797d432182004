"""gambit-train end to end on a fabricated harvest: train(cfg), the Hydra CLI, DDP, export."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from scorer_synth import make_harvest

from gambit_scorer.checkpoint import load_scorer
from gambit_scorer.harvest_io import iter_traces
from gambit_scorer.train import compose, train

torch.set_num_threads(1)
FAST = [
    "threads=1",
    "trainer.enable_progress_bar=false",
    "trainer.accelerator=cpu",
    "trainer.log_every_n_steps=1",
]
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def harvest(tmp_path_factory):
    return make_harvest(
        tmp_path_factory.mktemp("h") / "harvest",
        n_questions=40,
        traces_per_question=8,
        hidden_size=16,
        hidden_signal=1.5,
    )


def _cli(args, cwd, timeout=240, env=None):
    e = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "gambit_scorer.train", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=e,
    )


def test_train_mlp_exports_loadable_checkpoint(harvest, tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    run = tmp_path / "run"
    cfg = compose(
        [
            f"data.harvest={harvest}",
            f"run_dir={run}",
            "trainer.max_epochs=2",
            "logger=wandb",
            "scorer.optim.lr=3e-3",
            *FAST,
        ]
    )
    assert cfg.logger.wandb.mode == "offline"
    r = train(cfg)
    assert r["kind"] == "mlp" and r["features"] == ["hidden"] and r["best_epoch"] in (0, 1)
    for k in [
        "selection",
        "trace_auroc_wq",
        "trace_auroc",
        "step_auroc",
        "step_auprc",
        "trace_f1",
        "trace_brier",
    ]:
        assert k in r["metrics"]
    assert r["metrics"]["trace_auroc"] > 0.6 and r["by_step"]  # learnable synthetic labels
    assert r["data"]["n_questions"]["val"] > 0
    s = load_scorer(r["ckpt_path"], expected_hidden_size=16)
    assert s.kind == "mlp" and s.features == ("hidden",)
    assert s.meta["policy_model"] == "synthetic/policy" and s.meta["boundary_token_ids"] == [5, 17]
    assert s.meta["metrics"]["selection"] == pytest.approx(r["metrics"]["selection"])
    assert "lightning" in s.meta["versions"] and "scorer:" in s.meta["train_config"]
    m = json.loads((run / "metrics.json").read_text())
    assert len(m["history"]) == 2 and m["best_epoch"] == r["best_epoch"]
    assert "val/selection" in (run / "csv" / "metrics.csv").read_text()
    assert (run / "config.yaml").is_file()
    assert any(p.name.startswith("offline-run") for p in (run / "wandb").iterdir())


def test_train_seq_confidence_every_position_streaming(harvest, tmp_path):
    cfg = compose(
        [
            f"data.harvest={harvest}",
            f"run_dir={tmp_path / 'run'}",
            "scorer=seq",
            "data.features=hidden+conf",
            "scorer.loss_position=every",
            "scorer.model.d_model=32",
            "scorer.model.dim_feedforward=64",
            "scorer.model.num_layers=2",
            "scorer.batch_size=16",
            "data.streaming=true",
            "data.shuffle_buffer=64",
            "trainer.max_epochs=2",
            *FAST,
        ]
    )
    r = train(cfg)
    assert r["data"]["streaming"] and r["loss_position"] == "every"
    s = load_scorer(r["ckpt_path"], expected_hidden_size=16)
    assert s.kind == "seq" and s.features == ("hidden", "conf_mean", "conf_min") and s.conf_norm
    assert s.meta["loss_position"] == "every"
    t = next(iter_traces(harvest))
    full = s.score_trace(t.hidden_states, t.conf_mean, t.conf_min)
    h = s.init_history()
    for k in range(t.n_boundaries):
        h, score = s.append(h, t.hidden_states[k], t.conf_mean[k], t.conf_min[k])
        assert score == pytest.approx(float(full[k]), abs=1e-5)
    with pytest.raises(ValueError, match="pass conf_mean"):
        s.append(s.init_history(), t.hidden_states[0])


def test_config_errors(harvest, tmp_path):
    cfg = compose([f"data.harvest={harvest}", f"run_dir={tmp_path}"])
    cfg.scorer.name = "lstm"
    with pytest.raises(ValueError, match="scorer=mlp or scorer=seq"):
        train(cfg)
    with pytest.raises(ValueError, match="data.harvest="):
        train(compose([f"run_dir={tmp_path}"]))
    with pytest.raises(ValueError, match="hidden\\+conf"):
        train(compose([f"data.harvest={harvest}", f"run_dir={tmp_path}", "data.features=conf"]))


def test_cli_cfg_job_and_unknown_scorer(tmp_path):
    p = _cli(
        ["--cfg", "job", "scorer=seq", "data.harvest=/some/harvest", "trainer.max_epochs=3"],
        tmp_path,
    )
    assert p.returncode == 0, p.stderr
    assert (
        "name: seq" in p.stdout
        and "max_epochs: 3" in p.stdout
        and "run_dir: runs/train/" in p.stdout
    )
    p = _cli(["scorer=lstm", "data.harvest=/x"], tmp_path)
    assert p.returncode != 0
    assert "Could not find 'scorer/lstm'" in p.stderr and "mlp" in p.stderr and "seq" in p.stderr


def test_cli_ddp_two_cpu_processes(harvest, tmp_path):
    run = tmp_path / "ddp_run"
    p = _cli(
        [
            f"data.harvest={harvest}",
            f"run_dir={run}",
            "trainer.strategy=ddp",
            "trainer.devices=2",
            "trainer.max_epochs=1",
            *FAST,
        ],
        tmp_path,
        env={"PL_DISABLE_FORK": "1"},
    )
    assert p.returncode == 0, p.stderr[-3000:]
    m = json.loads((run / "metrics.json").read_text())
    assert m["world_size"] == 2 and m["metrics"]["n_traces"] > 0
    s = load_scorer(run / "ckpt.pt", expected_hidden_size=16)
    assert np.isfinite(s.score_steps(np.zeros((2, 16)))).all()
    assert '"ckpt"' in p.stdout


def test_config_groups_compose():
    cfg = compose(["scorer=seq", "trainer=ddp", "logger=wandb", "data.harvest=/h"])
    assert (
        cfg.scorer.name == "seq"
        and cfg.scorer.loss_position == "last"
        and cfg.scorer.model.nhead == 4
    )
    assert (
        cfg.trainer.strategy == "ddp" and cfg.trainer.devices == 2 and cfg.trainer.max_epochs == 20
    )
    assert "csv" in cfg.logger and "wandb" in cfg.logger
    mlp = compose(["data.harvest=/h"])
    assert mlp.scorer.name == "mlp" and list(mlp.scorer.model.hidden_sizes) == [512]
    assert (
        mlp.scorer.optim.lr == 1e-4
        and mlp.scorer.batch_size == 128
        and mlp.early_stopping.patience == 5
    )
    assert mlp.selection.auroc == "trace_auroc_wq" and mlp.data.val_fraction == 0.2
