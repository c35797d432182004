"""The issue-29 TEST frontier at gambit-solve's defaults of today (5376888), one figure and one
table, drawn from the numbers the test passes wrote down (nothing is re-run, nothing is typed
twice: the rows are parsed out of the three .md files below).

* SC, BoN-p (BoN with the default prefix scorer) and STEP: ``test-frontier.md`` (stop 40's
  pass; SC is BoN's plain column: the same N fresh traces).
* Gambit at today's defaults: N = 8, 16 from ``test-lineage.md`` (stop 42; the width rule
  did not change there), N = 32, 64, 128 from ``test-width.md`` (stop 44).

Every method's point is its best vote rule (the headline), with a 95% Wilson interval on its
100 questions. It also checks the issue's frontier goal: Gambit's line on or above BoN-p's at
every token budget from N = 8 to 128, by gambit-bench's own check
(:func:`gambit_search.bench_frontier.frontier_gaps`: both lines straight between points on a
log token axis, as the figure draws them, each held at its last point beyond it).

    python docs/results/issue29/frontier_now.py      # from the repository root
"""

from __future__ import annotations

import re
from pathlib import Path

HERE = Path(__file__).parent
SPLITS = {"toy": "toy:test:100", "toy-hard": "toy-hard:test:100", "toy-clean": "toy-clean:test:100"}


def _cells(line: str) -> list[str]:
    return [c.strip().replace("*", "") for c in line.strip().strip("|").split("|")]


def _num(cell: str) -> float:
    return float(re.match(r"[\d,.]+", cell).group(0).replace(",", ""))


def baselines() -> list[dict]:
    """SC, BoN-p and STEP rows of test-frontier.md's first table."""
    rows = []
    for line in (HERE / "test-frontier.md").read_text().splitlines():
        c = _cells(line)
        if len(c) != 10 or not c[0].endswith(":test:100") or c[2] not in ("bon", "bon-p", "step"):
            continue
        split = c[0].split(":")[0]
        n, tok = int(c[1]), _num(c[8])
        if c[2] == "bon":
            rows.append(dict(split=split, method="SC", n=n, acc=_num(c[5]), tokens=tok))
        else:
            rows.append(dict(split=split, method={"bon-p": "BoN-p", "step": "STEP"}[c[2]],
                             n=n, acc=_num(c[3]), tokens=tok))
    return rows


def gambit() -> list[dict]:
    """Gambit at today's defaults: test-lineage.md's bench table (N = 8, 16) and
    test-width.md's table (N = 32..128; best of its four rule columns)."""
    rows = []
    for line in (HERE / "test-lineage.md").read_text().splitlines():
        c = _cells(line)
        if len(c) > 20 and c[1] == "gambit" and c[2] in ("8", "16"):
            rows.append(dict(split=c[0].split(":")[0], method="Gambit", n=int(c[2]),
                             acc=_num(c[5]), tokens=_num(c[14])))
    for line in (HERE / "test-width.md").read_text().splitlines():
        c = _cells(line)
        if len(c) == 11 and c[0] in SPLITS and c[1].isdigit():
            rows.append(dict(split=c[0], method="Gambit", n=int(c[1]),
                             acc=max(_num(x) for x in c[3:7]), tokens=_num(c[7])))
    return rows


if __name__ == "__main__":
    from gambit_search.bench_frontier import frontier_gaps
    from gambit_search.bench_plots import _plt
    from gambit_search.bench_tables import wilson

    rows = baselines() + gambit()
    plt = _plt()
    fig, axes = plt.subplots(1, 3, figsize=(18, 4.8))
    print("| split | N | SC | BoN-p | STEP | Gambit | tokens / q: BoN-p | Gambit (/ BoN-p) |")
    print("|---|---|---|---|---|---|---|---|")
    for ax, split in zip(axes, SPLITS, strict=True):
        by = {m: sorted((r for r in rows if r["split"] == split and r["method"] == m),
                        key=lambda r: r["n"]) for m in ("SC", "BoN-p", "STEP", "Gambit")}
        assert all(len(v) == 5 for v in by.values()), (split, {m: len(v) for m, v in by.items()})
        for i, (m, pts) in enumerate(by.items()):
            xs, ys = [p["tokens"] for p in pts], [p["acc"] for p in pts]
            ci = [wilson(round(y), 100) for y in ys]
            err = [[y - 100 * lo for y, (lo, _) in zip(ys, ci, strict=True)],
                   [100 * hi - y for y, (_, hi) in zip(ys, ci, strict=True)]]
            ax.errorbar(xs, ys, yerr=err, fmt="-o", color=f"C{i}", capsize=3, ms=4, label=m)
            for p in pts:
                ax.annotate(str(p["n"]), (p["tokens"], p["acc"]), textcoords="offset points",
                            xytext=(3, 3), fontsize=6, color=f"C{i}")
        for k in range(5):
            r = {m: by[m][k] for m in by}
            print(f"| {split} | {r['SC']['n']} | {r['SC']['acc']:.0f} | {r['BoN-p']['acc']:.0f} | "
                  f"{r['STEP']['acc']:.0f} | {r['Gambit']['acc']:.0f} | {r['BoN-p']['tokens']:,.0f} | "
                  f"{r['Gambit']['tokens']:,.0f} ({r['Gambit']['tokens'] / r['BoN-p']['tokens']:.2f}) |")
        (g,) = frontier_gaps([{"dataset": split, "method": p["method"], "accuracy": p["acc"] / 100,
                               "unique_tokens_per_question": p["tokens"]}
                              for m in ("Gambit", "BoN-p") for p in by[m]], reference="BoN-p")
        gap, at = g["worst_gap"], g["at_tokens"]
        print(f"| {split} | frontier: worst Gambit - BoN-p gap {gap:+.1f} points at "
              f"{at:,.0f} tokens / q | | | | | | |")
        ax.set_xscale("log")
        ax.set_title(f"{SPLITS[split]} at today's defaults (labels: N; bars: 95% Wilson)",
                     fontsize=9)
        ax.set_xlabel("unique tokens per question")
        ax.set_ylabel("accuracy, best rule (%)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(HERE / "test-frontier-now.png", dpi=120)
    print(HERE / "test-frontier-now.png")
