"""The package's import graph, read from the source with ``ast`` (ARCHITECTURE.md, "Layers").

Every ``import`` statement is an edge, at module level or inside a function (a function-level
import still makes its module depend on the other one; it only hides the dependency from the
reader). Modules are grouped into layers: the shared helpers, the pure domains ``routing`` and
``sim``, ``rl``, the chains above them, the Dagster layer and the Definitions. The rules:

* no layer imports one that imports it back (no cycle), and the failure names the cycle with
  the file and line of every import on it;
* dependencies point one way, down: ``definitions`` -> ``defs`` -> chains -> ``rl`` ->
  ``sim`` and ``routing`` -> the decision levers -> ``sage`` (SAGE's formats) -> the ledger's
  core (``decisions``) -> shared helpers (``sim`` reuses ``routing``'s reward and catalogue, never
  the reverse; a module may sit in another layer than its package: :data:`SUBLAYERS`);
* nothing outside ``defs`` and the Definitions modules imports dagster.

Imports by name at run time (``importlib.import_module`` with a string) are not statements and
are not read: ``rl.checkpoint`` loads ``sim.obs`` that way, a downward edge.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE = "sage_pipeline"
ROOT = Path(__file__).resolve().parents[1] / PACKAGE

# layer -> rank: a module may import its own layer or a layer of lower rank only
RANKS = {
    "artifacts": 0, "markdown": 0, "errors": 0, PACKAGE: 0,  # the shared helpers (and the package's __init__)
    "untrusted": 0,  # the guard for files the project did not write: a shared helper, standard library only
    # the decision ledger's core (anytime-valid evidence, the ledger, the recorded assignment, its report):
    # numpy and the shared helpers only, so SAGE's deployment bundle can carry the ledger and write the
    # launcher, and every lever's chain (sleep, rl, sage_world) can use it
    "decisions": 0.4,
    # SAGE's contract: its formats, read from SAGE's code (table, checkpoint, exploration, bandit
    # state, the deployment bundle); below every domain that reads or writes them
    "sage": 0.5,
    # the levers of the ledger (decisions/coder.py, skills.py, router.py: SUBLAYERS): on the ledger's core
    # and SAGE's contract (the coder lever writes pinned tables), below the chains that run them
    "decision_levers": 0.75,
    "routing": 1,
    "sim": 2,
    "rl": 3,
    "routing_benchmark": 4, "sleep": 4,  # the chains built on the core; none imports another
    "sage_world": 4,  # SAGE in the loop: the model world, the harness, the days (above sim and rl)
    "defs": 5,
    "definitions": 6,
    # defs/celery_definitions.py: the Definitions again, on the Celery executor. It imports
    # sage_pipeline.definitions, so it sits above it (a deployment module; nothing imports it)
    "celery_definitions": 7,
}
DAGSTER_LAYERS = {"defs", "definitions", "celery_definitions"}
# modules that sit in another layer than their package (each with what is under it)
SUBLAYERS = {f"{PACKAGE}.decisions.{lever}": "decision_levers" for lever in ("coder", "skills", "router")}
# Upward edges that exist today and are someone's to move (each must still exist: remove it here
# when its import goes). None: keep it that way.
KNOWN_UPWARD: set[tuple[str, str]] = set()


@dataclass(frozen=True)
class Edge:
    src: str  # importing module
    dst: str  # imported name, resolved to the deepest module that exists
    where: str  # file:line of the import, from the folder holding the package

    def __str__(self) -> str:
        return f"{self.where} imports {self.dst}"


def module_names(root: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` under ``root`` (a package folder)."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _resolve(name: str, modules: dict[str, Path]) -> str:
    """The deepest existing module that ``name`` (a module, or a module's attribute) names."""
    parts = name.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in modules:
            return ".".join(parts[:n])
    return name


def imports_of(module: str, path: Path, modules: dict[str, Path], top: Path) -> list[Edge]:
    """Every import statement in the file, anywhere in it, as edges to resolved names (``top``: the
    folder holding the package, for the file names in messages)."""
    where = path.relative_to(top).as_posix()
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    edges = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            edges += [Edge(module, _resolve(a.name, modules), f"{where}:{node.lineno}") for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            for a in node.names:
                target = f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                edges.append(Edge(module, _resolve(target, modules), f"{where}:{node.lineno}"))
    return list(dict.fromkeys(edges))  # `from m import a, b` of one module is one edge


def import_edges(root: Path) -> list[Edge]:
    modules = module_names(root)
    return [e for m, p in modules.items() for e in imports_of(m, p, modules, root.parent)]


def layer_of(module: str) -> str:
    """``sage_pipeline.rl.bc`` -> ``rl``; ``sage_pipeline.artifacts`` -> ``artifacts``."""
    parts = module.split(".")
    for name, layer in SUBLAYERS.items():
        if module == name or module.startswith(name + "."):
            return layer
    if parts[-1] == "celery_definitions":
        return "celery_definitions"
    return parts[1] if len(parts) > 1 else parts[0]


def layer_graph(edges: list[Edge]) -> dict[tuple[str, str], list[Edge]]:
    """(importing layer, imported layer) -> the imports behind it, between layers of the package."""
    out: dict[tuple[str, str], list[Edge]] = {}
    for e in edges:
        if e.dst.split(".")[0] != PACKAGE:
            continue
        a, b = layer_of(e.src), layer_of(e.dst)
        if a != b:
            out.setdefault((a, b), []).append(e)
    return out


def find_cycles(graph: dict[tuple[str, str], list[Edge]]) -> list[list[str]]:
    """One cycle (``[a, b, ..., a]``) per strongly connected group of layers, shortest first found."""
    nodes = sorted({n for pair in graph for n in pair})
    succ = {n: sorted(b for a, b in graph if a == n) for n in nodes}
    cycles, seen = [], set()
    for start in nodes:
        if start in seen:
            continue
        # breadth-first from start: the shortest way back to it, if any
        parents: dict[str, str] = {}
        frontier = [start]
        while frontier and start not in parents:
            nxt = []
            for n in frontier:
                for m in succ[n]:
                    if m not in parents:
                        parents[m] = n
                        nxt.append(m)
            frontier = nxt
        if start in parents:
            path = [start]
            while True:
                path.append(parents[path[-1]])
                if path[-1] == start:
                    break
            cycle = path[::-1]
            seen.update(cycle)
            cycles.append(cycle)
    return cycles


def describe_cycle(cycle: list[str], graph: dict[tuple[str, str], list[Edge]]) -> str:
    steps = []
    for a, b in zip(cycle[:-1], cycle[1:]):
        behind = graph[(a, b)]
        more = f" (and {len(behind) - 1} more)" if len(behind) > 1 else ""
        steps.append(f"  {a} -> {b}: {behind[0]}{more}")
    return " -> ".join(cycle) + "\n" + "\n".join(steps)


# ------------------------------------------------------------------ the package
@pytest.fixture(scope="module")
def edges() -> list[Edge]:
    return import_edges(ROOT)


def test_every_layer_of_the_package_has_a_rank(edges):
    unranked = sorted({layer_of(m) for m in module_names(ROOT)} - set(RANKS))
    assert not unranked, (f"{unranked}: new top-level modules or packages of {PACKAGE}; give each a rank in "
                          f"{Path(__file__).name}'s RANKS (where it sits in ARCHITECTURE.md's layers)")


def test_no_layer_imports_one_that_imports_it_back(edges):
    graph = layer_graph(edges)
    cycles = find_cycles(graph)
    assert not cycles, "import cycles between layers of the package:\n" + "\n".join(
        describe_cycle(c, graph) for c in cycles)


def test_dependencies_point_down_the_layers(edges):
    up = [e for (a, b), behind in layer_graph(edges).items() if RANKS.get(b, 0) >= RANKS.get(a, 0)
          for e in behind]
    unexpected = [e for e in up if (e.src, e.dst) not in KNOWN_UPWARD]
    assert not unexpected, ("imports against ARCHITECTURE.md's direction (definitions -> defs -> chains -> rl -> "
                            "sim, routing -> shared helpers):\n" + "\n".join(
                                f"  {layer_of(e.src)} -> {layer_of(e.dst)}: {e}" for e in unexpected))
    gone = KNOWN_UPWARD - {(e.src, e.dst) for e in up}
    assert not gone, f"{sorted(gone)} no longer import upward: remove them from KNOWN_UPWARD"


def test_nothing_outside_the_dagster_layer_imports_dagster(edges):
    bad = [e for e in edges if e.dst.split(".")[0].startswith("dagster") and layer_of(e.src) not in DAGSTER_LAYERS]
    assert not bad, "dagster imported outside defs/ and the Definitions modules:\n" + "\n".join(f"  {e}" for e in bad)


# ------------------------------------------------------------------ the checker itself
def _write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root / PACKAGE


def test_a_cycle_through_a_function_level_import_is_found_and_named(tmp_path):
    root = _write(tmp_path, {
        f"{PACKAGE}/__init__.py": "",
        f"{PACKAGE}/routing/__init__.py": "",
        f"{PACKAGE}/routing/collector.py": "def f():\n    from sage_pipeline.rl.policy import sample_actions\n",
        f"{PACKAGE}/rl/__init__.py": "",
        f"{PACKAGE}/rl/policy.py": "from sage_pipeline.routing import collector\nfrom . import data\n",
        f"{PACKAGE}/rl/data.py": "import numpy\n",
    })
    graph = layer_graph(import_edges(root))
    assert set(graph) == {("routing", "rl"), ("rl", "routing")}  # rl.policy -> rl.data stays inside rl
    [cycle] = find_cycles(graph)
    text = describe_cycle(cycle, graph)
    assert cycle in (["rl", "routing", "rl"], ["routing", "rl", "routing"])
    assert "sage_pipeline/routing/collector.py:2 imports sage_pipeline.rl.policy" in text
    assert "sage_pipeline/rl/policy.py:1 imports sage_pipeline.routing.collector" in text


def test_relative_and_package_imports_resolve_to_modules(tmp_path):
    root = _write(tmp_path, {
        f"{PACKAGE}/__init__.py": "",
        f"{PACKAGE}/artifacts.py": "",
        f"{PACKAGE}/sim/__init__.py": "from .env import Env\n",
        f"{PACKAGE}/sim/env.py": "from ..artifacts import write\nfrom sage_pipeline import artifacts as a\n",
        f"{PACKAGE}/sim/obs/__init__.py": "from ...sim import env\n",
    })
    got = {(e.src, e.dst) for e in import_edges(root)}
    assert got == {("sage_pipeline.sim", "sage_pipeline.sim.env"),
                   ("sage_pipeline.sim.env", "sage_pipeline.artifacts"),
                   ("sage_pipeline.sim.obs", "sage_pipeline.sim.env")}


def test_no_cycle_when_imports_only_point_down(tmp_path):
    root = _write(tmp_path, {
        f"{PACKAGE}/__init__.py": "",
        f"{PACKAGE}/routing/__init__.py": "",
        f"{PACKAGE}/routing/policy.py": "from sage_pipeline import markdown\n",
        f"{PACKAGE}/markdown.py": "",
        f"{PACKAGE}/rl/__init__.py": "from sage_pipeline.routing.policy import Policy\n",
    })
    assert find_cycles(layer_graph(import_edges(root))) == []
