"""benchmarks/sweep_heatmap.py: the K x D x w grid, its Markdown table and its figure."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _mod():
    spec = importlib.util.spec_from_file_location("sweep_heatmap",
                                                  ROOT / "benchmarks" / "sweep_heatmap.py")
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


def _sweep(tmp_path: Path) -> Path:
    runs = [{"method": "sc", "accuracy": 0.5, "unique_tokens": 1000, "params": {}}]
    for w in (16, 32):
        for k in (1, 2):
            for d in (8, 16, 32):
                if (w, k, d) == (32, 2, 32):
                    continue  # a missing cell
                runs.append({"method": "gambit", "accuracy": 0.6 + 0.01 * k + 0.001 * d,
                             "unique_tokens": 10 * d + w,
                             "params": {"swap": k, "interval": d, "warmup": w}})
    p = tmp_path / "sweep.json"
    p.write_text(json.dumps({"runs": runs}))
    return p


def test_grid_and_markdown_put_each_run_in_its_cell(tmp_path):
    m = _mod()
    runs, sc = m.load(_sweep(tmp_path))
    assert sc == 1000 and len(runs) == 11
    ws, ks, ds, cells = m.grid(runs)
    assert (ws, ks, ds) == ([16, 32], [1, 2], [8, 16, 32])
    md = m.markdown(runs, sc).splitlines()
    assert md[0] == "| w | K | D=8 | D=16 | D=32 |"
    # w=16, K=2, D=32: accuracy 0.6 + 0.02 + 0.032 -> 65%, tokens 336 / 1000
    assert md[3] == "| 16 | 2 | 63% (0.10x) | 64% (0.18x) | 65% (0.34x) |"
    assert md[5].endswith("| - |")  # the missing cell


def test_main_draws_a_png(tmp_path):
    m = _mod()
    out = tmp_path / "fig" / "kdw.png"
    m.main([str(_sweep(tmp_path)), "--out", str(out)])
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
