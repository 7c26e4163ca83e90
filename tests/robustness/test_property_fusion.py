"""Property-based fusion tests: random small Relax graphs from the patterns' ingredients, fused vs unfused.

Every example builds ONE Relax function holding ``CASES_PER_EXAMPLE`` independent random subgraphs (dense
epilogues, LayerNorms, attention chains, QKV projections, with near-miss spellings, odd axes, broadcast
biases/masks and extra users of intermediates) and returns all their outputs as a tuple. ``SemanticFusion``
is applied, and both modules are compiled and run with :func:`run_relax` (stock ``tvm.compile``, llvm) on the
same random inputs. Property: no crash, same output structure, outputs equal within fp32 tolerance.
Batching several subgraphs per module amortises the compile, which is the cost (≈0.1-0.2 s per module).

Figures (see README.md): ``EXAMPLES × CASES_PER_EXAMPLE`` generated cases, derandomized (reproducible).
"""

from __future__ import annotations

import math
import os

import numpy as np
import pytest
import tvm
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tvm import relax

from tvm_fusion_ext.testing import fused_calls, random_inputs, run_relax
from tvm_fusion_ext.transform import (Canonicalize, FuseBiasResidualLayerNorm, FuseMatmulBiasActivation,
                                      FuseMultiHeadAttention, FuseQKVProjection, FusionReport, SemanticFusion)

EXAMPLES = int(os.environ.get("TFX_PROPERTY_EXAMPLES", "25"))
CASES_PER_EXAMPLE = int(os.environ.get("TFX_PROPERTY_CASES", "12"))
# LLVM codegen (the JIT when the VM loads) is most of the cost; opt-level 0 halves it and does not change
# what is computed (both sides use the same target).
TARGET = {"kind": "llvm", "opt-level": 0}
RTOL = ATOL = 2e-4  # fp32; fused kernels reassociate sums and use their own exp/erf

INV_SQRT2 = 1.0 / math.sqrt(2.0)
SQRT_2_PI = math.sqrt(2.0 / math.pi)

# Statistics of the run (printed at the end of the session by the last test; figures for README.md).
STATS = {"examples": 0, "cases": 0, "kinds": {}, "fused": {}, "mismatches": 0, "crashes": 0}


def _c(v):
    return relax.const(np.float32(v), "float32")


# ---------------------------------------------------------------------------------------------------------
# subgraph builders: each takes the BlockBuilder, a `param(name, shape)` factory, an rng for constants and a
# choice dict; returns the list of output expressions
# ---------------------------------------------------------------------------------------------------------

def _activation(bb, y, act, c):
    if act == "none":
        return y
    if act in ("relu", "gelu", "gelu_tanh", "silu"):
        return bb.emit({"relu": relax.op.nn.relu, "gelu": relax.op.nn.gelu, "gelu_tanh": relax.op.nn.gelu_tanh,
                        "silu": relax.op.nn.silu}[act](y))
    if act == "sigmoid":
        return bb.emit(relax.op.sigmoid(y))
    if act == "tanh":
        return bb.emit(relax.op.tanh(y))
    if act == "silu_spelled":  # x * sigmoid(x)
        return bb.emit(relax.op.multiply(y, bb.emit(relax.op.sigmoid(y))))
    if act in ("erf_mul", "erf_div", "erf_half_first"):  # 0.5·x·(1 + erf(x·c)) in three spellings
        inner = relax.op.multiply(y, _c(c)) if act != "erf_div" else relax.op.divide(y, _c(1.0 / c))
        one_plus = bb.emit(relax.op.add(_c(1.0), bb.emit(relax.op.erf(bb.emit(inner)))))
        if act == "erf_half_first":
            return bb.emit(relax.op.multiply(bb.emit(relax.op.multiply(_c(0.5), y)), one_plus))
        return bb.emit(relax.op.multiply(bb.emit(relax.op.multiply(y, one_plus)), _c(0.5)))
    if act == "tanh_spelled":  # 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))), c = (c_outer, c_cube)
        c_outer, c_cube = c
        cube = bb.emit(relax.op.power(y, _c(3.0)))
        inner = bb.emit(relax.op.add(y, bb.emit(relax.op.multiply(cube, _c(c_cube)))))
        th = bb.emit(relax.op.tanh(bb.emit(relax.op.multiply(inner, _c(c_outer)))))
        return bb.emit(relax.op.multiply(bb.emit(relax.op.multiply(y, _c(0.5))),
                                         bb.emit(relax.op.add(th, _c(1.0)))))
    raise AssertionError(act)


