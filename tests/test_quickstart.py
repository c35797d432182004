"""The README quick start's main job (`gambit-solve` on the embedded default), run as a user
runs it: the README's own command line, output redirected to a temporary directory."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _readme_command() -> list[str]:
    text = (REPO / "README.md").read_text()
    line = next(x for x in text.splitlines() if x.startswith("bash scripts/setup.sh && "))
    cmd = line.split("&&", 1)[1].strip()
    assert cmd.startswith(".venv/bin/gambit-solve "), cmd
    return shlex.split(cmd)[1:]


@pytest.mark.slow
def test_quickstart_solves_toy_questions_with_gambit_and_sc(tmp_path):
    args = _readme_command()
    out = args.index("--out")
    args[out + 1] = str(tmp_path / "qs")
    p = subprocess.run([sys.executable, "-m", "gambit_search.solve", *args], cwd=REPO,
                       capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    # one table row per method, each with an accuracy
    rows = {m: re.search(rf"│ {m}\s+│\s+(\d+) │\s+([\d.]+)%", p.stdout) for m in ("gambit", "sc")}
    assert all(rows.values()), p.stdout
    for m in ("gambit", "sc"):
        s = json.loads((tmp_path / "qs" / m / "results.json").read_text())
        assert s["questions"] == int(rows[m].group(1)) == 20
        assert abs(100 * s["accuracy"] - float(rows[m].group(2))) < 0.06
        assert s["failed"] == 0
    assert "INFO" not in p.stderr  # vLLM's INFO logs are off without -v
