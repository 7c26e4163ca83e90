"""EinsumAsMatmul: two-operand einsums that are matrix products become matmul (+ permutes), so attention and
projections written as einsum fuse; other einsums are left alone with a reason, and every one computes what
ONNX Runtime computes."""

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from tvm_fusion_ext.compile import fuse
from tvm_fusion_ext.frontend import load_onnx
from tvm_fusion_ext.runtime import CompiledModel
from tvm_fusion_ext.transform.canonical.einsum_matmul import parse_product

ort = pytest.importorskip("onnxruntime")

B, H, S, D, F = 2, 3, 7, 8, 5
F32 = TensorProto.FLOAT


@pytest.mark.parametrize("eq,roles", [
    ("bsij,bsjk->bsik", ("bs", "i", "j", "k")),
    ("bhqd,bhkd->bhqk", ("bh", "q", "d", "k")),
    ("bsd,df->bsf", ("", "bs", "d", "f")),
    ("bhqk,bkhd->bqhd", ("bh", "q", "k", "d")),  # V in BSHD, the output merged per head
])
def test_products_are_read_by_role(eq, roles):
    p, why = parse_product(eq)
    assert why is None
    assert ("".join(p.batch), "".join(p.left), "".join(p.contracted), "".join(p.right)) == roles


@pytest.mark.parametrize("eq,why", [
    ("bij,bij->bij", "contracts 0 letters"),          # an elementwise product
    ("bij,bij->b", "contracts 2 letters"),
    ("ii,ij->ij", "repeats a letter"),                # a diagonal
    ("...ij,...jk->...ik", "ellipsis"),
    ("bij,bjk->bk", "sums 'i' within one operand"),
    ("bij,bjk", "no explicit output"),
    ("bsd,d->bs", "is not [.., m, k] x [.., k, n]"),  # a matrix-vector product: no free letter on the right
    ("bsh,bhd,bdo->bso", "3 operands"),
    ("bxyi,bij->bxyj", "batch letters and several free letters"),
])
def test_other_einsums_are_refused_with_a_reason(eq, why):
    p, reason = parse_product(eq)
    assert p is None and why in reason


