"""Bad input to the command-line tools, run as a user runs them: exit status 2 and one
readable line ``<tool>: error: ...`` on stderr, no traceback. None of these starts vLLM."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(module: str, *args: str, cwd: Path, timeout: float = 240) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", module, *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


def _assert_one_line_error(p: subprocess.CompletedProcess, tool: str, *fragments: str) -> str:
    """Exit status 2 and exactly one non-empty stderr line, naming the tool and the problem."""
    assert p.returncode == 2, (p.returncode, p.stderr[-3000:])
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, p.stderr[-3000:]
    assert "Traceback" not in p.stderr
    line = lines[0]
    assert line.startswith(f"{tool}: error: "), line
    for f in fragments:
        assert f in line, (f, line)
    return line


# ---------------------------------------------------------------- gambit-harvest


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    "case, fragments",
    [
        ("missing_dataset", ["cannot read dataset", "does not exist", "missing.jsonl"]),
        ("malformed_line", ["cannot read dataset", "bad.jsonl:2", "malformed JSON"]),
        ("row_without_answer", ["cannot read dataset", "noanswer.jsonl:2", "missing answer"]),
        ("empty_dataset", ["cannot read dataset", "no questions in", "empty.jsonl"]),
        ("directory_not_a_dataset", ["cannot read dataset", "neither a saved dataset"]),
        ("missing_model_path", ["model path ./no/such/model does not exist"]),
        ("bad_shard", ["--shard 3/2"]),
        ("zero_traces", ["--n must be >= 1, got 0"]),
        ("unknown_engine", ["--engine must be one of fake, vllm, got 'bogus'"]),
    ],
)
def test_harvest_bad_input(tmp_path, case, fragments):
    ok_row = json.dumps({"question": "1+1?", "answer": "2"})
    args = {
        "missing_dataset": ["--engine", "fake", "--dataset", "missing.jsonl"],
        "malformed_line": ["--engine", "fake", "--dataset",
                           str(_write(tmp_path / "bad.jsonl", ok_row + "\n{not json\n"))],
        "row_without_answer": ["--engine", "fake", "--dataset",
                               str(_write(tmp_path / "noanswer.jsonl", ok_row + '\n{"question": "2+2?"}\n'))],
        "empty_dataset": ["--engine", "fake", "--dataset", str(_write(tmp_path / "empty.jsonl", ""))],
        "directory_not_a_dataset": ["--engine", "fake", "--dataset", str(tmp_path)],
        "missing_model_path": ["--model", "./no/such/model"],  # the vLLM engine, never started
        "bad_shard": ["--engine", "fake", "--shard", "3/2"],
        "zero_traces": ["--engine", "fake", "--n", "0"],
        "unknown_engine": ["--engine", "bogus"],
    }[case]
    out = tmp_path / "out"
    p = _run("data_pipelines.harvest", "--out", str(out), *args, cwd=tmp_path)
    _assert_one_line_error(p, "gambit-harvest", *fragments)
    assert p.stdout == ""
    assert not (out / "harvest_config.json").exists()  # bad input leaves nothing to resume


def test_harvest_refuses_a_directory_of_another_config(tmp_path):
    out = tmp_path / "h"
    base = ["--out", str(out), "--engine", "fake", "--dataset", "toy:train:2", "--n", "2", "--max-tokens", "32"]
    p = _run("data_pipelines.harvest", *base, cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]  # the same command line is fine as such
    assert json.loads(p.stdout)["traces"] == 4
    p = _run("data_pipelines.harvest", *base, "--temperature", "0.5", cwd=tmp_path)
    _assert_one_line_error(p, "gambit-harvest", str(out), "another config", "temperature")


def test_harvest_out_is_a_file(tmp_path):
    f = _write(tmp_path / "taken", "x")
    p = _run("data_pipelines.harvest", "--out", str(f), "--engine", "fake", cwd=tmp_path)
    _assert_one_line_error(p, "gambit-harvest", str(f), "not a directory")


# ---------------------------------------------------------------- gambit-train (Hydra)


def test_train_missing_harvest_dir(tmp_path):
    missing = tmp_path / "no-harvest"
    p = _run("gambit_scorer.train", f"data.harvest={missing}", cwd=tmp_path)
    _assert_one_line_error(p, "gambit-train", f"harvest directory '{missing}' does not exist",
                           "data.harvest=")


def test_train_no_harvest_given(tmp_path):
    p = _run("gambit_scorer.train", cwd=tmp_path)
    _assert_one_line_error(p, "gambit-train", "no harvest given", "data.harvest=")


# ---------------------------------------------------------------- gambit-solve


def _solve(*args: str, tmp_path: Path) -> subprocess.CompletedProcess:
    return _run("gambit_search.solve", *args, cwd=tmp_path, timeout=120)


@pytest.mark.parametrize("args, msg", [
    (["--method", "nope", "some question"], "unknown method 'nope'"),
    (["--capacity", "6", "--swap", "4", "q"], "must be >= 2K"),
    (["--warmup", "0", "q"], "warmup w must be > 0"),
    (["--interval", "-1", "q"], "interval D must be > 0"),
    (["   "], "the question is empty"),
    (["--dataset", "/nonexistent/x.jsonl", "--out", "OUT"], "cannot load dataset"),
    (["--dataset", "toy:test:2"], "--dataset needs --out"),
    (["--dataset", "toyz:test:2", "--out", "OUT"], "unknown dataset source 'toyz'"),
    (["--scorer", "/nonexistent.pt", "q"], "does not exist"),
    (["--scorer", "none", "q"], "needs a scorer"),
    (["--model", "/nonexistent/model", "q"], "does not exist"),
    (["--rule", "best", "q"], "--rule must be one of"),
    (["--queue", "-1", "q"], "--queue must be >= 0, got -1"),
    (["--engine", "fake", "--catch-up", "q"], "--catch-up needs the vllm engine"),
    (["--rescore", "/nonexistent/run"], "no results.jsonl"),
    (["--engine", "tpu", "q"], "--engine must be one of fake, vllm"),
    (["--top-p", "0", "q"], "--top-p must be in (0, 1]"),
    (["--method", "bon", "--scorer", "none", "q"], "method 'bon' needs a scorer"),
    (["--method", "step", "--scorer", "none", "q"], "method 'step' needs a scorer"),
    (["--method", "deepconf-low", "--deepconf-top-k", "32", "q"],
     "the engine serves at most 20 top log-probs"),
    (["--method", "deepconf-high", "--deepconf-window", "0", "q"], "deepconf-window"),
    (["--method", "slim-sc", "--slim-threshold", "2", "q"], "slim-threshold"),
    (["--method", "sc,deepconf-low", "--deepconf-warmup", "0", "q"], "deepconf-warmup"),
])
def test_solve_bad_input(tmp_path, args, msg):
    args = [str(tmp_path / "out") if a == "OUT" else a for a in args]
    _assert_one_line_error(_solve(*args, tmp_path=tmp_path), "gambit-solve", msg)


def test_solve_refuses_a_scorer_of_another_model(tmp_path, fake_scorer):
    p = _solve("--scorer", fake_scorer, "Start 3. Ops: +1. Mod 100.", tmp_path=tmp_path)
    _assert_one_line_error(p, "gambit-solve", "hidden size")  # 16-wide vs the toy's 128


def test_solve_refuses_a_scorer_of_other_boundary_tokens(tmp_path):
    import torch

    from gambit_scorer.checkpoint import save_checkpoint
    from gambit_scorer.models import StepMLP

    torch.manual_seed(0)
    path = tmp_path / "ckpt.pt"  # the toy policy's hidden size, another tokenizer's boundary
    save_checkpoint(path, StepMLP(128, [8]), features=["hidden"], hidden_size=128,
                    boundary_token_ids=[7, 99])
    p = _solve("--scorer", str(path), "Start 3. Ops: +1. Mod 100.", tmp_path=tmp_path)
    _assert_one_line_error(p, "gambit-solve", "boundar")


# ---------------------------------------------------------------- gambit-bench


@pytest.mark.parametrize("args, msg", [
    (["--datasets", "/no/such.jsonl"], "cannot load dataset"),
    (["--methods", "sc,nope"], "unknown method 'nope'"),
    (["--set", "sc.swap=2"], "--set sc: unknown parameters ['swap']"),
    (["--config", "/no/such.yaml"], "config file '/no/such.yaml' does not exist"),
])
def test_bench_bad_input(tmp_path, args, msg):
    p = _run("gambit_search.bench", "--out", str(tmp_path / "x"), *args, cwd=tmp_path,
             timeout=120)
    _assert_one_line_error(p, "gambit-bench", msg)
