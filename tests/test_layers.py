"""The package's layering, checked on its source: every import (module-level or inside a function) goes to the
same layer or a lower one, nothing imports ``testing``, imports have no cycle (module-level or inside functions),
and the runtime-only floor (``deploy``) imports nothing that compiles."""

from __future__ import annotations

import ast
import pathlib
from collections import defaultdict

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "tvm_fusion_ext"

#: lowest first; a module belongs to the longest prefix listed
LAYERS = [
    ("errors", "fileio", "targets", "tir_nodes", "deploy"),
    ("frontend", "ops", "records"),
    ("transform", "schedules"),
    ("compile",),
    ("runtime", "tune"),
    ("models",),
    # the tuning lab (tools.tuning_lab: pools built from models, replay, compare) sits with the other tools
    ("tools",),
    ("cli",),
]
TOP_LEVEL = {"__init__", "testing"}  # the lazy public surface and the test helpers: may import anything


def _module_name(path: pathlib.Path) -> str:
    rel = path.relative_to(PACKAGE).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts = parts[:-1]
    return ".".join(parts)


def _layer(module: str):
    best = None
    for level, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and (best is None or len(prefix) > len(best[1])):
                best = (level, prefix)
    return None if best is None else best[0]


def _imports(path: pathlib.Path, module: str):
    """(imported package module, is it at module level) for every import of a package module in ``path``."""
    tree = ast.parse(path.read_text())
    base = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    top_level = {id(n) for n in tree.body}
    for node in ast.walk(tree):
        top = id(node) in top_level
        if isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = base[: len(base) - (node.level - 1)]
                target = ".".join(anchor + ([node.module] if node.module else []))
            elif (node.module or "").startswith("tvm_fusion_ext"):
                target = node.module[len("tvm_fusion_ext"):].lstrip(".")
            else:
                continue
            for alias in node.names:  # "from .. import records" imports a module, "from .x import f" imports x
                sub = f"{target}.{alias.name}" if target else alias.name
                name = sub if _resolves(sub) else target
                if name:
                    yield name, top
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("tvm_fusion_ext."):
                    yield alias.name[len("tvm_fusion_ext."):], top


def _resolves(name: str) -> bool:
    if not name:
        return False
    p = PACKAGE.joinpath(*name.split("."))
    return p.with_suffix(".py").is_file() or (p / "__init__.py").is_file()


def _modules():
    return {(_module_name(p)): p for p in PACKAGE.rglob("*.py")}


def test_every_module_has_a_layer():
    missing = [m for m in _modules() if m.split(".")[0] not in TOP_LEVEL and _layer(m) is None]
    assert not missing, f"modules outside every layer: {missing}"


def test_every_package_import_resolves():
    """A stale relative import fails only when its function runs: catch it here."""
    bad = [f"{m} imports {x}" for m, p in _modules().items() for x, _ in _imports(p, m)
           if not _resolves(x) and x.split(".")[0] not in TOP_LEVEL]
    assert not bad, "\n".join(bad)


def test_no_import_goes_up_a_layer():
    bad = []
    for module, path in _modules().items():
        if module.split(".")[0] in TOP_LEVEL:
            continue
        for target, _ in _imports(path, module):
            if target.split(".")[0] == "testing":
                bad.append(f"{module} imports testing")
                continue
            if target.split(".")[0] in TOP_LEVEL or target == "":
                continue
            if _layer(target) is not None and _layer(target) > _layer(module):
                bad.append(f"{module} (layer {_layer(module)}) imports {target} (layer {_layer(target)})")
    assert not bad, "\n".join(bad)


def _import_graph(module_level_only: bool) -> dict:
    """module → the package modules it imports (with ``module_level_only``, at module level only). A package's
    import of its own submodules (``__init__`` re-exports) is left out: it is how a package is built, not a
    circle."""
    graph = defaultdict(set)
    modules = _modules()
    for module, path in modules.items():
        for target, top in _imports(path, module):
            if (top or not module_level_only) and target in modules and target != module \
                    and not target.startswith(module + "."):
                graph[module].add(target)
    return graph


def _cycles(graph: dict) -> list:
    """The import circles of ``graph``: its strongly connected components of more than one module, each sorted."""
    index, low, on_stack, stack, out = {}, {}, set(), [], []

    def visit(m):  # Tarjan's algorithm
        index[m] = low[m] = len(index)
        stack.append(m)
        on_stack.add(m)
        for n in sorted(graph.get(m, ())):
            if n not in index:
                visit(n)
                low[m] = min(low[m], low[n])
            elif n in on_stack:
                low[m] = min(low[m], index[n])
        if low[m] == index[m]:
            component = []
            while True:
                n = stack.pop()
                on_stack.discard(n)
                component.append(n)
                if n == m:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for m in sorted(graph):
        if m not in index:
            visit(m)
    return sorted(out)


def test_no_module_level_import_cycle():
    cycles = _cycles(_import_graph(module_level_only=True))
    assert not cycles, f"module-level import cycles: {cycles}"


def test_no_import_cycle():
    """Imports inside functions count too: a circle deferred into a function body is still two modules that
    each need the other (and cannot be understood, tested or moved apart)."""
    cycles = _cycles(_import_graph(module_level_only=False))
    assert not cycles, "import cycles (module-level or inside functions):\n" + "\n".join(" <-> ".join(c)
                                                                                       for c in cycles)


@pytest.mark.parametrize("module", sorted(m for m in _modules() if m == "deploy" or m.startswith("deploy.")))
def test_deploy_imports_nothing_that_compiles(module):
    """The artifact loader runs where only TVM's runtime exists: no relax, tirx, te, s_tir, onnx."""
    tree = ast.parse(_modules()[module].read_text())
    heavy = ("tvm.relax", "tvm.tirx", "tvm.te", "tvm.s_tir", "tvm.target", "onnx", "tvm.script")
    bad = []
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names = [node.module or ""] + [f"{node.module}.{a.name}" for a in node.names]
        bad += [n for n in names if n.startswith(heavy)]
    assert not bad, f"{module} imports {bad}"
