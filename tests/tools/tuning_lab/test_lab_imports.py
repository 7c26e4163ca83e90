"""The tuning lab's layering: no import circle among its modules (imports inside functions counted), and the
tuner reached through public names only."""

import ast
import pathlib

import tvm_fusion_ext.tools.tuning_lab as lab

LAB = pathlib.Path(lab.__file__).parent


def _imports(path: pathlib.Path):
    """(module, names) for every ``from`` import in the file, resolved to dotted names inside the package."""
    package = ["tvm_fusion_ext", "tools", "tuning_lab"]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            yield module, [a.name for a in node.names]


def test_lab_modules_import_without_a_circle():
    graph = {}
    for path in LAB.glob("*.py"):
        deps = set()
        for module, names in _imports(path):
            if module.startswith("tvm_fusion_ext.tools.tuning_lab."):
                deps.add(module.rsplit(".", 1)[1])
            elif module == "tvm_fusion_ext.tools.tuning_lab":
                deps.update(names)
        graph[path.stem] = deps & {p.stem for p in LAB.glob("*.py")}
    state = {}

    def visit(node, stack):
        state[node] = "open"
        for dep in sorted(graph[node]):
            assert state.get(dep) != "open", f"import circle: {' -> '.join(stack + [node, dep])}"
            if dep not in state:
                visit(dep, stack + [node])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [])


def test_lab_uses_only_public_names_of_the_tuner():
    private = [(path.name, module, name) for path in LAB.glob("*.py") for module, names in _imports(path)
               if module.startswith("tvm_fusion_ext.") and not module.startswith("tvm_fusion_ext.tools.tuning_lab")
               for name in names if name.startswith("_")]
    assert private == []
    for path in LAB.glob("*.py"):
        assert "driver._" not in path.read_text(encoding="utf-8"), path.name


def test_one_entry_dispatches_to_the_lab_commands(capsys):
    from tvm_fusion_ext.tools.tuning_lab.__main__ import main

    assert main(["pool", "info", "/nonexistent.npz"]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["tune-everything"]) == 2
    assert "unknown tuning-lab command 'tune-everything'" in capsys.readouterr().err
    assert main(["--help"]) == 0 and "pool" in capsys.readouterr().out
