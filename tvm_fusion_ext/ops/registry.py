"""How a fused operator is defined, and how fusion rules put one into a Relax graph.

An operator is a TE compute definition plus the names of its tensor inputs. Fusion rules call
:func:`call_op`, which turns the compute into a PrimFunc and emits ``R.call_tir`` to it. The PrimFunc carries
what it is (``tfx.op``) and its parameters (``tfx.params``, JSON), so the build path can recognise our kernels,
re-derive them for a target (weight pre-packing, dtypes) and pick their schedule templates, without guessing
from names.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Callable, Dict, Optional, Sequence

import numpy as np

import tvm
from tvm import relax, te

#: PrimFunc attribute keys (public: the build path and tests read them)
ATTR_OP = "tfx.op"
ATTR_PARAMS = "tfx.params"
ATTR_INPUTS = "tfx.inputs"

# kOpaque: keeps FuseOps from merging neighbours into our kernels, so the PrimFunc the tuner sees is exactly
# the one the operator defines (stable task keys, templates that know their blocks).
_OP_PATTERN_OPAQUE = 8


@dataclass(frozen=True)
class OpSpec:
    name: str
    inputs: Sequence[str]  # input names in call order; optional inputs may be absent from a call
    # compute(**present_inputs_as_te_tensors, **params) -> te.Tensor, or a list of them (a call of the operator
    # is then a tuple, in that order)
    compute: Callable[..., te.Tensor]


_REGISTRY: Dict[str, OpSpec] = {}


def register_op(name: str, inputs: Sequence[str]):
    """Decorator for an operator's TE compute definition."""

    def wrap(fn):
        _REGISTRY[name] = OpSpec(name, tuple(inputs), fn)
        return fn

    return wrap


def get_op(name: str) -> OpSpec:
    _load_ops()
    if name not in _REGISTRY:
        raise KeyError(f"unknown fused operator '{name}' (known: {sorted(_REGISTRY)})")
    return _REGISTRY[name]


def _load_ops():
    # every sibling module registers its operator on import
    import importlib
    import pkgutil

    package = __name__.rsplit(".", 1)[0]
    for info in pkgutil.iter_modules(importlib.import_module(package).__path__):
        if info.name != "registry":
            importlib.import_module(f"{package}.{info.name}")


def make_prim_func(name: str, input_types: Dict[str, relax.TensorType], params: dict) -> tvm.tirx.PrimFunc:
    """The operator's PrimFunc for these input types and parameters (no schedule)."""
    return _make(name, input_types, params)[0]


def _make(name: str, input_types: Dict[str, relax.TensorType], params: dict):
    spec = get_op(name)
    present = [n for n in spec.inputs if n in input_types]
    # Symbolic dims (batch, sequence) stay TIR variables, bound by the PrimFunc from its buffers' shapes, and
    # then every index is int64 like them. A static operator keeps int32 sizes: the PrimFunc is then exactly
    # the one tuning records were made for (they match kernels by structure).
    symbolic = any(not isinstance(d, tvm.tirx.IntImm) for n in present for d in input_types[n].shape.values)
    placeholders = {}
    for n in present:
        ty = input_types[n]
        shape = [d if symbolic else int(d) for d in ty.shape.values]
        placeholders[n] = te.placeholder(shape, str(ty.dtype), name=n)
    out = spec.compute(**placeholders, **params)
    outs = list(out) if isinstance(out, (list, tuple)) else [out]
    unbound = unbound_dims([placeholders[n] for n in present] + outs)
    func = te.create_prim_func([placeholders[n] for n in present] + unbound + outs)
    attrs = {
        ATTR_OP: name,
        ATTR_PARAMS: json.dumps(params, sort_keys=True),
        ATTR_INPUTS: ",".join(present),
        "op_pattern": _OP_PATTERN_OPAQUE,
    }
    func = func.without_attr("global_symbol") if "global_symbol" in func.attrs else func
    for k, v in attrs.items():
        func = func.with_attr(k, v)
    types = [relax.TensorType([int(d) if isinstance(d, tvm.tirx.IntImm) else d for d in o.shape], str(o.dtype))
             for o in outs]
    return func, (types if isinstance(out, (list, tuple)) else types[0]), unbound


def unbound_dims(tensors) -> list:
    """Size variables used in the tensors' shapes that no shape has as a dim of its own: a kernel reading
    ``x [batch · seq, K]`` (GPT-2's Conv1D flattens its rows before the matmul) cannot bind ``batch`` and ``seq``
    from its buffers, so they are passed as scalar parameters after the inputs, as Relax's ``call_te`` does."""
    used, bound = {}, set()
    for t in tensors:
        for d in t.shape:
            if isinstance(d, tvm.tirx.Var):
                bound.add(d)
            for v in tvm.tirx.analysis.undefined_vars(d):
                used.setdefault(v, None)
    return sorted((v for v in used if v not in bound), key=lambda v: v.name)


def call_op(bb: relax.BlockBuilder, name: str, inputs: Dict[str, Optional[relax.Expr]], params: dict,
            name_hint: Optional[str] = None) -> relax.Call:
    """``R.call_tir`` of operator ``name`` on ``inputs`` (entries that are None are left out); a tuple when the
    operator has several outputs."""
    spec = get_op(name)
    args = [inputs[n] for n in spec.inputs if inputs.get(n) is not None]
    types = {n: inputs[n].ty for n in spec.inputs if inputs.get(n) is not None}
    func, out_ty, unbound = _make(name, types, params)
    gv = bb.add_func(func, name_hint or _hint(name, params))
    return relax.call_tir(gv, args + unbound, out_ty)


@dataclass(frozen=True)
class OperatorCall:
    """One call of a fused operator in a Relax function, as the compile path shows it to schedule templates.

    ``inputs`` are the present inputs by name; ``constant(name)`` is an input's value when it is a compile-time
    constant (looked up through variable bindings), else None. Templates answer with :meth:`replace`."""

    op: str
    inputs: Dict[str, relax.Expr]
    params: dict
    constants: Dict[str, np.ndarray] = field(default_factory=dict)

    def constant(self, name: str) -> Optional[np.ndarray]:
        return self.constants.get(name)

    def replace(self, inputs: Optional[Dict[str, relax.Expr]] = None, params: Optional[dict] = None) -> "OperatorCall":
        """The same call with some inputs replaced and/or new parameters."""
        return replace(self, inputs={**self.inputs, **(inputs or {})}, params=dict(params or self.params),
                       constants={k: v for k, v in self.constants.items() if k not in (inputs or {})})


def op_of(func) -> Optional[str]:
    """The fused-operator name of a PrimFunc, or None when it is not one of ours."""
    if func.attrs is None or ATTR_OP not in func.attrs:
        return None
    return str(func.attrs[ATTR_OP])


def params_of(func) -> dict:
    return json.loads(str(func.attrs[ATTR_PARAMS]))


def inputs_of(func) -> list:
    return str(func.attrs[ATTR_INPUTS]).split(",")


def _hint(name: str, params: dict) -> str:
    act = params.get("act")
    return f"{name}_{act}" if act and act != "none" else name