def build_dense(bb, param, rng, ch):
    lead, m, k, n = tuple(ch["lead"]), ch["m"], ch["k"], ch["n"]
    x = param("x", lead + (m, k))
    wform = ch["wform"]
    if wform == "batched" and not lead:
        wform = "2d"
    if wform == "2d":
        w = param("w", (k, n))
    elif wform == "2d_t":
        w = bb.emit(relax.op.permute_dims(param("wt", (n, k)), [1, 0]))
    elif wform == "const":
        w = relax.const(rng.standard_normal((k, n)).astype("float32"))
    elif wform == "const_t":
        w = bb.emit(relax.op.permute_dims(relax.const(rng.standard_normal((n, k)).astype("float32")), [1, 0]))
    else:  # batched weight: [lead..., K, N]
        w = param("wb", lead + (k, n))
    y = bb.emit(relax.op.matmul(x, w))
    mm = y
    bias_shape = {"none": None, "n": (n,), "1n": (1, n), "mn": (m, n), "m1": (m, 1), "full": lead + (m, n),
                  "scalar": ()}[ch["bias"]]
    if bias_shape is not None:
        b = relax.const(rng.standard_normal(bias_shape).astype("float32")) if ch["bias_const"] \
            else param("b", bias_shape)
        y = bb.emit(relax.op.add(b, y) if ch["bias_first"] else relax.op.add(y, b))
    pre = y
    y = _activation(bb, y, ch["act"], ch["act_c"])
    outs = [y]
    if ch["extra"] == "matmul":
        outs.append(bb.emit(relax.op.multiply(mm, _c(2.0))))
    elif ch["extra"] == "pre_act":
        y2 = bb.emit(relax.op.subtract(y, pre))
        outs = [y2]
    return outs


def build_layernorm(bb, param, rng, ch):
    lead, m, n = tuple(ch["lead"]), ch["m"], ch["n"]
    shape = lead + (m, n)
    s = param("x", shape)
    if ch["bias"]:
        s = bb.emit(relax.op.add(s, param("b", (n,))))
    if ch["residual"]:
        r = param("r", shape)
        s = bb.emit(relax.op.add(r, s) if ch["residual_first"] else relax.op.add(s, r))
    eps = ch["eps"]
    g = param("g", (n,)) if ch["affine"] else None
    be = param("be", (n,)) if ch["affine"] else None
    if ch["form"] == "op":
        axes = [-1] if ch["mean_axes"] != [-2, -1] else [-2, -1]
        gshape = (n,) if axes == [-1] else (m, n)
        g = param("g2", gshape)
        be = param("be2", gshape)
        y = bb.emit(relax.op.nn.layer_norm(s, g, be, axes=axes, epsilon=eps))
    else:
        mu = bb.emit(relax.op.mean(s, axis=ch["mean_axes"], keepdims=True))
        d = bb.emit(relax.op.subtract(s, mu))
        sq = bb.emit(relax.op.power(d, _c(2.0)) if ch["square"] == "pow" else relax.op.multiply(d, d))
        var = bb.emit(relax.op.mean(sq, axis=ch["var_axes"], keepdims=True))
        ve = bb.emit(relax.op.add(var, _c(eps)))
        if ch["norm"] == "div_sqrt":
            y = bb.emit(relax.op.divide(d, bb.emit(relax.op.sqrt(ve))))
        else:
            y = bb.emit(relax.op.multiply(d, bb.emit(relax.op.rsqrt(ve))))
        if g is not None:
            y = bb.emit(relax.op.multiply(y, g))
            y = bb.emit(relax.op.add(y, be))
    outs = [y]
    if ch["extra"] == "sum":
        outs.append(bb.emit(relax.op.multiply(s, _c(0.5))))
    return outs