def _einsum_attention_model(qk_eq, pv_eq, v_layout):
    """Heads split by Reshape/Transpose, scores and context as Einsum (ProphetNet's form), a key-padding mask,
    a projection of the merged heads as Einsum too."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((H * D, F)).astype("float32")
    nodes = [
        helper.make_node("Reshape", ["xq", "split"], ["q4"]), helper.make_node("Transpose", ["q4"], ["q"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["xk", "split"], ["k4"]), helper.make_node("Transpose", ["k4"], ["k"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["xv", "split"], ["v4"]),
    ]
    if v_layout == "BHSD":
        nodes.append(helper.make_node("Transpose", ["v4"], ["v"], perm=[0, 2, 1, 3]))
    else:
        nodes.append(helper.make_node("Identity", ["v4"], ["v"]))
    nodes += [
        helper.make_node("Einsum", ["q", "k"], ["s"], equation=qk_eq),
        helper.make_node("Mul", ["s", "scale"], ["ss"]),
        helper.make_node("Add", ["ss", "mask"], ["sm"]),
        helper.make_node("Softmax", ["sm"], ["p"], axis=-1),
        helper.make_node("Einsum", ["p", "v"], ["o"], equation=pv_eq),
    ]
    if pv_eq.endswith("bhqd"):
        nodes.append(helper.make_node("Transpose", ["o"], ["o2"], perm=[0, 2, 1, 3]))
    else:
        nodes.append(helper.make_node("Identity", ["o"], ["o2"]))
    nodes += [helper.make_node("Reshape", ["o2", "merge"], ["m"]),
              helper.make_node("Einsum", ["m", "w"], ["y"], equation="bsd,df->bsf")]
    inits = [numpy_helper.from_array(np.array([B, S, H, D], "int64"), "split"),
             numpy_helper.from_array(np.array([B, S, H * D], "int64"), "merge"),
             numpy_helper.from_array(np.array(D ** -0.5, "float32"), "scale"),
             numpy_helper.from_array(w, "w")]
    inputs = [helper.make_tensor_value_info(n, F32, [B, S, H * D]) for n in ("xq", "xk", "xv")]
    inputs.append(helper.make_tensor_value_info("mask", F32, [B, 1, 1, S]))
    graph = helper.make_graph(nodes, "einsum_attention", inputs, [helper.make_tensor_value_info("y", F32, [B, S, F])],
                              inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _feeds():
    rng = np.random.default_rng(1)
    feeds = {n: rng.standard_normal((B, S, H * D)).astype("float32") for n in ("xq", "xk", "xv")}
    mask = np.zeros((B, 1, 1, S), "float32")
    mask[1, ..., S - 3:] = np.finfo("float32").min
    feeds["mask"] = mask
    return feeds


@pytest.mark.parametrize("qk_eq,pv_eq,v_layout", [
    ("bhqd,bhkd->bhqk", "bhqk,bhkd->bhqd", "BHSD"),
    ("bhqd,bhkd->bhqk", "bhqk,bkhd->bqhd", "BSHD"),  # V read in BSHD, the context written per query
])
def test_einsum_attention_fuses_and_matches_onnx_runtime(qk_eq, pv_eq, v_layout):
    model = _einsum_attention_model(qk_eq, pv_eq, v_layout)
    mod = load_onnx(model)
    _, report = fuse(mod)
    assert report.canonicalized.get("EinsumAsMatmul") == 3, report.summary()
    assert report.fused["attention"] == 1 and report.fused["dense"] == 1, report.summary()
    feeds = _feeds()
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    got = CompiledModel.from_module(mod).run(feeds)["y"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("eq,shapes", [
    ("bij,bij->bij", [(2, 3, 4), (2, 3, 4)]),
    ("bij,bjk->bk", [(2, 3, 4), (2, 4, 5)]),
    ("ij->ji", [(3, 4)]),
])
def test_other_einsums_still_compute_what_onnx_runtime_does(eq, shapes):
    names = [f"x{i}" for i in range(len(shapes))]
    graph = helper.make_graph([helper.make_node("Einsum", names, ["y"], equation=eq)], "einsum",
                              [helper.make_tensor_value_info(n, F32, s) for n, s in zip(names, shapes)],
                              [helper.make_tensor_value_info("y", F32, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    rng = np.random.default_rng(2)
    feeds = {n: rng.standard_normal(s).astype("float32") for n, s in zip(names, shapes)}
    mod = load_onnx(model)
    _, report = fuse(mod)
    assert not report.canonicalized.get("EinsumAsMatmul")
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    got = CompiledModel.from_module(mod).run(feeds)["y"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_a_dim_typed_as_an_equal_expression_keeps_the_einsums_type():
    # Pegasus-X's dynamic export: both operands carry seq // 4 + 1 (built twice), and Relax types the einsum's dim
    # as max(seq // 4 + 1, seq // 4 + 1); the matmul's plain seq // 4 + 1 broke the engine's type check (a crash)
    from tvm import relax, tirx

    from tvm_fusion_ext.testing import build_module, run_relax
    from tvm_fusion_ext.testing import fuse as fuse_rules
    from tvm_fusion_ext.transform.canonical.einsum_matmul import EinsumAsMatmul

    n = tirx.Var("n", "int64")
    a = relax.Var("a", relax.TensorType((2, n // 4 + 1, 3, 8), "float32"))
    b = relax.Var("b", relax.TensorType((2, n // 4 + 1, 8, 5), "float32"))
    seq = relax.Var("seq", relax.TensorType((n,), "float32"))  # binds n when the module runs
    mod = build_module([a, b, seq], lambda bb: bb.emit(relax.op.einsum([a, b], "bsij,bsjk->bsik")))
    out, report = fuse_rules(mod, EinsumAsMatmul())
    assert report.count("EinsumAsMatmul") == 1
    rng = np.random.default_rng(3)
    x, y = rng.standard_normal((2, 3, 3, 8), dtype="float32"), rng.standard_normal((2, 3, 8, 5), dtype="float32")
    got = run_relax(out, [x, y, np.zeros(9, "float32")])  # n = 9: 9 // 4 + 1 = 3
    np.testing.assert_allclose(got, np.einsum("bsij,bsjk->bsik", x, y), rtol=1e-5, atol=1e-5)
