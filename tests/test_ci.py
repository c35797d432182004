"""The CI entry point (.ci/run): set up, lint, then the README's test command."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _stub_tree(tmp_path: Path, ruff_rc: int = 0, pytest_rc: int = 0) -> tuple[Path, Path]:
    """A copy of .ci/run beside stubs of setup.sh, ruff and python that log their calls."""
    log = tmp_path / "log"
    (tmp_path / ".ci").mkdir()
    shutil.copy(ROOT / ".ci" / "run", tmp_path / ".ci" / "run")
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "setup.sh").write_text(f'echo setup >> "{log}"\n')
    bin_ = tmp_path / ".venv" / "bin"
    bin_.mkdir(parents=True)
    for name, rc in (("ruff", ruff_rc), ("python", pytest_rc)):
        (bin_ / name).write_text(f'#!/bin/sh\necho "{name} $*" >> "{log}"\nexit {rc}\n')
        (bin_ / name).chmod(0o755)
    return tmp_path / ".ci" / "run", log


def _readme_test_command() -> str:
    line = next(ln for ln in (ROOT / "README.md").read_text().splitlines()
                if ln.startswith(".venv/bin/python -m pytest") and "# run the tests" in ln)
    return line.split("#")[0].strip()


def test_ci_sets_up_lints_then_runs_the_readme_test_command(tmp_path):
    run, log = _stub_tree(tmp_path)
    p = subprocess.run(["bash", str(run)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    want = _readme_test_command().replace(".venv/bin/python", "python")
    assert log.read_text().splitlines() == ["setup", "ruff check .", want]


@pytest.mark.parametrize("ruff_rc, pytest_rc, ran", [(1, 0, ["setup", "ruff check ."]),
                                                     (0, 5, None)])
def test_a_lint_failure_or_no_tests_fails_ci(tmp_path, ruff_rc, pytest_rc, ran):
    run, log = _stub_tree(tmp_path, ruff_rc, pytest_rc)
    p = subprocess.run(["bash", str(run)], capture_output=True, text=True, timeout=60)
    assert p.returncode != 0  # pytest's 5 (no tests collected) fails CI too
    if ran is not None:
        assert log.read_text().splitlines() == ran  # the tests do not run after a lint error


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
