"""Reading a Relax function as a graph: bindings, users, operators, shapes and constants.

Every rule, canonicalisation and the engine itself ask the same few questions of a function ("what is this
variable bound to", "who reads it", "which operator is this call", "what is its shape", "is it a constant");
they are answered here once.

Shapes come in two strengths. :func:`static_shape` gives ``[int, ...]`` or ``None`` (what today's rules
check against). :func:`shape_dims` keeps symbolic dimensions as ``PrimExpr`` (batch or sequence as TIR
variables), so a rule that only needs to compare dimensions can accept a symbolic shape with
:func:`same_dim` instead of refusing it.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Dict, Iterator, List, Optional, Sequence, Set, Tuple, Union

import numpy as np
import tvm
import tvm_ffi
from tvm import relax

#: a dimension as rules see it: an ``int`` when static, the TIR expression (``PrimExpr``) otherwise
Dim = Union[int, tvm.tirx.Expr]


# ---------------------------------------------------------------------------------------------------
# bindings and users
# ---------------------------------------------------------------------------------------------------

def bound_value(e: relax.Expr, var2val) -> relax.Expr:
    """``e`` with variable bindings (``a = b`` aliases included) looked through to the bound value."""
    while isinstance(e, relax.Var) and e in var2val:
        e = var2val[e]
    return e


def binding_chain(e: relax.Expr, var2val) -> List[relax.Var]:
    """The bound variables met when looking through ``e`` to its value: ``e`` itself, then any aliases."""
    out = []
    while isinstance(e, relax.Var) and e in var2val:
        out.append(e)
        e = var2val[e]
    return out


class FunctionGraph:
    """One Relax function, indexed once for the questions matchers and the engine ask of it."""

    def __init__(self, func: relax.Function, module: Optional[tvm.IRModule] = None):
        self.func = func
        #: the module the function lives in, when known: lets a matcher look at a ``call_tir``'s callee
        self.module = module
        #: var -> bound value (a TVM map: dpl patterns read it directly)
        self.var2val = relax.analysis.get_var2val(func)
        self._val2var = {val: var for var, val in self.var2val.items()}
        self._users: Dict[relax.Var, Set[Optional[relax.Var]]] = defaultdict(set)
        #: var -> (index of its block, index of its binding in that block)
        self.position: Dict[relax.Var, Tuple[int, int]] = {}
        for i, block in enumerate(func.body.blocks):
            for j, b in enumerate(block.bindings):
                self.position[b.var] = (i, j)
                for v in relax.analysis.free_vars(b.value):
                    self._users[v].add(b.var)
        for v in relax.analysis.free_vars(func.body.body):
            self._users[v].add(None)

    def value(self, e: relax.Expr) -> relax.Expr:
        """What ``e`` is bound to, through any aliases (``e`` itself when it is not a bound variable)."""
        return bound_value(e, self.var2val)

    def chain(self, e: relax.Expr) -> List[relax.Var]:
        return binding_chain(e, self.var2val)

    def var_of(self, value: relax.Expr) -> Optional[relax.Var]:
        """The variable a value is bound to, when it is bound (a dpl match reports values, not variables)."""
        return self._val2var.get(value)

    def callee(self, gv) -> Optional[tvm.ir.BaseFunc]:
        """The function a ``call_tir`` calls (None without the module, or for an unknown name)."""
        if self.module is None or not isinstance(gv, relax.GlobalVar):
            return None
        try:
            return self.module[gv]
        except (KeyError, ValueError, tvm.TVMError):
            return None

    def fused_call(self, value: relax.Expr) -> Optional[Tuple[str, Dict[str, relax.Expr], dict]]:
        """``(operator name, {input name: argument}, params)`` when ``value`` is a ``call_tir`` of one of this
        package's operators (:mod:`..ops.registry`), else None."""
        from ..ops.registry import inputs_of, op_of, params_of

        if not (isinstance(value, relax.Call) and op_name(value) == "relax.call_tir"):
            return None
        func = self.callee(value.args[0])
        if not isinstance(func, tvm.tirx.PrimFunc) or op_of(func) is None:
            return None
        return op_of(func), dict(zip(inputs_of(func), value.args[1].fields)), params_of(func)

    def users(self, var: relax.Var) -> Set[Optional[relax.Var]]:
        """Bindings that read ``var``; ``None`` stands for the function's result."""
        return self._users.get(var, set())

    def block_of(self, var: relax.Var) -> Optional[relax.BindingBlock]:
        pos = self.position.get(var)
        return None if pos is None else self.func.body.blocks[pos[0]]


def bindings(func: relax.Function) -> Iterator[relax.Binding]:
    for block in func.body.blocks:
        yield from block.bindings


# ---------------------------------------------------------------------------------------------------
# operators
# ---------------------------------------------------------------------------------------------------

def op_name(e) -> Optional[str]:
    """``"relax.matmul"`` for a call of a Relax operator, else None (call_tir targets, functions, non-calls)."""
    if isinstance(e, relax.Call) and isinstance(e.op, tvm.ir.Op):
        return str(e.op.name)
    return None


def explicit_out_dtype(call: relax.Call) -> Optional[str]:
    """A matmul's ``out_dtype`` attribute when it is set, else None (the result keeps the input dtype)."""
    out = str(call.attrs.out_dtype or "")
    return None if out in ("", "void", "None") else out


def int_list(arr) -> Optional[List[int]]:
    """An integer array attribute (axes, ...) as a list; None stays None."""
    if arr is None:
        return None
    return [int(a) for a in arr]


# ---------------------------------------------------------------------------------------------------
# shapes
# ---------------------------------------------------------------------------------------------------

