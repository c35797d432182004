"""The K, D, w sweep as one heatmap figure (the paper's Figure 10 analogue), from a
``solve_bench.py --grid swap=.. interval=.. warmup=..`` JSON.

    .venv/bin/python benchmarks/solve_bench.py --dataset toy:val:100 --n 32 --methods sc,gambit \\
        --grid swap=1,2,4,8 interval=8,16,32 warmup=16,32,64 --out runs/kdw.json
    .venv/bin/python benchmarks/sweep_heatmap.py runs/kdw.json --out docs/results/toy_table_3seeds/ablations/kdw_heatmap.png

One panel per warmup w; rows K (swap size), columns D (round interval); each cell is the
weighted-vote accuracy, annotated with it and the unique tokens per question relative to
SC's in the same JSON (when SC ran). Prints the same grid as a Markdown table.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def load(path: str | Path) -> tuple[list[dict], float | None]:
    """Gambit runs (with their params) and SC's unique tokens (None: SC did not run)."""
    runs = json.loads(Path(path).read_text())["runs"]
    sc = [r["unique_tokens"] for r in runs if r["method"] == "sc"]
    return [r for r in runs if r["method"] == "gambit"], (sum(sc) / len(sc) if sc else None)


def grid(runs: list[dict]) -> tuple[list[int], list[int], list[int], dict]:
    """The swept values and a map (w, K, D) -> run."""
    cells = {(r["params"]["warmup"], r["params"]["swap"], r["params"]["interval"]): r for r in runs}
    ws, ks, ds = (sorted({c[i] for c in cells}) for i in range(3))
    return ws, ks, ds, cells


def markdown(runs: list[dict], sc_tokens: float | None) -> str:
    ws, ks, ds, cells = grid(runs)
    head = "| w | K | " + " | ".join(f"D={d}" for d in ds) + " |"
    lines = [head, "|---|---|" + "---|" * len(ds)]
    for w in ws:
        for k in ks:
            row = []
            for d in ds:
                r = cells.get((w, k, d))
                if r is None:
                    row.append("-")
                    continue
                tok = f" ({r['unique_tokens'] / sc_tokens:.2f}x)" if sc_tokens else ""
                row.append(f"{100 * r['accuracy']:.0f}%{tok}")
            lines.append(f"| {w} | {k} | " + " | ".join(row) + " |")
    return "\n".join(lines)


def draw(runs: list[dict], sc_tokens: float | None, out: Path,
         sc_accuracy: float | None = None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    ws, ks, ds, cells = grid(runs)
    fig, axes = plt.subplots(1, len(ws), figsize=(3.2 * len(ws) + 1, 3.2), squeeze=False)
    acc = [r["accuracy"] for r in runs]
    lo, hi = min(acc), max(acc)
    im = None
    for ax, w in zip(axes[0], ws, strict=True):
        a = np.full((len(ks), len(ds)), np.nan)
        for i, k in enumerate(ks):
            for j, d in enumerate(ds):
                r = cells.get((w, k, d))
                if r is None:
                    continue
                a[i, j] = r["accuracy"]
                txt = f"{100 * r['accuracy']:.0f}"
                if sc_tokens:
                    txt += f"\n{r['unique_tokens'] / sc_tokens:.2f}x"
                dark = (r["accuracy"] - lo) < 0.5 * (hi - lo)
                ax.text(j, i, txt, ha="center", va="center", fontsize=8,
                        color="white" if dark else "black")
        im = ax.imshow(a, vmin=lo, vmax=hi, cmap="viridis", aspect="auto")
        ax.set_xticks(range(len(ds)), [str(d) for d in ds])
        ax.set_yticks(range(len(ks)), [str(k) for k in ks])
        ax.set_xlabel("D (round interval, steps)")
        ax.set_ylabel("K (swap size)")
        ax.set_title(f"w = {w}")
    sub = "accuracy (%), unique tokens vs SC"
    if sc_accuracy is not None:
        sub += f"; SC {100 * sc_accuracy:.0f}%"
    fig.suptitle(f"Gambit K x D x w sweep: {sub}", fontsize=10, y=1.04)
    fig.colorbar(im, ax=axes[0].tolist(), shrink=0.8)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120, bbox_inches="tight")
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("sweep", help="solve_bench.py JSON with a swap x interval x warmup grid")
    ap.add_argument("--out", required=True, help="PNG to write")
    a = ap.parse_args(argv)
    runs, sc_tokens = load(a.sweep)
    if not runs:
        raise SystemExit(f"{a.sweep}: no gambit runs")
    sc = [r["accuracy"] for r in json.loads(Path(a.sweep).read_text())["runs"]
          if r["method"] == "sc"]
    draw(runs, sc_tokens, Path(a.out), sc[0] if sc else None)
    print(markdown(runs, sc_tokens))
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
