"""Helpers for checking that a rewrite kept a module's meaning (used by our tests; handy in yours)."""

from __future__ import annotations

from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import tvm
from tvm import relax

from .tools.reference import numpy_activation  # noqa: F401  (re-exported for tests)
from .transform.graph import bindings, static_shape
from .transform.report import FusionReport
from .transform.rule import FusionRule, rule_pass


def random_inputs(mod: tvm.IRModule, seed: int = 0, func: str = "main", int_high: int = 2) -> List[np.ndarray]:
    """One random array per parameter of ``mod[func]`` (floats ~N(0,1), ints in [0, int_high), bools random)."""
    rng = np.random.default_rng(seed)
    out = []
    for p in mod[func].params:
        shape = [int(d) for d in p.ty.shape.values]
        dtype = str(p.ty.dtype)
        if dtype == "bool":
            out.append(rng.random(shape) < 0.7)
        elif dtype.startswith(("int", "uint")):
            out.append(rng.integers(0, int_high, shape).astype(dtype))
        else:
            out.append(rng.standard_normal(shape).astype(dtype))
    return out


def build_module(params: Sequence[relax.Var], build: Callable[[relax.BlockBuilder], relax.Expr]) -> tvm.IRModule:
    """A module whose ``main(*params)`` is one dataflow block: ``build(bb)`` emits it and returns the result."""
    bb = relax.BlockBuilder()
    with bb.function("main", list(params)):
        with bb.dataflow():
            out = bb.emit_output(build(bb))
        bb.emit_func_output(out)
    return bb.get()


def fuse(mod: tvm.IRModule, *steps: Union[tvm.transform.Pass, FusionRule]) -> Tuple[tvm.IRModule, FusionReport]:
    """Apply ``steps`` in order (default: ``SemanticFusion()``), each a pass or a single rule, and return the
    result with the :class:`FusionReport` of everything they did."""
    if not steps:
        from .transform.pipeline import SemanticFusion

        steps = (SemanticFusion(),)
    with FusionReport.collect() as report:
        for step in steps:
            mod = (rule_pass(step.name, [step]) if isinstance(step, FusionRule) else step)(mod)
    return mod, report


def assert_refused(mod: tvm.IRModule, *steps, reason: str, rule: Optional[str] = None) -> List[str]:
    """``steps`` leave ``mod`` as it was, ``rule`` fired nowhere and one of its refusals contains ``reason``.

    ``rule`` is a rule's name; it may be left out when the only step is a :class:`FusionRule`. Returns the
    rule's refusal reasons."""
    if rule is None:
        (only,) = steps
        rule = only.name
    out, report = fuse(mod, *steps)
    assert report.count(rule) == 0, report.summary()
    tvm.ir.assert_structural_equal(out, mod)
    reasons = [e.detail for e in report.refused if e.rule == rule]
    assert any(reason in r for r in reasons), reasons
    return reasons


def run_relax(mod: tvm.IRModule, inputs: Sequence[np.ndarray], target: Optional[dict] = None,
              func: str = "main"):
    """Compile with stock ``tvm.compile`` on llvm (no scheduling: a reference, not a fast path) and run."""
    vm = _vm(mod, target)
    return _to_numpy(vm[func](*_tensors(inputs)))


def run_before_after(before: tvm.IRModule, after: tvm.IRModule, inputs: Sequence[np.ndarray],
                     target: Optional[dict] = None):
    """``(before's main(inputs), after's main(inputs))``, both compiled like :func:`run_relax`.

    When ``before`` holds nothing but ``main`` (a graph before fusion), both are compiled as one module, which
    halves the build time the comparison costs.
    """
    after_names = {gv.name_hint for gv in after.get_global_vars()}
    if [gv.name_hint for gv in before.get_global_vars()] != ["main"] or "before_main" in after_names:
        return run_relax(before, inputs, target), run_relax(after, inputs, target)
    both = tvm.IRModule(dict(after.functions_items()))
    both["before_main"] = before["main"].with_attr("global_symbol", "before_main")
    vm = _vm(both, target)
    args = _tensors(inputs)
    return _to_numpy(vm["before_main"](*args)), _to_numpy(vm["main"](*args))


def _vm(mod: tvm.IRModule, target: Optional[dict]) -> relax.VirtualMachine:
    return relax.VirtualMachine(tvm.compile(mod, tvm.target.Target(target or {"kind": "llvm"})), tvm.cpu())


def _tensors(inputs: Sequence[np.ndarray]) -> list:
    return [tvm.runtime.tensor(np.ascontiguousarray(a).reshape(np.shape(a))) for a in inputs]


def _to_numpy(result):
    if hasattr(result, "numpy"):
        return result.numpy()
    return [_to_numpy(r) for r in result]


def assert_allclose_nested(actual, expected, rtol=1e-5, atol=1e-5):
    if isinstance(expected, (list, tuple)):
        assert len(actual) == len(expected)
        for a, e in zip(actual, expected):
            assert_allclose_nested(a, e, rtol, atol)
    else:
        np.testing.assert_allclose(actual, expected, rtol=rtol, atol=atol)


def fused_calls(mod: tvm.IRModule, func: str = "main") -> Dict[str, int]:
    """Count ``call_tir``s in ``mod[func]`` by the fused operator they call (PrimFunc attr ``tfx.op``)."""
    from .ops import op_of

    counts: Dict[str, int] = {}
    for binding in bindings(mod[func]):
        v = binding.value
        if isinstance(v, relax.Call) and v.op.same_as(tvm.ir.Op.get("relax.call_tir")):
            name = op_of(mod[v.args[0]])
            if name:
                counts[name] = counts.get(name, 0) + 1
    return counts


