"""The front end's own layering, checked on its source: every import inside ``tvm_fusion_ext/frontend``
(module-level or inside a function) goes to a lower layer of this list, so there is no import circle, hidden in a
function or not; outside the front end it imports only the package's errors."""

from __future__ import annotations

import ast
import pathlib

import pytest

FRONTEND = pathlib.Path(__file__).resolve().parents[2] / "tvm_fusion_ext" / "frontend"

#: lowest first; a module belongs to the longest prefix listed (relative to ``tvm_fusion_ext.frontend``)
LAYERS = [
    ("errors",),                                  # Unsupported, NodeImportError, the package's errors re-exported
    ("dims", "symbolic_values"),                  # input dims and their ranges; values of size computations
    ("converters.common",),                       # what the converter families share
    # one module per op family: none imports another
    ("converters.arith", "converters.reductions", "converters.shape", "converters.reshape", "converters.slice",
     "converters.pad", "converters.normalization", "converters.attention", "converters.rotary", "converters.signal",
     "converters.quantization", "converters.vision", "converters.control_flow"),
    ("converters",),                              # the one table, assembled from the families
    ("ort_contrib",),                             # ONNX Runtime's com.microsoft ops
    ("checks",),                                  # refusals before importing
    ("importer",),                                # load_onnx
    ("sample_inputs",),                           # inputs made up from a model's signature (calibration, benches)
    ("decode_inputs",),                           # a KV-cache decoder's step, from its input names
    ("",),                                        # the package: its public names
]


def _name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(FRONTEND).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _layer(module: str) -> int:
    best = None
    for level, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            hit = module == prefix or (prefix and module.startswith(prefix + ".")) or (not prefix and not module)
            if hit and (best is None or len(prefix) > len(best[1])):
                best = (level, prefix)
    assert best is not None, f"frontend module {module!r} has no layer in {__file__}"
    return best[0]


def _resolves(name: str) -> bool:
    p = FRONTEND.joinpath(*name.split(".")) if name else FRONTEND
    return p.with_suffix(".py").is_file() or (p / "__init__.py").is_file()


def _imports(path: pathlib.Path):
    """Every import of ``path``, as (a front-end module relative to the front end, or None for one outside it,
    the absolute name)."""
    module = _name(path)
    package = ["tvm_fusion_ext", "frontend"] + (module.split(".") if module else [])
    if path.name != "__init__.py":
        package = package[:-1]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                target = package[: len(package) - (node.level - 1)] + ([node.module] if node.module else [])
            elif (node.module or "").startswith("tvm_fusion_ext"):
                target = node.module.split(".")
            else:
                continue
            for alias in node.names:  # "from . import arith" imports a module, "from .common import f" imports common
                full = ".".join(target + [alias.name])
                yield from _classify(full if _is_module(full) else ".".join(target))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("tvm_fusion_ext"):
                    yield from _classify(alias.name)


def _is_module(full: str) -> bool:
    return full.startswith("tvm_fusion_ext.frontend.") and _resolves(full[len("tvm_fusion_ext.frontend."):])


def _classify(full: str):
    if full == "tvm_fusion_ext.frontend" or full.startswith("tvm_fusion_ext.frontend."):
        yield full[len("tvm_fusion_ext.frontend."):] if "." in full[len("tvm_fusion_ext."):] else "", full
    else:
        yield None, full


MODULES = sorted(FRONTEND.rglob("*.py"))


@pytest.mark.parametrize("path", MODULES, ids=[_name(p) or "__init__" for p in MODULES])
def test_frontend_imports_only_go_down(path):
    module, bad = _name(path), []
    for target, full in _imports(path):
        if target is None:
            if full != "tvm_fusion_ext.errors":
                bad.append(f"imports {full} (outside the front end: only tvm_fusion_ext.errors)")
            continue
        if not _resolves(target):
            bad.append(f"imports {full}, which does not exist")
        elif target != module and not _layer(target) < _layer(module):
            bad.append(f"(layer {_layer(module)}) imports {target} (layer {_layer(target)})")
    assert not bad, f"frontend.{module or '__init__'}: " + "; ".join(bad)


def test_frontend_errors_module_imports_nothing_else_from_the_front_end():
    assert [t for t, _ in _imports(FRONTEND / "errors.py") if t is not None] == []


def test_public_names():
    import tvm_fusion_ext
    from tvm_fusion_ext.frontend import input_names, input_specs, load_onnx, output_names, parse_shape_arg

    assert tvm_fusion_ext.load_onnx is load_onnx
    assert all(callable(f) for f in (input_names, input_specs, output_names, parse_shape_arg))
