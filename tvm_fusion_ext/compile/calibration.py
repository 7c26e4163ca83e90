"""What int8's activation smoothing needs to know about a model's activations: the largest magnitude each input
channel of each constant-weight dense reaches on sample inputs.

Transformer activations carry a few channels far larger than the rest (the LayerNorm outputs of BERT-style
encoders do), so one uint8 scale per token spends most of its 256 steps on them and rounds the others coarsely.
Smoothing (Xiao et al., "SmoothQuant", 2023) divides each input channel by ``s_k`` and multiplies row ``k`` of the
weight by it: the product is unchanged, and the outlier channels' range moves into the weights, which are
quantised per output channel and take it well. ``s_k`` comes from these ranges (:func:`smoothing_factors`).

The ranges are measured by an fp32 build of the fused module whose ``main`` also returns, per dense, the
channel-wise ``max |x|``; always for the host CPU, since the ranges do not depend on the target.
"""

from __future__ import annotations

import hashlib
from typing import Dict, List, Mapping, Optional, Sequence

import numpy as np
import tvm
from tvm import relax

from .lowering.operator_calls import bound_constant, operator_call

#: the smoothing strength: ``s_k = max|x_k|^a / max|w_k|^(1-a)``. On all-MiniLM-L6-v2 (36 sentences, calibration
#: on 8 others) a = 0.4 gave the least worst-sentence error (row cosine 0.997; 0.996 at 0.5, 0.995 at 0.6, 0.992
#: unsmoothed), and also with generated token ids as calibration (0.9955 against 0.9946 at 0.5).
SMOOTHING_ALPHA = 0.4


def weight_key(w: np.ndarray) -> str:
    """The key of a dense's ranges: its weight's bytes (the same in the fused module the ranges are measured on
    and in the one precision lowering rewrites, whatever order a pass visits calls in)."""
    return hashlib.sha1(np.ascontiguousarray(w).tobytes()).hexdigest() + str(w.shape)


def smoothable(mod: tvm.IRModule, mutator: relax.PyExprMutator, call: relax.Call):
    """``(x, fp32 (K, N) weight)`` of a ``fused_dense`` or ``fused_gated_dense`` call int8 would quantise (constant
    fp32 weight, plain layout, fp32 input), else None. The gated pair's weight is its (K, 2N) int8 form (the gate's
    columns, then the up projection's): the two share x, so one smoothing vector."""
    found = operator_call(mod, call)
    if found is None or found[0] not in ("fused_dense", "fused_gated_dense"):
        return None
    _, func, inputs = found
    from ..ops.registry import params_of

    if params_of(func).get("w_layout", "plain") != "plain":
        return None
    w = bound_constant(mutator, inputs["w"])
    if w is None or w.dtype != np.float32 or str(inputs["x"].ty.dtype) != "float32":
        return None
    if found[0] == "fused_gated_dense":
        from ..ops.gated_dense import side_by_side

        return inputs["x"], side_by_side(w)
    return inputs["x"], (w.T if params_of(func).get("transpose_b", False) else w)


@relax.expr_functor.mutator
class _TapDenseInputs(relax.PyExprMutator):
    """Binds ``max |x|`` over all axes but the last beside every smoothable dense call."""

    def __init__(self, mod: tvm.IRModule):
        super().__init__(mod)
        self.mod = mod
        self.taps: List[tuple] = []  # (weight key, var)

    def visit_call_(self, call):
        call = self.visit_expr_post_order(call)
        found = smoothable(self.mod, self, call)
        if found is not None:
            x, w = found
            ndim = len(x.ty.shape)
            amax = relax.op.max(relax.op.abs(x), axis=list(range(ndim - 1))) if ndim > 1 else relax.op.abs(x)
            self.taps.append((weight_key(w), self.builder_.emit(amax)))
        return call


def tapped_module(mod: tvm.IRModule):
    """``(module whose main returns (outputs, (ranges...)), weight keys in that order)``."""
    mod = relax.transform.ToNonDataflow()(mod)  # the taps leave the block they are bound in
    mutator = _TapDenseInputs(mod)
    gv = mod.get_global_var("main")
    func = mutator.visit_expr(mod["main"])
    if not mutator.taps:
        return None, []
    result = mutator.builder_.normalize(relax.Tuple([func.body.body, relax.Tuple([v for _, v in mutator.taps])]))
    tapped = relax.Function(func.params, relax.SeqExpr(func.body.blocks, result), ret_ty=result.ty, attrs=func.attrs)
    mutator.builder_.update_func(gv, tapped)
    return relax.transform.Normalize()(mutator.builder_.get()), [k for k, _ in mutator.taps]


