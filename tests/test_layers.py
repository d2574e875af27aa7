"""The package layers of numdev import downward only, and no modules import each other in a cycle.

Read from the source (every `import` and `from ... import`, at the top of a module or inside a
function: a deferred import is still a dependency). A newcomer can read the tree bottom-up:

    numerics, stats      float formats and stage presets; intervals, verdict rules, growth fits
    runs                 the run directory: layout, records, schemas, lock, provenance, atomic files
    cli                  how a command talks to the user: errors, printed commands, logs, workers, launcher
    config               the config schema, groups, resolvers, the checks before Hydra runs
    kernels              the Triton kernel and the emulator's C kernels (kernels/, installed as numdev.kernels)
    attention, gemm      the operations under study (backends, emulators, kernels)
    models, data, diffusion, optimizations, weights
    figures              every figure: aggregation, plot, claim and verdict rule
    bench, train         the two apps' work: microbenchmark sweeps, training runs
    analysis             studies and comparisons over finished runs
    report               the HTML report and the generated doc blocks
    cli.demo             numdev-demo, which drives every app

A module may import from its own package or from a lower layer; packages that share a layer do not
import each other.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
KERNELS = Path(__file__).resolve().parents[1] / "kernels"

LAYERS = [
    ("numerics", "stats"),
    ("runs",),
    ("cli",),
    ("config",),
    ("kernels",),
    ("attention", "gemm"),
    ("models", "data", "diffusion", "optimizations", "weights"),
    ("figures",),
    ("bench", "train"),
    ("analysis",),
    ("report",),
    ("cli.demo",),
]
LEVEL = {unit: level for level, units in enumerate(LAYERS) for unit in units}


def modules() -> dict[str, Path]:
    found = {}
    for path in SRC.rglob("*.py"):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    for path in KERNELS.glob("*.py"):
        name = "numdev.kernels" if path.stem == "__init__" else f"numdev.kernels.{path.stem}"
        found[name] = path
    return found


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The numdev modules `name` imports (an imported name that is a module counts as that module)."""

    def resolve(dotted: str) -> str | None:
        while dotted and dotted not in known:
            dotted = dotted.rpartition(".")[0]
        return dotted or None

    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(resolve(alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            for alias in node.names:
                found.add(resolve(f"{base}.{alias.name}") or resolve(base))
    return {m for m in found if m and m != name and m.split(".")[0] in ("numdev", "hydra_plugins")}


def unit(module: str) -> str | None:
    """The layer unit of a module: numdev.cli.demo, else its top package under numdev (None: the root)."""
    parts = module.split(".")
    if parts[0] == "hydra_plugins":
        return "config"  # numdev's Hydra plugins (the launcher, the search path), where Hydra looks for them
    if module.startswith("numdev.cli.demo"):
        return "cli.demo"
    return parts[1] if len(parts) > 1 else None


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(name, path, known) for name, path in known.items()}


def test_every_package_has_a_layer(graph):
    missing = sorted({unit(m) for m in graph} - set(LEVEL) - {None})
    assert not missing, f"packages with no layer in tests/test_layers.py: {missing}"


def test_imports_point_downward(graph):
    upward = []
    for importer, imported in graph.items():
        a = unit(importer)
        for target in imported:
            b = unit(target)
            if a is None or b is None or a == b:  # the root package (its version, resolvers); within one package
                continue
            if LEVEL[b] > LEVEL[a] or (LEVEL[b] == LEVEL[a] and not (a == "cli.demo" or b == "cli.demo")):
                upward.append(f"{importer} -> {target}")
    assert not upward, "imports that point up or sideways:\n" + "\n".join(sorted(upward))


def test_no_cycles(graph):
    """Tarjan's strongly connected components over modules: any component of two or more is a cycle."""
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert not cycles, f"modules that import each other in a cycle: {cycles}"


def test_the_check_can_fail(graph):
    """The rule catches what it is for: an upward import planted into a copy of the graph."""
    planted = {k: set(v) for k, v in graph.items()}
    planted["numdev.numerics.formats"].add("numdev.report.app")
    with pytest.raises(AssertionError, match="numdev.numerics.formats -> numdev.report.app"):
        test_imports_point_downward(planted)
    planted = {k: set(v) for k, v in graph.items()}
    planted["numdev.stats.intervals"].add("numdev.stats.verdicts")  # verdicts imports intervals
    with pytest.raises(AssertionError, match="cycle"):
        test_no_cycles(planted)