def build_attention(bb, param, rng, ch):
    b, h, s, t, d = ch["b"], ch["h"], ch["s"], ch["t"], ch["d"]
    if ch["form"] == "4d":
        q, k, v = param("q", (b, h, s, d)), param("k", (b, h, t, d)), param("v", (b, h, t, d))
        full = (b, h, s, t)
        kt = bb.emit(relax.op.permute_dims(k, [0, 1, 3, 2]))
    else:
        q, k, v = param("q", (b * h, s, d)), param("k", (b * h, t, d)), param("v", (b * h, t, d))
        full = (b * h, s, t)
        kt = bb.emit(relax.op.permute_dims(k, [0, 2, 1]))
    scale_val = ch["scale_val"] if ch["scale_val"] is not None else math.sqrt(d)
    op = ch["scale_op"]
    if op == "q":
        q = bb.emit(relax.op.multiply(q, _c(1.0 / scale_val)))
    sc = bb.emit(relax.op.matmul(q, kt))
    scores = sc

    def scale(x):
        if op == "div":
            return bb.emit(relax.op.divide(x, _c(scale_val)))
        if op == "mul":
            return bb.emit(relax.op.multiply(x, _c(1.0 / scale_val)))
        return x

    if ch["scale_pos"] == "before_mask":
        sc = scale(sc)
    if ch["mask"] == "param":
        # broadcastable mask shape: a suffix of the full shape (rank drop), each dim full or 1
        rank = len(full) - ch["mask_drop"] if ch["mask_drop"] < len(full) else 1
        dims = tuple(full[len(full) - rank:])
        keep = ch["mask_keep"]
        mshape = tuple(dd if keep[i % len(keep)] else 1 for i, dd in enumerate(dims))
        sc = bb.emit(relax.op.add(sc, param("mask", mshape)))
    elif ch["mask"] == "causal":
        tri = np.where(np.arange(t)[None, :] > np.arange(s)[:, None] + (t - s), -1e9, 0.0).astype("float32")
        sc = bb.emit(relax.op.add(sc, relax.const(tri)))
    if ch["scale_pos"] == "after_mask":
        sc = scale(sc)
    p = bb.emit(relax.op.nn.softmax(sc, axis=ch["softmax_axis"] % len(full) - len(full)
                                    if ch["softmax_axis"] < len(full) else -1))
    o = bb.emit(relax.op.matmul(p, v))
    outs = [o]
    if ch["extra"] == "probs":
        outs.append(p)
    elif ch["extra"] == "scores":
        outs.append(bb.emit(relax.op.multiply(scores, _c(0.25))))
    return outs


def build_qkv(bb, param, rng, ch):
    lead, m, k = tuple(ch["lead"]), ch["m"], ch["k"]
    x = param("x", lead + (m, k))
    outs = []
    for i, n in enumerate(ch["ns"]):
        if ch["nonconst"] == i:
            w = param(f"w{i}", (k, n))
        elif ch["transposed"]:
            w = bb.emit(relax.op.permute_dims(relax.const(rng.standard_normal((n, k)).astype("float32")), [1, 0]))
        else:
            w = relax.const(rng.standard_normal((k, n)).astype("float32"))
        y = bb.emit(relax.op.matmul(x, w))
        if ch["bias"]:
            y = bb.emit(relax.op.add(y, relax.const(rng.standard_normal((n,)).astype("float32"))))
        outs.append(y)
    if ch["extra"]:
        outs.append(bb.emit(relax.op.add(outs[0], _c(1.0))))
    return outs


BUILDERS = {"dense": build_dense, "layernorm": build_layernorm, "attention": build_attention, "qkv": build_qkv}