def last_axis_slice(v) -> Optional[tuple]:
    """``(source, begin, end, stride)`` when ``v`` is a strided_slice of the last axis only, with static bounds."""
    if op_name(v) != "relax.strided_slice" or len(v.args) < 4:
        return None
    dims = shape_dims(v.args[0])
    if dims is None:
        return None
    axes = static_ints(v.args[1])
    begin, end = static_ints(v.args[2]), static_ints(v.args[3])
    strides = static_ints(v.args[4]) if len(v.args) > 4 else [1] * len(axes or [])
    if axes is None or begin is None or end is None or strides is None or len(axes) != 1:
        return None
    if axes[0] % len(dims) != len(dims) - 1:
        return None
    return v.args[0], begin[0], end[0], strides[0]


def static_ints(e) -> Optional[List[int]]:
    """The integers of a tuple / shape of static values, else None."""
    fields = getattr(e, "fields", None)
    if fields is None:
        fields = getattr(e, "values", None)
    if fields is None:
        return None
    out = []
    for f in fields:
        f = getattr(f, "value", f)
        try:
            out.append(int(f))
        except (TypeError, ValueError):
            return None
    return out


def shape_dims(e) -> Optional[List[Dim]]:
    """The tensor's dimensions, ``int`` where static and ``PrimExpr`` where symbolic; None if unknown."""
    ty = getattr(e, "ty", None)
    if not isinstance(ty, relax.TensorType) or ty.shape is None:
        return None
    values = getattr(ty.shape, "values", None)
    if values is None:  # a shape held in a variable: only the rank is known
        return None
    return [int(d) if isinstance(d, tvm.tirx.IntImm) else d for d in values]


def static_shape(e) -> Optional[List[int]]:
    """The tensor's shape when every dimension is a known integer, else None."""
    dims = shape_dims(e)
    if dims is None or not all(isinstance(d, int) for d in dims):
        return None
    return dims


def numel(shape: Optional[Sequence[int]]) -> Optional[int]:
    return None if shape is None else int(np.prod(shape)) if shape else 1


def dims_product(dims: Sequence[Dim]) -> Dim:
    """The number of elements of a shape: an ``int`` when every dim is static, else a simplified expression."""
    static = 1
    symbolic = None
    for d in dims:
        if _as_int(d) is not None:
            static *= _as_int(d)
        else:
            symbolic = d if symbolic is None else symbolic * d
    if symbolic is None:
        return static
    from tvm import sym

    return sym.Analyzer().simplify(symbolic * tvm.tirx.IntImm(symbolic.ty.dtype if hasattr(symbolic.ty, "dtype")
                                                                else "int64", static))


def same_dim(a: Dim, b: Dim) -> bool:
    """Two dimensions are provably equal (two static sizes, or symbolic expressions equal for every value of
    their variables: ``batch * seq`` and ``seq * batch``)."""
    a_static, b_static = _as_int(a), _as_int(b)
    if a_static is not None and b_static is not None:
        return a_static == b_static
    if tvm_ffi.structural_equal(a, b):
        return True
    from tvm import sym

    return bool(sym.Analyzer().can_prove_equal(tvm.tirx.IntImm("int64", a) if isinstance(a, int) else a,
                                               tvm.tirx.IntImm("int64", b) if isinstance(b, int) else b))


def same_dims(a: Optional[Sequence[Dim]], b: Optional[Sequence[Dim]]) -> bool:
    """Two shapes of the same rank whose dimensions are pairwise :func:`same_dim`."""
    return a is not None and b is not None and len(a) == len(b) and all(same_dim(x, y) for x, y in zip(a, b))


def _as_int(d) -> Optional[int]:
    if isinstance(d, int):
        return d
    if isinstance(d, tvm.tirx.IntImm):
        return int(d.value)
    return None


def format_dims(dims: Sequence[Dim]) -> str:
    """``[1, n, 384]``: static sizes as numbers, symbolic ones as their expression."""
    return "[" + ", ".join(str(d) if _as_int(d) is None else str(_as_int(d)) for d in dims) + "]"


# ---------------------------------------------------------------------------------------------------
# constants
# ---------------------------------------------------------------------------------------------------

def is_constant(e) -> bool:
    """``e`` is a constant tensor (``tvm.ir.GenericConst``, 0.27's ``relax.Constant``)."""
    return isinstance(e, tvm.ir.GenericConst)


def const_value(e) -> Optional[np.ndarray]:
    """The array of a constant (a copy: weights are large, test :func:`is_constant` first when that is all
    you need), else None."""
    if is_constant(e):
        return e.value.numpy()
    return None


def scalar_value(e) -> Optional[float]:
    """The value of a one-element constant, else None."""
    v = const_value(e)
    if v is None or v.size != 1:
        return None
    return float(v.reshape(()))


def uniform_value(e) -> Optional[float]:
    """The value of a constant whose elements are all equal (scalars and splats), else None."""
    v = const_value(e)
    if v is None or v.size == 0:
        return None
    flat = v.reshape(-1)
    if v.dtype == bool:
        return float(flat[0]) if (flat == flat[0]).all() else None
    first = flat[0]
    same = (flat == first) | (np.isnan(flat) & np.isnan(first)) if np.issubdtype(v.dtype, np.floating) \
        else (flat == first)
    return float(first) if same.all() else None


def is_close(value: Optional[float], ref: float, rel: float = 1e-4) -> bool:
    """Constants exported as fp32 are within a few ulps of their exact values; near misses are not."""
    return value is not None and abs(value - ref) <= rel * max(1.0, abs(ref))
