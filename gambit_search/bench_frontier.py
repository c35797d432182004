"""The frontier check of a gambit-bench budget sweep: is a method's accuracy-vs-tokens line on
or above a reference method's (BoN by default) at every token budget?

    from gambit_search.bench_frontier import frontier_gaps, frontier_markdown
    gaps = frontier_gaps(table, reference="bon")      # table: gambit-bench's aggregated rows
    print(frontier_markdown(gaps))

A method's line runs through its rows (one per budget N) in order of unique tokens per
question, each at its best vote rule's accuracy (the row's headline), straight between points
on a log token axis (as ``accuracy_vs_tokens.png`` draws it) and held at its last point
beyond it (a method that reached accuracy A at T tokens is there at any larger budget). The
check reads both lines at every point of either, from the later of their first points on
(left of a line's first point it has no value), and reports the worst gap (method minus
reference, in accuracy points) and the budget where it falls. Only a sweep is checked: a
method or reference with one budget has no line.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["frontier_gaps", "frontier_markdown", "line_at"]

Point = tuple[float, float]
"""(unique tokens per question, accuracy in points)."""


def line_at(points: Sequence[Point], x: float) -> float:
    """The line through ``points`` (sorted by tokens) at ``x`` tokens: straight between
    points on a log token axis, held flat beyond the last point (and before the first)."""
    if x <= points[0][0]:
        return points[0][1]
    for (x0, y0), (x1, y1) in zip(points, points[1:], strict=False):
        if x <= x1:
            t = (math.log(x) - math.log(x0)) / (math.log(x1) - math.log(x0)) if x1 > x0 else 1.0
            return y0 + t * (y1 - y0)
    return points[-1][1]


def _line(rows: list[dict]) -> list[Point]:
    return sorted((r["unique_tokens_per_question"], 100 * r["accuracy"]) for r in rows
                  if r.get("accuracy") is not None and r.get("unique_tokens_per_question"))


def frontier_gaps(table: list[dict], reference: str = "bon") -> list[dict]:
    """Per dataset and method (other than ``reference``) with at least two budgets, beside a
    ``reference`` with at least two: the worst gap of its line against the reference's
    (``worst_gap``, points; >= 0: on or above everywhere), the token budget where it falls
    (``at_tokens``), ``on_or_above``, and where the check starts (``from_tokens``: the later
    first point). Empty when the reference is not in the table."""
    out = []
    for d in dict.fromkeys(r["dataset"] for r in table):
        rows = [r for r in table if r["dataset"] == d]
        ref = _line([r for r in rows if r["method"] == reference])
        if len(ref) < 2:
            continue
        for m in dict.fromkeys(r["method"] for r in rows):
            line = _line([r for r in rows if r["method"] == m])
            if m == reference or len(line) < 2:
                continue
            start = max(ref[0][0], line[0][0])
            xs = sorted({x for x, _ in ref + line if x >= start} | {start})
            gap, at = min((line_at(line, x) - line_at(ref, x), x) for x in xs)
            out.append({"dataset": d, "method": m, "reference": reference,
                        "worst_gap": round(gap, 3), "at_tokens": round(at, 1),
                        "on_or_above": gap >= -1e-9, "budgets": len(line),
                        "from_tokens": round(start, 1)})
    return out


def frontier_markdown(gaps: list[dict]) -> str:
    """The check as a Markdown table ("" when there is nothing to check)."""
    if not gaps:
        return ""
    lines = ["| dataset | method | against | budgets | checked from tokens / q | "
             "worst gap (points) | at tokens / q | on or above |", "|---|---|---|---|---|---|---|---|"]
    for g in gaps:
        lines.append(f"| {g['dataset']} | {g['method']} | {g['reference']} | {g['budgets']} | "
                     f"{g['from_tokens']:,.0f} | {g['worst_gap']:+.1f} | {g['at_tokens']:,.0f} | "
                     f"{'yes' if g['on_or_above'] else 'no'} |")
    return "\n".join(lines) + "\n"