def build_module(specs, seed=0):
    """One function: every spec's subgraph, outputs concatenated into a tuple."""
    params = []

    def make_param(prefix):
        def param(name, shape, dtype="float32"):
            v = relax.Var(f"{prefix}{name}", relax.TensorType(tuple(int(s) for s in shape), dtype))
            params.append(v)
            return v
        return param

    # parameters are created while the subgraphs are built; BlockBuilder takes them at the end
    bb = relax.BlockBuilder()
    with bb.function("main"):
        with bb.dataflow():
            outs = []
            for i, (kind, ch) in enumerate(specs):
                outs += BUILDERS[kind](bb, make_param(f"c{i}_"), np.random.default_rng(seed + i), ch)
            out = bb.emit_output(relax.Tuple(outs))
        bb.emit_func_output(out, params=params)
    return bb.get()


# ---------------------------------------------------------------------------------------------------------
# strategies
# ---------------------------------------------------------------------------------------------------------

small = st.integers(1, 6)
lead_st = st.sampled_from([[], [2], [2, 3]])
near_inv_sqrt2 = st.sampled_from([INV_SQRT2, INV_SQRT2, 0.7, INV_SQRT2 * (1 + 1e-3), 0.5])
tanh_consts = st.tuples(st.sampled_from([SQRT_2_PI, SQRT_2_PI, 0.8, SQRT_2_PI * 1.01]),
                        st.sampled_from([0.044715, 0.044715, 0.045, 0.0447]))


@st.composite
def dense_choice(draw):
    act = draw(st.sampled_from(["none", "relu", "gelu", "gelu_tanh", "silu", "sigmoid", "tanh", "silu_spelled",
                                "erf_mul", "erf_div", "erf_half_first", "tanh_spelled"]))
    return {"lead": draw(lead_st), "m": draw(small), "k": draw(st.integers(1, 9)), "n": draw(st.integers(1, 9)),
            "wform": draw(st.sampled_from(["2d", "2d_t", "const", "const_t", "batched"])),
            "bias": draw(st.sampled_from(["none", "n", "n", "1n", "mn", "m1", "full", "scalar"])),
            "bias_const": draw(st.booleans()), "bias_first": draw(st.booleans()), "act": act,
            "act_c": draw(tanh_consts) if act == "tanh_spelled" else draw(near_inv_sqrt2),
            "extra": draw(st.sampled_from(["none", "none", "matmul", "pre_act"]))}


@st.composite
def layernorm_choice(draw):
    lead = draw(st.sampled_from([[], [2]]))
    rank = len(lead) + 2
    axes_options = [[-1], [-1], [-2], [-2, -1], [0]] + ([[1]] if rank > 2 else [])
    mean_axes = draw(st.sampled_from(axes_options))
    return {"lead": lead, "m": draw(small), "n": draw(st.integers(1, 12)), "bias": draw(st.booleans()),
            "residual": draw(st.booleans()), "residual_first": draw(st.booleans()),
            "eps": draw(st.sampled_from([1e-5, 1e-12, 1e-6, 0.1, 1e-3])), "affine": draw(st.booleans()),
            "form": draw(st.sampled_from(["decomposed", "decomposed", "op"])), "mean_axes": mean_axes,
            "var_axes": draw(st.sampled_from([mean_axes, mean_axes, mean_axes] + axes_options)),
            "square": draw(st.sampled_from(["pow", "mul"])), "norm": draw(st.sampled_from(["div_sqrt", "rsqrt"])),
            "extra": draw(st.sampled_from(["none", "none", "sum"]))}