def tensor_shapes(mod: tvm.IRModule, func: str = "main") -> List[List[int]]:
    """Static shapes of every tensor bound in ``mod[func]`` (to prove e.g. no S×S tensor is left)."""
    shapes = (static_shape(binding.var) for binding in bindings(mod[func]))
    return [shape for shape in shapes if shape is not None]


def attention_reference(q, k, v, mask, scale: float, causal: bool = False) -> np.ndarray:
    """``softmax(scale · q kᵀ + mask [causal]) v`` in float64 for (B, S, H, D) operands (BSHD), the mask broadcast
    against (B, H, S, T); causal as ``j <= i`` (queries and keys the same rows)."""
    scores = np.einsum("bshd,bthd->bhst", q, k).astype("float64") * scale + mask
    if causal:
        seq = q.shape[1]
        scores = np.where(np.tril(np.ones((seq, seq), bool)), scores, -np.inf)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    return np.einsum("bhst,bthd->bshd", weights, v)


def decode_attention_reference(q, k, v, mask, scale: float, softcap: float = 0.0) -> np.ndarray:
    """softmax(scale · q kᵀ [capped] + mask) v in float64 for BSHD q [B, 1, H, D], k/v [B, T, Hkv, D]; K/V head
    ``h // group`` serves query head h; a row with no visible key gives 0."""
    group = q.shape[2] // k.shape[2]
    kk, vv = (np.repeat(x.astype("float64"), group, axis=2) for x in (k, v))
    s = (np.einsum("bshd,bthd->bhst", q.astype("float64"), kk)).astype("float32") * np.float32(scale)
    if softcap:
        s = (softcap * np.tanh(s.astype("float64") / softcap)).astype("float32")
    s = s.astype("float64") + (mask if mask is not None else 0.0)
    m = s.max(-1, keepdims=True)
    p = np.where(np.isneginf(s), 0.0, np.exp(s - np.where(np.isneginf(m), 0.0, m)))
    den = p.sum(-1, keepdims=True)
    out = np.where(den > 0, (p @ vv.transpose(0, 2, 1, 3)) / np.where(den > 0, den, 1.0), 0.0)
    return out.transpose(0, 2, 1, 3)


def past_mask(batch: int, past: int, pad: Sequence[int], left: bool) -> np.ndarray:
    """(B, 1, 1, P + 1) additive mask: sequence b's past is ``past - pad[b]`` real keys, its padding on the right
    (a padded past) or on the left (a left-padded one); the new key is always visible."""
    mask = np.zeros((batch, 1, 1, past + 1), "float32")
    for b, n in enumerate(pad):
        if n:
            if left:
                mask[b, ..., :n] = -np.inf
            else:
                mask[b, ..., past - n:past] = -np.inf
    return mask


def key_padding_inputs(batch: int, seq: int, heads: int, head_dim: int, seed: int) -> Tuple[np.ndarray, ...]:
    """Random (B, S, H, D) q, k, v and a (B, 1, 1, S) mask hiding ~30 % of the keys with -inf (never the first)."""
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal((batch, seq, heads, head_dim)).astype("float32") for _ in range(3))
    mask = np.where(rng.random((batch, 1, 1, seq)) < 0.3, -np.inf, 0.0).astype("float32")
    mask[..., 0] = 0.0
    return q, k, v, mask


def masked_attention_module(params: dict, heads: int, head_dim: int, seq=None, batch=None) -> tvm.IRModule:
    """``main(q, k, v, mask)``: one ``fused_attention`` over (B, S, H, D) operands and a (B, 1, 1, S) mask; batch
    and sequence symbolic unless given."""
    from tvm import tirx

    from .ops import call_op

    batch = batch if batch is not None else tirx.Var("batch", "int64")
    seq = seq if seq is not None else tirx.Var("seq", "int64")
    args = [relax.Var(n, relax.TensorType([batch, seq, heads, head_dim], "float32")) for n in ("q", "k", "v")]
    args.append(relax.Var("mask", relax.TensorType([batch, 1, 1, seq], "float32")))
    inputs = dict(zip(("q", "k", "v", "mask"), args))
    return build_module(args, lambda bb: call_op(bb, "fused_attention", inputs, params))


def kernel_named(mod: tvm.IRModule, prefix: str):
    """The first PrimFunc of ``mod`` whose name starts with ``prefix`` (``"fused_attention"``)."""
    return next(f for gv, f in mod.functions_items()
                if isinstance(f, tvm.tirx.PrimFunc) and gv.name_hint.startswith(prefix))


def quantize_rows_reference(x: np.ndarray):
    """numpy twin of int8's row quantization: per-row asymmetric uint8 (ONNX ``DynamicQuantizeLinear`` per row);
    ``(q, scale as float64, zero point)``."""
    lo = np.minimum(x.min(-1, keepdims=True), 0).astype(np.float32)
    hi = np.maximum(x.max(-1, keepdims=True), 0).astype(np.float32)
    scale = ((hi - lo) / np.float32(255)).astype(np.float32)
    scale = np.where(scale == 0, np.float32(1), scale)
    zero = np.clip(np.rint(-lo / scale), 0, 255)
    q = np.clip(np.rint(x / scale) + zero, 0, 255)
    return q, scale.astype(np.float64), zero
