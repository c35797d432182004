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


# ---------------------------------------------------------------- gambit-demo


def test_demo_missing_model_path(tmp_path):
    p = _run("data_pipelines.demo", "--model", "./no/such/model", cwd=tmp_path)
    _assert_one_line_error(p, "gambit-demo", "model path ./no/such/model does not exist")


def test_demo_missing_dataset(tmp_path):
    p = _run("data_pipelines.demo", "--dataset", "missing.jsonl", cwd=tmp_path)  # the shipped model
    _assert_one_line_error(p, "gambit-demo", "cannot read dataset", "missing.jsonl")


# ---------------------------------------------------------------- gambit-train (Hydra)


def test_train_missing_harvest_dir(tmp_path):
    missing = tmp_path / "no-harvest"
    p = _run("gambit_scorer.train", f"data.harvest={missing}", cwd=tmp_path)
    _assert_one_line_error(p, "gambit-train", f"harvest directory '{missing}' does not exist",
                           "data.harvest=")


def test_train_no_harvest_given(tmp_path):
    p = _run("gambit_scorer.train", cwd=tmp_path)
    _assert_one_line_error(p, "gambit-train", "no harvest given", "data.harvest=")