@st.composite
def attention_choice(draw):
    form = draw(st.sampled_from(["4d", "4d", "3d"]))
    d = draw(st.integers(1, 8))
    return {"form": form, "b": draw(st.integers(1, 2)), "h": draw(st.integers(1, 3)), "s": draw(small),
            "t": draw(small), "d": d,
            "scale_op": draw(st.sampled_from(["div", "mul", "q", "none"])),
            "scale_val": draw(st.sampled_from([None, None, None, 3.0, 0.5])),
            "scale_pos": draw(st.sampled_from(["before_mask", "after_mask"])),
            "mask": draw(st.sampled_from(["none", "param", "param", "causal"])),
            "mask_drop": draw(st.integers(0, 3)), "mask_keep": draw(st.lists(st.booleans(), min_size=4, max_size=4)),
            "softmax_axis": draw(st.sampled_from([-1, -1, -1, -2, 0, 1])),
            "extra": draw(st.sampled_from(["none", "none", "probs", "scores"]))}


@st.composite
def qkv_choice(draw):
    k = draw(st.integers(1, 9))
    same = draw(st.booleans())
    n = draw(st.integers(1, 8))
    ns = [n, n, n] if same else draw(st.lists(st.integers(1, 8), min_size=3, max_size=3))
    return {"lead": draw(lead_st), "m": draw(small), "k": k, "ns": ns, "bias": draw(st.booleans()),
            "transposed": draw(st.booleans()), "nonconst": draw(st.sampled_from([None, None, None, 0, 2])),
            "extra": draw(st.booleans())}


CHOICES = {"dense": dense_choice, "layernorm": layernorm_choice, "attention": attention_choice, "qkv": qkv_choice}
case_st = st.sampled_from(sorted(CHOICES)).flatmap(lambda kind: st.tuples(st.just(kind), CHOICES[kind]()))


def _flat(x):
    return [x] if isinstance(x, np.ndarray) else [a for item in x for a in _flat(item)]


def check_fused_equals_unfused(mod, seed=0):
    inputs = random_inputs(mod, seed=seed)
    with FusionReport.collect() as report:
        fused = SemanticFusion()(mod)
    ref = _flat(run_relax(mod, inputs, target=TARGET))
    out = _flat(run_relax(fused, inputs, target=TARGET))
    assert len(out) == len(ref)
    for a, e in zip(out, ref):
        assert a.shape == e.shape and a.dtype == e.dtype
        np.testing.assert_allclose(a, e, rtol=RTOL, atol=ATOL * max(1.0, float(np.abs(e).max(initial=0))))
    return fused, report


@pytest.mark.slow
@settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(specs=st.lists(case_st, min_size=CASES_PER_EXAMPLE, max_size=CASES_PER_EXAMPLE),
       seed=st.integers(0, 2**16))
def test_random_graphs_fused_equal_unfused(specs, seed):
    mod = build_module(specs, seed)
    try:
        fused, _ = check_fused_equals_unfused(mod, seed)
    except AssertionError:
        STATS["mismatches"] += 1
        raise
    except Exception:
        STATS["crashes"] += 1
        raise
    STATS["examples"] += 1
    STATS["cases"] += len(specs)
    for kind, _ in specs:
        STATS["kinds"][kind] = STATS["kinds"].get(kind, 0) + 1
    for op, cnt in fused_calls(fused).items():
        STATS["fused"][op] = STATS["fused"].get(op, 0) + cnt


@pytest.mark.slow
def test_property_run_figures(capsys):
    """Runs after the property test (file order): the generator really exercised every fused operator."""
    if STATS["examples"] == 0:
        pytest.skip("property test not run in this session")  # only when selected alone; never counted
    with capsys.disabled():
        print(f"\n[property] examples={STATS['examples']} cases={STATS['cases']} kinds={STATS['kinds']} "
              f"fused_calls={STATS['fused']} mismatches={STATS['mismatches']} crashes={STATS['crashes']}")
    assert STATS["cases"] >= EXAMPLES * CASES_PER_EXAMPLE
    for op in ("fused_dense", "fused_layernorm", "fused_attention"):
        assert STATS["fused"].get(op, 0) > 0, f"the generator never produced a fusable {op}: {STATS['fused']}"


