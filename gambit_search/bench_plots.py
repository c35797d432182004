"""Figures of a gambit-bench run (matplotlib, headless), drawn from the saved run directories.

    from gambit_search.bench_plots import draw_all
    draw_all(Path("runs/bench"), per_run)   # per_run: gambit-bench's table.json "runs"

* ``accuracy_vs_tokens.png`` / ``accuracy_vs_latency.png``: efficiency frontiers, one panel
  per dataset: one line per method through its rows at each budget N (labelled), each with
  its best rule's 95% interval, and one faint point per (method, N, seed).
* ``kv_over_time.png``: KV use and running requests over time, one panel per method (the
  paper's Figure 4 analogue; first dataset, first seed).
* ``token_distributions.png``: new tokens per completed trace and total sequence length
  (inherited + own) per method (Figures 7/8 analogues).
* ``tree.png``: one question's search tree (the first question of the first Gambit run):
  each node a bar from its creation to its end on the question's token clock, children
  linked to their parents, coloured by how it ended; each graded completion is marked right
  (green dot) or wrong (red cross).
"""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["draw_all"]

_STATE_COLOURS = {"completed": "tab:green", "pruned": "tab:red", "stopped": "tab:gray",
                  "failed": "black", "running": "tab:blue", "ghost": "tab:purple"}


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _frontier(per_run: list[dict], x_key: str, xlabel: str, path: Path) -> None:
    """One panel per dataset; per method a line through its table rows at each N (sorted by
    N, each point labelled with it) with the row's 95% interval, and its runs (one per seed)
    as faint dots."""
    from gambit_search.bench_tables import aggregate

    plt = _plt()
    table = aggregate(per_run)
    datasets = list(dict.fromkeys(r["dataset"] for r in per_run))
    methods = list(dict.fromkeys(r["method"] for r in per_run))
    fig, axes = plt.subplots(1, len(datasets), figsize=(6 * len(datasets), 4.5), squeeze=False)
    for ax, d in zip(axes[0], datasets, strict=True):
        for i, m in enumerate(methods):
            c = f"C{i}"
            pts = [r for r in per_run if r["dataset"] == d and r["method"] == m and r["graded"]]
            ax.scatter([_x(r, x_key, run=True) for r in pts],
                       [100 * r["correct"] / r["graded"] for r in pts], color=c, alpha=0.3, s=14)
            rows = sorted((t for t in table if t["dataset"] == d and t["method"] == m
                           and t["accuracy"] is not None and _x(t, x_key) is not None),
                          key=lambda t: (t.get("n") or 0))
            if not rows:
                continue
            xs = [_x(t, x_key) for t in rows]
            ys = [100 * t["accuracy"] for t in rows]
            err = [[y - 100 * t["ci95"][0] for y, t in zip(ys, rows, strict=True)],
                   [100 * t["ci95"][1] - y for y, t in zip(ys, rows, strict=True)]]
            ax.errorbar(xs, ys, yerr=err, fmt="-o", color=c, capsize=3, ms=4, label=m)
            for x, y, t in zip(xs, ys, rows, strict=True):
                if t.get("n") is not None:
                    ax.annotate(f"{t['n']}", (x, y), textcoords="offset points", xytext=(3, 3),
                                fontsize=6, color=c)
        if len(set(t.get("n") for t in table)) > 1 and x_key == "tokens":
            ax.set_xscale("log")
        ax.set_title(f"{d} (labels: N; bars: best rule's 95% CI)", fontsize=9)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("accuracy (%)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _x(r: dict, x_key: str, run: bool = False) -> float | None:
    """A run's (``run``) or a table row's x: unique tokens per question, or mean latency."""
    if x_key != "tokens":
        return r.get("latency_s")
    return r["unique_tokens"] / max(1, r["questions"]) if run else r["unique_tokens_per_question"]


def _first_runs(per_run: list[dict]) -> dict[str, dict]:
    d0 = per_run[0]["dataset"]
    out: dict[str, dict] = {}
    for r in per_run:
        if r["dataset"] == d0 and r["method"] not in out:
            out[r["method"]] = r
    return out


def _kv(per_run: list[dict], path: Path) -> None:
    plt = _plt()
    runs = _first_runs(per_run)
    fig, axes = plt.subplots(len(runs), 1, figsize=(7, 2.2 * len(runs)), squeeze=False)
    for ax, (m, r) in zip(axes[:, 0], runs.items(), strict=True):
        s = json.loads((Path(r["dir"]) / "results.json").read_text())
        log = s.get("memory_log") or []
        if log:
            t = [x[0] for x in log]
            ax.plot(t, [100 * x[3] for x in log], color="tab:blue", lw=1, label="KV use (%)")
            ax2 = ax.twinx()
            ax2.plot(t, [x[1] for x in log], color="tab:orange", lw=1, label="running")
            ax2.plot(t, [x[2] for x in log], color="tab:red", lw=1, ls="--", label="waiting")
            ax2.set_ylabel("requests", fontsize=8)
            ax2.legend(fontsize=7, loc="upper right")
        ax.set_ylim(0, 105)
        ax.set_ylabel("KV use (%)", fontsize=8)
        ax.set_title(f"{m} ({r['dataset']}, seed {r['seed']})", fontsize=9)
    axes[-1, 0].set_xlabel("seconds since the run started")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _trees(run_dir: str) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(Path(run_dir, "trees").glob("*.json"))]


