"""The CI entry point (.ci/run): set up, lint, then the README's test command."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_ci_lints_after_setup_and_before_the_tests():
    lines = [ln.strip() for ln in (ROOT / ".ci" / "run").read_text().splitlines()
             if ln.strip() and not ln.lstrip().startswith("#")]
    setup = lines.index("bash scripts/setup.sh")
    lint = lines.index(".venv/bin/ruff check .")
    tests = next(i for i, ln in enumerate(lines) if "-m pytest" in ln)
    assert setup < lint < tests
    assert "set -euo pipefail" in lines  # a lint failure stops CI


def test_committed_python_files_pass_ruff():
    ruff = Path(sys.executable).parent / "ruff"
    if not ruff.exists():
        ruff = shutil.which("ruff")
    if ruff is None:
        pytest.skip("ruff is not installed (pip install -e '.[dev]')")
    files = subprocess.run(["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True,
                           check=False).stdout.split()
    if not files:
        pytest.skip("not a git checkout")
    p = subprocess.run([str(ruff), "check", *files], cwd=ROOT, capture_output=True, text=True)
    assert p.returncode == 0, p.stdout[-3000:]