# ---------------------------------------------------------------------------------------------------------
# the same builders, canonical spellings: these MUST fuse (so the generator is not vacuous)
# ---------------------------------------------------------------------------------------------------------

DENSE_EXACT = {"lead": [2], "m": 3, "k": 5, "n": 4, "wform": "const", "bias": "n", "bias_const": True,
               "bias_first": False, "act": "erf_mul", "act_c": INV_SQRT2, "extra": "none"}
LN_EXACT = {"lead": [2], "m": 3, "n": 8, "bias": True, "residual": True, "residual_first": False, "eps": 1e-5,
            "affine": True, "form": "decomposed", "mean_axes": [-1], "var_axes": [-1], "square": "pow",
            "norm": "div_sqrt", "extra": "none"}
ATT_EXACT = {"form": "4d", "b": 2, "h": 2, "s": 3, "t": 5, "d": 4, "scale_op": "div", "scale_val": None,
             "scale_pos": "before_mask", "mask": "param", "mask_drop": 0, "mask_keep": [True, False, False, True],
             "softmax_axis": -1, "extra": "none"}


def _gelu_in_fused(fused):
    names = [str(gv.name_hint) for gv, f in fused.functions_items() if isinstance(f, tvm.tirx.PrimFunc)]
    return any("gelu" in n for n in names)


def test_canonical_spellings_fuse():
    fused, report = check_fused_equals_unfused(build_module([("dense", DENSE_EXACT), ("layernorm", LN_EXACT),
                                                             ("attention", ATT_EXACT)]))
    calls = fused_calls(fused)
    assert calls.get("fused_dense") == 1 and calls.get("fused_layernorm") == 1 and calls.get("fused_attention") == 1
    assert _gelu_in_fused(fused) and "R.erf" not in fused["main"].script()


# ---------------------------------------------------------------------------------------------------------
# explicit near misses: must NOT fuse, and must stay numerically equal
# ---------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("c", [0.7, INV_SQRT2 * (1 + 1e-3)])
def test_gelu_with_wrong_constant_does_not_become_gelu(c):
    mod = build_module([("dense", dict(DENSE_EXACT, act_c=c))])
    fused, report = check_fused_equals_unfused(mod)
    assert not _gelu_in_fused(fused)
    assert "R.erf" in fused["main"].script()  # the erf is still there, computed as written
    assert report.canonicalized.get("gelu_erf", 0) == 0


def test_tanh_gelu_with_wrong_cube_constant_does_not_become_gelu():
    mod = build_module([("dense", dict(DENSE_EXACT, act="tanh_spelled", act_c=(SQRT_2_PI, 0.045)))])
    fused, _ = check_fused_equals_unfused(mod)
    assert not _gelu_in_fused(fused) and "R.tanh" in fused["main"].script()


@pytest.mark.parametrize("axes", [([-2], [-2]), ([-1], [-2]), ([0], [0])])
def test_layernorm_over_wrong_axis_does_not_fuse(axes):
    mean_axes, var_axes = axes
    mod = build_module([("layernorm", dict(LN_EXACT, mean_axes=mean_axes, var_axes=var_axes))])
    fused, report = check_fused_equals_unfused(mod)
    assert "fused_layernorm" not in fused_calls(fused)
    script = fused["main"].script()
    assert "R.nn.layer_norm" not in script and "R.mean" in script


def test_layernorm_wrong_axis_vs_right_axis_numbers_differ():
    """The near miss is a real difference (else 'does not fuse' would prove nothing about correctness)."""
    right = build_module([("layernorm", LN_EXACT)])
    wrong = build_module([("layernorm", dict(LN_EXACT, mean_axes=[-2], var_axes=[-2]))])
    inputs = random_inputs(right, seed=3)
    assert not np.allclose(_flat(run_relax(right, inputs))[0], _flat(run_relax(wrong, inputs))[0], atol=1e-3)


# ---------------------------------------------------------------------------------------------------------
# structural identity: a pass that matches nothing returns its input unchanged
# ---------------------------------------------------------------------------------------------------------

