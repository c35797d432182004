"""gambit-bench on the scripted fake engine: table, figures, resume, and bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gambit_search.bench import BenchConfig, BenchInputError, bench, parse_sets
from gambit_search.bench_tables import wilson

REPO = Path(__file__).resolve().parents[1]



def _cfg(tmp_path, scorer, **kw) -> BenchConfig:
    base = dict(out=str(tmp_path / "b"), engine="fake", methods="sc,gambit",
                datasets="toy:val:4,toy:test:3", seeds="0,1", n=6, scorer=scorer)
    return BenchConfig(**(base | kw))


def _bad(tmp_path, scorer, kw) -> BenchConfig:
    return _cfg(tmp_path, kw.pop("scorer", scorer), engine="vllm", **kw)


SETS = {"gambit": {"swap": 3, "interval": 3, "warmup": 4}}


def test_table_pools_seeds_and_draws_figures(tmp_path, fake_scorer):
    res = bench(_cfg(tmp_path, fake_scorer), SETS, progress=False)
    assert len(res["runs"]) == 2 * 2 * 2
    rows = {(r["dataset"], r["method"]): r for r in res["table"]}
    assert set(rows) == {(d, m) for d in ("toy:val:4", "toy:test:3") for m in ("sc", "gambit")}
    for (d, m), r in rows.items():
        runs = [x for x in res["runs"] if x["dataset"] == d and x["method"] == m]
        assert r["questions"] == sum(x["questions"] for x in runs) == 2 * int(d.split(":")[-1])
        lo, hi = r["ci95"]
        assert 0 <= lo <= r["accuracy"] <= hi <= 1
        assert r["kv_mean"] is not None and 0 <= r["kv_mean"] <= 1
        # completed traces per question and the share that reached N, from the results
        done = [json.loads(line)["tree_stats"]["completions"] for x in runs
                for line in Path(x["dir"], "results.jsonl").read_text().splitlines()]
        assert r["completions_per_question"] == pytest.approx(sum(done) / len(done))
        assert r["budget_reached"] == pytest.approx(sum(c >= 6 for c in done) / len(done))
        # every vote rule from the rows; the headline is the best one, named
        res_rows = [json.loads(line) for x in runs
                    for line in Path(x["dir"], "results.jsonl").read_text().splitlines()]
        for rule in ("weighted", "plain", "top1", "lineage"):
            want = sum(bool(q[f"correct_{rule}"]) for q in res_rows) / len(res_rows)
            assert r[f"accuracy_{rule}"] == pytest.approx(want)
        assert r["accuracy"] == r[f"accuracy_{r['best_rule']}"] == max(
            r["accuracy_weighted"], r["accuracy_plain"], r["accuracy_top1"],
            r["accuracy_lineage"])
        started = sum(q["tree_stats"]["started"] for q in res_rows)
        assert r["started_per_question"] == pytest.approx(started / len(res_rows))
        assert r["started_per_question"] >= r["completions_per_question"]
    assert rows[("toy:val:4", "sc")]["budget_reached"] == 1.0  # SC always completes N
    # seed-major order: every method's seed 0 before any seed 1
    order = [(x["seed"], x["method"]) for x in res["runs"] if x["dataset"] == "toy:val:4"]
    assert order == [(0, "sc"), (0, "gambit"), (1, "sc"), (1, "gambit")]
    # the per-method setting reached gambit's runs only
    for run in res["runs"]:
        cfg = json.loads(Path(run["dir"], "run_config.json").read_text())
        assert cfg["method"] == run["method"]
        # a method's own parameters only: SC has no swap
        assert cfg.get("swap") == (3 if run["method"] == "gambit" else None)
    out = tmp_path / "b"
    assert "| toy:val:4 | gambit | 6 | 2 | 8 |" in (out / "table.md").read_text()
    for f in res["figures"]:
        assert Path(f).stat().st_size > 5000
    assert any(f.endswith("tree.png") for f in res["figures"])


def test_rerun_resumes_without_solving_again(tmp_path, fake_scorer):
    first = bench(_cfg(tmp_path, fake_scorer), SETS, progress=False, figures=False)
    lines = {r["dir"]: Path(r["dir"], "results.jsonl").read_text() for r in first["runs"]}
    again = bench(_cfg(tmp_path, fake_scorer), SETS, progress=False, figures=False)
    assert again["table"] == first["table"]
    assert {d: Path(d, "results.jsonl").read_text() for d in lines} == lines


def test_config_file_and_flags(tmp_path, fake_scorer):
    cfgf = tmp_path / "bench.yaml"
    cfgf.write_text("methods: [sc]\ndatasets: [toy:val:3]\nseeds: [0]\nn: 4\n"
                    "set:\n  sc:\n    max_tokens: 50\n")
    res = bench(BenchConfig(out=str(tmp_path / "c"), engine="fake", config=str(cfgf),
                            scorer="none"), {}, progress=False, figures=False)
    assert [(r["method"], r["questions"]) for r in res["table"]] == [("sc", 3)]
    run_cfg = json.loads(Path(res["runs"][0]["dir"], "run_config.json").read_text())
    assert run_cfg["max_tokens"] == 50 and run_cfg["n"] == 4


def test_a_method_variant_gets_its_own_row_and_settings(tmp_path, fake_scorer):
    cfg = _cfg(tmp_path, fake_scorer, methods="gambit,gambit-c4=gambit", datasets="toy:val:3",
               seeds="0")
    sets = {"gambit": dict(SETS["gambit"]), "gambit-c4": dict(SETS["gambit"], capacity=4, swap=2)}
    res = bench(cfg, sets, progress=False, figures=False)
    assert [r["method"] for r in res["table"]] == ["gambit", "gambit-c4"]
    caps, swaps = {}, {}
    for run in res["runs"]:
        run_cfg = json.loads(Path(run["dir"], "run_config.json").read_text())
        assert run_cfg["method"] == "gambit" and Path(run["dir"]).parent.name == run["method"]
        caps[run["method"]] = run_cfg["capacity"]
        swaps[run["method"]] = run_cfg["swap"]
    # gambit keeps the default C (scaled with N when it runs), gambit-c4 its own
    assert caps == {"gambit": None, "gambit-c4": 4}
    assert swaps == {"gambit": 3, "gambit-c4": 2}


@pytest.mark.parametrize("kw, sets, msg", [
    (dict(methods="sc,x=nope"), {}, "unknown method 'nope'"),
    (dict(methods="sc,sc=sc"), {}, "names 'sc' twice"),
    (dict(methods="a b=sc"), {}, "bad label"),
    (dict(methods="sc,nope"), {}, "unknown method 'nope'"),
    (dict(datasets="toy:val:3,/no/such.jsonl"), {}, "cannot load dataset"),
    (dict(methods="gambit", scorer="none"), {}, "needs a scorer"),
    (dict(seeds="0,x"), {}, "--seeds must be integers"),
    (dict(), {"step": {"n": 3}}, "not in --methods"),
    (dict(), {"gambit": {"nope": 3}}, "unknown parameters"),
    (dict(config="/no/such.yaml"), {}, "does not exist"),
    (dict(n="8,x"), {}, "--n takes positive integers"),
    (dict(n="8,0"), {}, "--n takes positive integers"),
    (dict(n="8,8"), {}, "names a budget twice"),
    (dict(frontier_reference="step"), {}, "--frontier-reference 'step' is not in --methods"),
])
def test_bad_input_is_refused_before_any_engine(tmp_path, fake_scorer, kw, sets, msg):
    # engine="vllm": had anything started vLLM, this would take a minute and need the model
    with pytest.raises(BenchInputError, match=msg):
        bench(_bad(tmp_path, fake_scorer, dict(kw)), sets, progress=False)
    assert not (tmp_path / "b" / "table.json").exists()


def test_parse_sets_and_wilson():
    assert parse_sets(["gambit.swap=2", "gambit.branch-point=current", "sc.n=8"]) == {
        "gambit": {"swap": 2, "branch_point": "current"}, "sc": {"n": 8}}
    with pytest.raises(BenchInputError):
        parse_sets(["swap=2"])
    lo, hi = wilson(50, 100)
    assert lo == pytest.approx(0.404, abs=1e-3) and hi == pytest.approx(0.596, abs=1e-3)
    assert wilson(0, 10)[0] == pytest.approx(0.0, abs=1e-12)


def test_a_flag_given_at_its_default_value_wins_over_the_config_file(tmp_path):
    """OmegaConf's order: defaults < file < the flags given (even one given at its default,
    which the old merge let the file override)."""
    from gambit_search.bench import load_config

    f = tmp_path / "b.yaml"
    f.write_text("n: 16\nseeds: [0, 1]\nkv_cache: 0.02\nset:\n  gambit: {swap: 4}\n")
    base = BenchConfig(out=str(tmp_path / "o"), config=str(f))
    cfg, sets = load_config(base, {"gambit": {"interval": 8}}, given={"n"})  # --n 32 given
    assert cfg.n == "32" and cfg.seeds == "0,1" and cfg.kv_cache == 0.02
    assert sets == {"gambit": {"swap": 4, "interval": 8}}
    cfg, _ = load_config(base, {}, given=set())  # nothing given: the file's
    assert cfg.n == "16"
    f.write_text("n: [8, 16]\n")  # a list sweeps, as --n 8,16
    assert load_config(base, {}, given=set())[0].n == "8,16"
    f.write_text("n: lots\n")
    with pytest.raises(BenchInputError, match="n"):
        load_config(base, {}, given=set())


def test_a_budget_sweep_has_a_row_per_method_and_n(tmp_path, fake_scorer):
    """--n 4,8: every method at each N into its own n<N> directory at gambit-solve's
    defaults for that N, the frontier figure drawn."""
    cfg = _cfg(tmp_path, fake_scorer, n="4,8", datasets="toy:val:3", seeds="0,1",
               frontier_reference="sc")
    res = bench(cfg, {"gambit": {"interval": 3, "warmup": 4}}, progress=False)
    (g,) = res["frontier"]  # gambit's line against sc's, both through N = 4 and 8
    assert (g["dataset"], g["method"], g["reference"], g["budgets"]) == ("toy:val:3", "gambit", "sc", 2)
    assert [(r["method"], r["n"]) for r in res["table"]] == [
        ("sc", 4), ("gambit", 4), ("sc", 8), ("gambit", 8)]
    # budget-major, then seed-major
    assert [(x["n"], x["seed"], x["method"]) for x in res["runs"]][:4] == [
        (4, 0, "sc"), (4, 0, "gambit"), (4, 1, "sc"), (4, 1, "gambit")]
    for run in res["runs"]:
        assert Path(run["dir"]).parent.name == f"n{run['n']}"
        run_cfg = json.loads(Path(run["dir"], "run_config.json").read_text())
        assert run_cfg["n"] == run["n"]
        if run["method"] == "gambit":  # gambit-solve's defaults: scaled with N at run time
            assert (run_cfg["capacity"], run_cfg["swap"]) == (None, None)
    for r in res["table"]:
        assert r["questions"] == 6 and r["seeds"] == 2
        if r["method"] == "sc":  # SC votes on exactly N
            assert r["completions_per_question"] == r["n"]
    md = (tmp_path / "b" / "table.md").read_text()
    assert "| toy:val:3 | sc | 4 | 2 | 6 |" in md and "| toy:val:3 | sc | 8 | 2 | 6 |" in md
    assert "## Frontier against sc" in md and "| toy:val:3 | gambit | sc | 2 |" in md
    assert any(f.endswith("accuracy_vs_tokens.png") and Path(f).stat().st_size > 5000
               for f in res["figures"])
    solo = bench(_cfg(tmp_path, fake_scorer, out=str(tmp_path / "s"), n="4",
                      methods="gambit", datasets="toy:val:3", seeds="0"), {},
                 progress=False, figures=False)
    assert Path(solo["runs"][0]["dir"]).parent.name == "gambit"  # one N: no n<N> level


@pytest.mark.parametrize("n", [1, 7, 64, 100, 1000])
def test_wilson_holds_its_point_at_the_ends(n):
    """k = n and k = 0 give exact ends: 100/100 had an upper bound of 0.9999999999999999,
    a negative error bar, and gambit-bench's frontier figure crashed."""
    assert wilson(n, n)[1] == 1.0 and wilson(0, n)[0] == 0.0
    for k in range(0, n + 1, max(1, n // 10)):
        lo, hi = wilson(k, n)
        assert lo <= k / n <= hi


def _row(d, m, n, acc, tok):
    return {"dataset": d, "method": m, "n": n, "accuracy": acc, "unique_tokens_per_question": tok}


def test_frontier_gap_reads_both_lines_on_a_log_axis():
    """A hand-built sweep: Gambit above BoN except at BoN's top point, where Gambit's line,
    straight in log tokens from (4,000, 98) to (16,000, 100), is at 99 at 8,000 tokens."""
    from gambit_search.bench_frontier import frontier_gaps, line_at

    assert line_at([(4000, 98.0), (16000, 100.0)], 8000) == pytest.approx(99.0)
    assert line_at([(4000, 98.0), (16000, 100.0)], 1e6) == 100.0  # held at its last point
    table = [_row("d", "bon", 8, 0.60, 1000), _row("d", "bon", 64, 1.00, 8000),
             _row("d", "gambit", 8, 0.70, 900), _row("d", "gambit", 32, 0.98, 4000),
             _row("d", "gambit", 128, 1.00, 16000), _row("d", "sc", 8, 0.5, 1000)]
    (g,) = frontier_gaps(table)  # sc has one budget: no line, no check
    assert g["method"] == "gambit" and not g["on_or_above"]
    assert g["worst_gap"] == pytest.approx(-1.0) and g["at_tokens"] == 8000
    assert g["from_tokens"] == 1000  # BoN's first point: Gambit's line starts left of it
    # one more Gambit point at BoN's top budget lifts the line: on or above everywhere
    (g,) = frontier_gaps(table + [_row("d", "gambit", 64, 1.00, 7000)])
    assert g["on_or_above"] and g["worst_gap"] >= 0
    assert frontier_gaps(table, reference="step") == []  # no such method: nothing checked


def test_frontier_gap_starts_at_the_later_first_point():
    """A method whose cheapest point costs more than the reference's is checked from there,
    and a method that is below at its first point fails there."""
    from gambit_search.bench_frontier import frontier_gaps

    table = [_row("d", "bon", 8, 0.50, 1000), _row("d", "bon", 16, 0.70, 2000),
             _row("d", "x", 8, 0.55, 1500), _row("d", "x", 16, 0.90, 3000)]
    (g,) = frontier_gaps(table)
    assert g["from_tokens"] == 1500
    # BoN at 1,500 tokens: 50 + 20 * log(1.5) / log(2) = 61.7, above x's 55
    assert g["at_tokens"] == 1500 and g["worst_gap"] == pytest.approx(55 - 61.699, abs=0.01)