def _tokens(per_run: list[dict], path: Path) -> None:
    plt = _plt()
    runs = _first_runs(per_run)
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(9, 3.5))
    for i, (m, r) in enumerate(runs.items()):
        new, total = [], []
        for t in _trees(r["dir"]):
            for n in t["nodes"]:
                if n["state"] == "completed":
                    new.append(n["generated"])
                    total.append(n["inherited"] + n["generated"])
        if new:
            a1.hist(new, bins=30, alpha=0.5, color=f"C{i}", label=m)
            a2.hist(total, bins=30, alpha=0.5, color=f"C{i}", label=m)
    a1.set_xlabel("new tokens per completed trace")
    a2.set_xlabel("total sequence length (inherited + new)")
    for a in (a1, a2):
        a.set_ylabel("completed traces")
        a.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _tree(per_run: list[dict], path: Path) -> bool:
    from gambit_search.diagnostics import completion_correct
    from gambit_search.solve.outputs import read_results

    runs = [r for r in per_run if r["method"] == "gambit"]
    if not runs:
        return False
    trees = _trees(runs[0]["dir"])
    if not trees:
        return False
    tree = max(trees, key=lambda t: len(t["nodes"]))
    nodes = tree["nodes"]
    gold = {r["id"]: r.get("gold") for r in read_results(Path(runs[0]["dir"]))}.get(tree["id"])
    right = completion_correct(nodes, gold)
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, max(3, len(nodes) * 0.06)))
    end = max((n["ended_at"] or 0) for n in nodes) or 1
    row = {n["id"]: i for i, n in enumerate(sorted(nodes, key=lambda n: n["created_at"]))}
    for n in nodes:
        y = row[n["id"]]
        e = n["ended_at"] if n["ended_at"] is not None else end
        ax.plot([n["created_at"], e], [y, y], color=_STATE_COLOURS.get(n["state"], "k"), lw=1.5)
        if n["parent"] is not None:
            ax.plot([n["created_at"]] * 2, [row[n["parent"]], y], color="0.8", lw=0.5, zorder=0)
        if right.get(n["id"]) is not None:  # a graded completion: right or wrong at its end
            ax.scatter([e], [y], marker="o" if right[n["id"]] else "x", s=14, zorder=3,
                       color="tab:green" if right[n["id"]] else "tab:red")
    for st, c in _STATE_COLOURS.items():
        if any(n["state"] == st for n in nodes):
            ax.plot([], [], color=c, label=st)
    if any(v is not None for v in right.values()):
        ax.scatter([], [], marker="o", color="tab:green", s=14, label="completion right")
        ax.scatter([], [], marker="x", color="tab:red", s=14, label="completion wrong")
    ax.set_xlabel("question's unique-token clock")
    ax.set_ylabel("node (by creation)")
    k = sum(bool(v) for v in right.values())
    ax.set_title(f"gambit tree of {tree['id']} (N={runs[0].get('n')}): {len(nodes)} nodes, "
                 f"{k} of {len(right)} completions right", fontsize=9)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def draw_all(out: Path, per_run: list[dict]) -> list[str]:
    """Draw every figure into ``out/figures``; returns their paths."""
    fig_dir = Path(out) / "figures"
    fig_dir.mkdir(parents=True, exist_ok=True)
    paths = [fig_dir / "accuracy_vs_tokens.png", fig_dir / "accuracy_vs_latency.png",
             fig_dir / "kv_over_time.png", fig_dir / "token_distributions.png"]
    _frontier(per_run, "tokens", "unique tokens per question", paths[0])
    _frontier(per_run, "latency", "mean question latency (s)", paths[1])
    _kv(per_run, paths[2])
    _tokens(per_run, paths[3])
    if _tree(per_run, fig_dir / "tree.png"):
        paths.append(fig_dir / "tree.png")
    return [str(p) for p in paths]