def _unmatched_modules():
    def fn(build, shapes):
        params = [relax.Var(f"p{i}", relax.TensorType(s, "float32")) for i, s in enumerate(shapes)]
        bb = relax.BlockBuilder()
        with bb.function("main", params):
            with bb.dataflow():
                out = bb.emit_output(build(bb, *params))
            bb.emit_func_output(out)
        return bb.get()

    # each returns its last expression un-emitted: `emit_output` binds it, so the input has no trivial
    # `gv = lv` rebinding (SemanticFusion starts with CanonicalizeBindings, which would remove one)
    def elementwise(bb, x, y):
        return relax.op.exp(bb.emit(relax.op.multiply(bb.emit(relax.op.add(x, y)), _c(3.0))))

    def softmax_sum(bb, x):
        return relax.op.sum(bb.emit(relax.op.nn.softmax(x, axis=1)), axis=[0])

    def erf_near_miss(bb, x):  # erf(0.7·x) without a matmul in front
        e = bb.emit(relax.op.erf(bb.emit(relax.op.multiply(x, _c(0.7)))))
        return relax.op.multiply(bb.emit(relax.op.multiply(x, bb.emit(relax.op.add(e, _c(1.0))))), _c(0.5))

    def wrong_axis_norm(bb, x):
        mu = bb.emit(relax.op.mean(x, axis=[0], keepdims=True))
        d = bb.emit(relax.op.subtract(x, mu))
        var = bb.emit(relax.op.mean(bb.emit(relax.op.multiply(d, d)), axis=[0], keepdims=True))
        return relax.op.divide(d, bb.emit(relax.op.sqrt(bb.emit(relax.op.add(var, _c(1e-5))))))

    def reshape_concat(bb, x, y):
        return relax.op.concat([bb.emit(relax.op.reshape(x, (6, 4))), y], axis=0)

    return {
        "elementwise": fn(elementwise, [(3, 4), (3, 4)]),
        "softmax_sum": fn(softmax_sum, [(3, 5)]),
        "erf_near_miss": fn(erf_near_miss, [(3, 5)]),
        "wrong_axis_norm": fn(wrong_axis_norm, [(4, 6)]),
        "reshape_concat": fn(reshape_concat, [(3, 8), (2, 4)]),
    }


PASSES = {"Canonicalize": Canonicalize, "FuseQKVProjection": FuseQKVProjection,
          "FuseMultiHeadAttention": FuseMultiHeadAttention, "FuseMatmulBiasActivation": FuseMatmulBiasActivation,
          "FuseBiasResidualLayerNorm": FuseBiasResidualLayerNorm, "SemanticFusion": SemanticFusion}
UNMATCHED = _unmatched_modules()


@pytest.mark.parametrize("graph", sorted(UNMATCHED))
@pytest.mark.parametrize("pass_name", sorted(PASSES))
def test_unmatched_graph_is_returned_unchanged(pass_name, graph):
    mod = UNMATCHED[graph]
    tvm.ir.assert_structural_equal(PASSES[pass_name]()(mod), mod)


@pytest.mark.parametrize("pass_name", sorted(set(PASSES) - {"SemanticFusion", "Canonicalize"}))
def test_each_pass_leaves_other_patterns_alone(pass_name):
    """A graph holding only another pass's pattern is not this pass's business (e.g. dense fusion on a bare
    softmax-attention without weights, attention fusion on a LayerNorm op)."""
    only = {"FuseQKVProjection": ("layernorm", dict(LN_EXACT, form="op")),
            "FuseMultiHeadAttention": ("layernorm", dict(LN_EXACT, form="op")),
            "FuseMatmulBiasActivation": ("layernorm", dict(LN_EXACT, form="op")),
            "FuseBiasResidualLayerNorm": ("dense", dict(DENSE_EXACT, act="relu", extra="none"))}[pass_name]
    mod = build_module([only])
    tvm.ir.assert_structural_equal(PASSES[pass_name]()(mod), mod)
