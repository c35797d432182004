"""The package graph runs one way (docs/ARCHITECTURE.md), read from the source.

Every ``import`` of every module counts, those inside functions included. Layers, bottom up:
``gambit_core`` < ``gambit_scorer`` < ``gambit_search`` < ``data_pipelines`` < the apps (the
console scripts' modules, :data:`APPS`, which live in the folders of the libraries they drive);
a module may import its own layer and those below. No two modules may import each other,
directly or around a circle.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LAYERS = ["gambit_core", "gambit_scorer", "gambit_search", "data_pipelines"]
APPS = ("data_pipelines.harvest", "gambit_search.solve", "gambit_search.serve",
        "gambit_search.bench", "gambit_search.bench_frontier", "gambit_search.bench_plots",
        "gambit_search.bench_tables")
"""The applications layer, above every library: gambit-harvest, -solve, -serve and -bench (a
name covers its submodules). gambit-train is Hydra's ``gambit_scorer.train``, in its layer."""


def layer(module: str) -> int:
    """``module``'s layer: its package's index in :data:`LAYERS`, or one above them all for
    an app."""
    if any(module == a or module.startswith(a + ".") for a in APPS):
        return len(LAYERS)
    return LAYERS.index(module.split(".")[0])


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in LAYERS:
        for p in (REPO / pkg).rglob("*.py"):
            parts = list(p.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = p
    return out


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The repo modules that ``name`` imports (``from a import b``: ``a.b`` when it is a
    module, else ``a``)."""
    is_pkg = path.name == "__init__.py"
    here = name.split(".") if is_pkg else name.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = here[: len(here) - (node.level - 1)]
                base = ".".join(up + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                       for a in node.names]
        for t in targets:
            while t and t not in modules:  # "a.b.C" (a class): the module "a.b"
                t = t.rpartition(".")[0]
            if t and t != name:
                found.add(t)
    return found


def _graph(mods: dict[str, Path] | None = None) -> dict[str, set[str]]:
    """{module: the repo modules it imports} over ``mods`` (None: every module of the repo)."""
    mods = _modules() if mods is None else mods
    return {m: _imports(m, p, mods) for m, p in mods.items()}


def upward_imports(g: dict[str, set[str]]) -> list[str]:
    """``"a -> b"`` for each import in ``g`` that runs up a layer."""
    return sorted(f"{m} -> {t}" for m, ts in g.items() for t in ts if layer(t) > layer(m))


def circles(g: dict[str, set[str]]) -> list[list[str]]:
    """The import circles of ``g``: its strongly connected components of more than one
    module (Tarjan's), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(g.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return found


def test_the_graph_is_read_from_every_package():
    g = _graph()
    assert {m.split(".")[0] for m in g} == set(LAYERS)
    # a function-level import is seen (gambit_search.solve.run imports the scorer lazily)
    assert "gambit_scorer.checkpoint" in g["gambit_search.solve.run"]
    assert "gambit_core.questions" in g["data_pipelines.toy.task"]


def test_no_import_runs_up_a_layer():
    assert upward_imports(_graph()) == []


def test_no_module_circles():
    assert circles(_graph()) == []


def test_the_apps_are_the_top_layer():
    """Each console script's module is an app, and the apps' layer is above every library
    (an import of an app from a library is upward: planted below)."""
    import tomllib

    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    for name, target in scripts.items():
        mod = target.split(":")[0]
        assert layer(mod) == (len(LAYERS) if name != "gambit-train" else 1), name
    g = {"data_pipelines.toy.evaluate": {"data_pipelines.harvest"},
         "gambit_search.driver": {"gambit_search.solve.config"},
         "gambit_search.bench": {"gambit_search.solve.run", "data_pipelines.toy.task"}}
    assert upward_imports(g) == ["data_pipelines.toy.evaluate -> data_pipelines.harvest",
                                 "gambit_search.driver -> gambit_search.solve.config"]


def test_the_checks_see_a_planted_circle_and_upward_import(tmp_path):
    """The checks are not blind: on a planted fixture the same functions that check the repo
    find its circle (a -> b -> a, one import inside a function) and its upward import."""
    mods = {"gambit_core.a": tmp_path / "a.py", "gambit_core.b": tmp_path / "b.py",
            "gambit_search.c": tmp_path / "c.py", "gambit_search.d": tmp_path / "d.py"}
    mods["gambit_core.a"].write_text("def f():\n    from gambit_core import b\n")
    mods["gambit_core.b"].write_text("import gambit_core.a\nfrom gambit_search.c import X\n")
    mods["gambit_search.c"].write_text("X = 1\n")
    mods["gambit_search.d"].write_text("from gambit_core.a import f\nimport gambit_search.c\n")
    g = _graph(mods)
    assert g["gambit_core.a"] == {"gambit_core.b"}
    assert g["gambit_core.b"] == {"gambit_core.a", "gambit_search.c"}
    assert upward_imports(g) == ["gambit_core.b -> gambit_search.c"]
    assert circles(g) == [["gambit_core.a", "gambit_core.b"]]
    clean = {m: ts - {"gambit_search.c", "gambit_core.a"} for m, ts in g.items()}
    assert upward_imports(clean) == [] and circles(clean) == []  # and nothing else