def dense_input_ranges(fused: tvm.IRModule, samples: Sequence[Mapping[str, np.ndarray]]) -> Dict[str, np.ndarray]:
    """``{weight key: max |x| per input channel}`` over ``samples`` (input dicts by ONNX name) for each dense of
    ``fused`` (a SemanticFusion result) that int8 would quantise."""
    from ..deploy.io import check_inputs
    from ..frontend import input_specs
    from ..frontend.dims import bound_reasons, shape_bounds
    from ..schedules.registry import template_rules
    from ..targets import resolve_target
    from .finalize import finalize
    from .lower import lower
    from .schedule import schedule

    tapped, keys = tapped_module(fused)
    if tapped is None:
        return {}
    target = resolve_target("llvm")
    templates = template_rules(target, None, None)
    executable = finalize(schedule(lower(tapped, target, templates=templates), target, templates=templates), target)
    vm = relax.VirtualMachine(executable, tvm.cpu())
    specs, bounds, reasons = input_specs(fused), shape_bounds(fused), bound_reasons(fused)
    ranges: Dict[str, np.ndarray] = {}
    for i, sample in enumerate(samples):
        arrays = check_inputs(specs, sample, f"calibration input {i + 1} of {len(samples)}", bounds, reasons)
        taps = vm["main"](*[tvm.runtime.tensor(np.ascontiguousarray(a), tvm.cpu()) for a in arrays])[1]
        for i, key in enumerate(keys):
            got = taps[i].numpy().astype(np.float32)
            ranges[key] = np.maximum(ranges[key], got) if key in ranges else got
    return ranges


def smoothing_factors(x_range: Optional[np.ndarray], w: np.ndarray, alpha: float = SMOOTHING_ALPHA):
    """Per input channel ``s`` (K,) for the (K, N) weight ``w``: the dense computes ``(x / s) @ (s * w)``. 1 where
    either side is all zero, and everywhere without ranges."""
    K = w.shape[0]
    if x_range is None or x_range.shape != (K,) or not np.all(np.isfinite(x_range)):
        return np.ones(K, dtype=np.float32)
    w_range = np.abs(w).max(axis=1)
    ok = (x_range > 0) & (w_range > 0)
    s = np.ones(K, dtype=np.float64)
    s[ok] = x_range[ok].astype(np.float64) ** alpha / w_range[ok].astype(np.float64) ** (1.0 - alpha)
    return s.astype(np.float32)


class GeneratedSamples(list):
    """Input dicts this package made up (not the user's): where they do not fit a model, int8 goes on unsmoothed
    and says so, instead of refusing a calibration nobody asked for. ``description``: what they are, for reports."""

    description = "generated inputs"


def generated_samples(model: str, pinned: Optional[dict] = None, sets: int = 3, batch: int = 2, seq: int = 32):
    """``sets`` generated input dicts for the ONNX file ``model``. An encoder's
    (:func:`~tvm_fusion_ext.frontend.sample_inputs.sample_inputs`: token ids from the embedding table's range,
    masks with a padded tail): ``pinned`` dims where given, the file's static dims, a dynamic leading dim ``batch``
    and other dynamic dims ``seq``. A KV-cache decoder's (past keys/values among its inputs): a prefill of ``seq`` tokens
    against an empty past, a decode step against ``seq`` cached tokens, a chunk, as generation calls it
    (:mod:`~tvm_fusion_ext.frontend.decode_inputs`)."""
    import onnx

    from ..frontend.dims import expand_input_patterns
    from ..frontend.sample_inputs import sample_inputs

    pinned = pinned or {}
    graph = onnx.load(model, load_external_data=False).graph
    inits = {t.name for t in graph.initializer}
    declared = {vi.name: [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None
                          for d in vi.type.tensor_type.shape.dim] for vi in graph.input if vi.name not in inits}
    pinned = expand_input_patterns(pinned, list(declared), model, "shapes")  # past_key_values.* as load_onnx reads it
    if not pinned:
        decoder = _decoder_samples(model, sets, batch, seq)
        if decoder is not None:
            return decoder
    shapes = {name: list(pinned.get(name) or [d if d is not None else batch if i == 0 else seq
                                              for i, d in enumerate(dims)]) for name, dims in declared.items()}
    out = GeneratedSamples(sample_inputs(model, seed=s, shapes=shapes) for s in range(sets))
    out.description = f"{sets} generated sets, batch {batch} x seq {seq} where dynamic"
    return out


def _decoder_samples(model: str, sets: int, batch: int, seq: int) -> Optional[GeneratedSamples]:
    """A decoder's generated calls (prefill, decode step, chunk, ...), or None for a model without a past."""
    from ..frontend.decode_inputs import PAST, decode_feeds, decode_shapes, onnx_specs, role_of, vocab_of

    specs = onnx_specs(model)
    if not any(role_of(n, dims, dtype) == PAST for n, (dims, dtype) in specs.items()):
        return None
    from ..errors import InputError
    calls = [(0, seq, f"a {seq}-token prefill"), (seq, 1, f"a decode step after {seq} tokens"),
             (seq // 2, seq - seq // 2, f"a {seq - seq // 2}-token chunk after {seq // 2}")]
    out, what = GeneratedSamples(), []
    for s in range(sets):
        past, new, label = calls[s % len(calls)]
        try:
            shapes = decode_shapes(specs, batch, past, model, new=new)
        except InputError:
            return None  # inputs a generation step does not have: made up as an encoder's
        out.append(decode_feeds(specs, shapes, past, vocab_of(model, specs), seed=s))
        what.append(label)
    out.description = f"{sets} generated calls of batch {batch}: {', '.join(what)}"
    return out


def default_calibration(model, precision: str, pinned: Optional[dict] = None):
    """Generated calibration inputs for an int8 compilation of the ONNX file ``model`` when none are given;
    None for other precisions, a model that is not a file, or inputs it cannot invent (int8 then quantises
    activations unsmoothed, and its report says so)."""
    import os

    from ..errors import InputError

    if precision != "int8" or not isinstance(model, (str, os.PathLike)):
        return None
    try:
        return generated_samples(os.fspath(model), pinned)
    except InputError:
        return None
