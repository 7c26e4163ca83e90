"""ConvAsMatmul: 1-D and 2-D convolutions become a patch gather and one matmul (+ bias), which the dense rule
fuses; what it cannot read as such keeps TVM's kernel with a reason. Every case computes what ONNX Runtime
computes on the same file."""

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from tvm import relax

from tvm_fusion_ext.compile import fuse
from tvm_fusion_ext.frontend import load_onnx
from tvm_fusion_ext.runtime import CompiledModel

ort = pytest.importorskip("onnxruntime")
F32 = TensorProto.FLOAT


def _conv_model(x_shape, w_shape, bias=True, act=None, dynamic_length=False, conv_w_input=False, **attrs):
    rng = np.random.default_rng(0)
    w = (rng.standard_normal(w_shape) / np.sqrt(np.prod(w_shape[1:]))).astype("float32")
    inits = [] if conv_w_input else [numpy_helper.from_array(w, "w")]
    ins = ["x", "w"]
    if bias:
        inits.append(numpy_helper.from_array(rng.standard_normal(w_shape[0]).astype("float32"), "b"))
        ins.append("b")
    nodes = [helper.make_node("Conv", ins, ["c" if act else "y"], **attrs)]
    if act:
        nodes.append(helper.make_node(act, ["c"], ["y"]))
    shape = list(x_shape)
    if dynamic_length:
        shape[0], shape[-1] = "batch", "length"
    inputs = [helper.make_tensor_value_info("x", F32, shape)]
    if conv_w_input:
        inputs.append(helper.make_tensor_value_info("w", F32, list(w_shape)))
    graph = helper.make_graph(nodes, "conv", inputs, [helper.make_tensor_value_info("y", F32, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20 if act == "Gelu" else 17)]), w


def _check(model, feeds, tol=1e-4):
    mod = load_onnx(model)
    compiled = CompiledModel.from_module(mod)
    got = compiled.run(feeds)["y"]
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    return compiled.report


@pytest.mark.parametrize("x_shape,w_shape,attrs", [
    ((1, 3, 32, 32), (24, 3, 8, 8), dict(strides=[8, 8])),                        # a patch embedding
    ((2, 3, 30, 28), (16, 3, 8, 8), dict(strides=[8, 8])),                        # patches that do not tile it
    ((1, 4, 11, 9), (8, 4, 3, 3), dict(pads=[1, 1, 1, 1])),                       # same-padded 3x3
    ((1, 4, 13, 12), (6, 4, 3, 2), dict(strides=[2, 1], pads=[1, 0, 2, 1], dilations=[1, 2])),
    ((2, 5, 7, 7), (9, 5, 1, 1), {}),                                             # pointwise
])
def test_conv2d_is_a_matmul_of_patches(x_shape, w_shape, attrs):
    model, _ = _conv_model(x_shape, w_shape, **attrs)
    x = np.random.default_rng(1).standard_normal(x_shape).astype("float32")
    report = _check(model, {"x": x})
    assert report.canonicalized.get("ConvAsMatmul") == 1 and report.fused["dense"] == 1, report.summary()


@pytest.mark.parametrize("x_shape,w_shape,attrs,act", [
    ((1, 8, 60), (12, 8, 3), dict(pads=[1, 1]), "Gelu"),                            # Whisper's first conv
    ((1, 12, 60), (12, 12, 3), dict(strides=[2], pads=[1, 1]), "Gelu"),           # ... its second
    ((2, 1, 400), (16, 1, 10), dict(strides=[5]), None),                          # wav2vec2's first, no bias
    ((1, 6, 50), (4, 6, 5), dict(dilations=[3]), None),
])
def test_conv1d_is_a_matmul_of_patches(x_shape, w_shape, attrs, act):
    model, _ = _conv_model(x_shape, w_shape, bias=act is not None, act=act, **attrs)
    x = np.random.default_rng(1).standard_normal(x_shape).astype("float32")
    report = _check(model, {"x": x})
    assert report.canonicalized.get("ConvAsMatmul") == 1 and report.fused["dense"] == 1, report.summary()


def _check_lengths(model, rule, channels, lengths):
    """One build of a conv over a symbolic length, against ONNX Runtime at several (batch, length)."""
    compiled = CompiledModel.from_module(load_onnx(model, max_shapes={"x": [4, channels, 512]}))
    assert compiled.report.canonicalized.get(rule) == 1, compiled.report.summary()
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for batch, length in lengths:
        x = np.random.default_rng(length).standard_normal((batch, channels, length)).astype("float32")
        np.testing.assert_allclose(compiled.run({"x": x})["y"], sess.run(None, {"x": x})[0], rtol=1e-4, atol=1e-4)


def test_conv1d_of_a_symbolic_length():
    # an audio export with dynamic axes: the patch index is computed from the length at run time
    model, _ = _conv_model((1, 4, 0), (6, 4, 3), strides=[2], pads=[1, 1], dynamic_length=True)
    _check_lengths(model, "ConvAsMatmul", 4, [(1, 37), (3, 64), (2, 5)])


def test_conv1d_patches_are_rows_of_the_channels_last_input():
    """wav2vec2's feature encoder: conv, GELU, conv. Each conv1d gathers its patches as whole rows of the input
    transposed to [N, L, C] (a take along the length: [N, L_out, taps, C]), so that the transpose back from the
    previous conv's matmul rows, the GELU and this transpose are one elementwise kernel over those rows."""
    rng = np.random.default_rng(4)
    w1 = (rng.standard_normal((16, 1, 10)) / 3).astype("float32")
    w2 = (rng.standard_normal((16, 16, 3)) / 7).astype("float32")
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], strides=[5]),
             helper.make_node("Gelu", ["c1"], ["g"]),
             helper.make_node("Conv", ["g", "w2"], ["y"], strides=[2])]
    graph = helper.make_graph(nodes, "feature_encoder", [helper.make_tensor_value_info("x", F32, [2, 1, 400])],
                              [helper.make_tensor_value_info("y", F32, None)],
                              [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    report = _check(model, {"x": rng.standard_normal((2, 1, 400)).astype("float32")})
    assert report.canonicalized.get("ConvAsMatmul") == 2, report.summary()
    fused, _ = fuse(load_onnx(model))
    takes = []

    def visit(e):
        if isinstance(e, relax.Call) and getattr(e.op, "name", "") == "relax.take":
            takes.append([int(d) for d in e.ty.shape.values])

    relax.analysis.post_order_visit(fused["main"], visit)
    assert sorted(takes) == [[2, 39, 3, 16], [2, 79, 10, 1]], takes


@pytest.mark.parametrize("x_shape,w_shape,attrs", [
    ((1, 32, 49), (32, 8, 16), dict(group=4, pads=[8, 8])),      # wav2vec2-like positional conv (even kernel)
    ((2, 16, 20), (24, 8, 3), dict(group=2, strides=[2])),
    ((1, 16, 9, 9), (32, 4, 3, 3), dict(group=4, pads=[1, 1, 1, 1])),
])
def test_grouped_conv_is_a_matmul_per_group(x_shape, w_shape, attrs):
    model, _ = _conv_model(x_shape, w_shape, **attrs)
    x = np.random.default_rng(1).standard_normal(x_shape).astype("float32")
    report = _check(model, {"x": x})
    assert report.canonicalized.get("ConvAsMatmul") == 1, report.summary()


@pytest.mark.parametrize("build,why", [
    (lambda: _conv_model((1, 4, 8, 8), (4, 1, 3, 3), group=4, pads=[1, 1, 1, 1]), "4 groups of 1 output"),  # depthwise
    (lambda: _conv_model((1, 4, 8, 8), (6, 4, 3, 3), conv_w_input=True), "computed at run time"),
])
def test_what_is_not_read_as_a_matmul_keeps_the_stock_kernel(build, why):
    model, w = build()
    feeds = {"x": np.random.default_rng(1).standard_normal((1, 4, 8, 8)).astype("float32")}
    if "w" in [i.name for i in model.graph.input]:
        feeds["w"] = w
    mod = load_onnx(model)
    _, report = fuse(mod)
    assert not report.canonicalized.get("ConvAsMatmul")
    assert any(why in e.detail for e in report.refused if e.rule == "ConvAsMatmul")
    got = CompiledModel.from_module(mod).run(feeds)["y"]
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("x_shape,w_shape,attrs", [
    ((1, 8, 14, 14), (8, 1, 7, 7), dict(group=8, pads=[3, 3, 3, 3])),         # ConvNeXt's 7x7
    ((2, 6, 9, 11), (6, 1, 3, 3), dict(group=6, strides=[2, 2], pads=[1, 1, 1, 1])),
    ((1, 6, 10, 10), (6, 1, 3, 3), dict(group=6, dilations=[2, 2], pads=[2, 1, 2, 1])),
    ((1, 12, 40), (12, 1, 31), dict(group=12, pads=[15, 15])),                # a Conformer's convolution module
])
def test_depthwise_conv_is_a_sum_of_shifted_taps(x_shape, w_shape, attrs):
    model, _ = _conv_model(x_shape, w_shape, **attrs)
    x = np.random.default_rng(1).standard_normal(x_shape).astype("float32")
    report = _check(model, {"x": x})
    assert report.canonicalized.get("DepthwiseConvAsTaps") == 1, report.summary()
    assert not report.canonicalized.get("ConvAsMatmul")


@pytest.mark.parametrize("attrs", [dict(pads=[15, 15]), dict(pads=[3, 2], strides=[2], dilations=[2])])
def test_depthwise_conv1d_of_a_symbolic_length(attrs):
    # a Conformer's convolution module in a dynamic-axes audio export: the taps slice a symbolic length
    model, _ = _conv_model((1, 12, 0), (12, 1, 31 if attrs.get("pads") == [15, 15] else 5), dynamic_length=True,
                           group=12, **attrs)
    _check_lengths(model, "DepthwiseConvAsTaps", 12, [(1, 40), (3, 97), (2, 9)])


def test_depthwise_conv1d_runs_over_rows():
    # a Conformer's 31 taps over a channels-first input: one padded copy as [N, L + 30, C] rows, the taps vectorised
    # along the channels (along the length they were as slow as TVM's kernel)
    import tvm
    from tvm_fusion_ext.compile import prepare

    model, _ = _conv_model((2, 12, 40), (12, 1, 31), group=12, pads=[15, 15])
    _check(model, {"x": np.random.default_rng(2).standard_normal((2, 12, 40)).astype("float32")})
    source = prepare(load_onnx(model), "llvm")[0]["depthwise_tap_source"]
    shapes = [[int(d) for d in p.shape] for p in source.params]
    assert shapes == [[2, 12, 40], [2, 70, 12]], shapes


def _kernel_names(model):
    from tvm_fusion_ext.compile import prepare
    import tvm

    return [gv.name_hint for gv, f in prepare(load_onnx(model), "llvm")[0].functions_items()
            if isinstance(f, tvm.tirx.PrimFunc)]


def test_depthwise_conv_of_tokens_viewed_as_an_image_runs_channels_last_on_a_copy():
    # tokens [B, H*W, C] viewed as an image (SegFormer's Mix-FFN): the taps run over the tokens as [B, H, W, C],
    # padded by a kernel of its own, so that the taps' kernel does not pay the token-to-image reshape per tap
    rng = np.random.default_rng(0)
    w = rng.standard_normal((6, 1, 3, 3)).astype("float32")
    nodes = [helper.make_node("Transpose", ["t"], ["tt"], perm=[0, 2, 1]),
             helper.make_node("Reshape", ["tt", "image"], ["x"]),
             helper.make_node("Conv", ["x", "w"], ["y"], group=6, pads=[1, 1, 1, 1])]
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.array([1, 6, 4, 5], "int64"), "image")]
    graph = helper.make_graph(nodes, "segformer_dw", [helper.make_tensor_value_info("t", F32, [1, 20, 6])],
                              [helper.make_tensor_value_info("y", F32, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    report = _check(model, {"t": rng.standard_normal((1, 20, 6)).astype("float32")})
    assert report.canonicalized.get("DepthwiseConvAsTaps") == 1, report.summary()
    kernels = _kernel_names(model)
    assert "depthwise_tap_source" in kernels and not any("conv2d" in k for k in kernels), kernels


def test_depthwise_conv_of_another_transpose_copies_its_input_first():
    # an image with H and W swapped by a transpose: no channels-last tensor behind it, the taps run channels-first
    # on a padded copy
    rng = np.random.default_rng(1)
    w = rng.standard_normal((5, 1, 3, 3)).astype("float32")
    b = rng.standard_normal(5).astype("float32")
    nodes = [helper.make_node("Transpose", ["t"], ["x"], perm=[0, 1, 3, 2]),
             helper.make_node("Conv", ["x", "w", "b"], ["y"], group=5, pads=[1, 0, 1, 2], strides=[1, 2])]
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")]
    graph = helper.make_graph(nodes, "swapped_dw", [helper.make_tensor_value_info("t", F32, [2, 5, 7, 6])],
                              [helper.make_tensor_value_info("y", F32, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    report = _check(model, {"t": rng.standard_normal((2, 5, 7, 6)).astype("float32")})
    assert report.canonicalized.get("DepthwiseConvAsTaps") == 1, report.summary()
    assert "depthwise_tap_source" in _kernel_names(model)


def test_depthwise_conv_of_a_channels_last_tensor_runs_channels_last():
    # ConvNeXt: NHWC -> NCHW for the depthwise 7x7, back to NHWC for its LayerNorm: the taps run over the NHWC tensor
    # and the two transposes around them cancel (LayoutChainAsReshape)
    rng = np.random.default_rng(0)
    w = rng.standard_normal((6, 1, 7, 7)).astype("float32")
    b = rng.standard_normal(6).astype("float32")
    nodes = [helper.make_node("Transpose", ["t"], ["x"], perm=[0, 3, 1, 2]),
             helper.make_node("Conv", ["x", "w", "b"], ["c"], group=6, pads=[3, 3, 3, 3]),
             helper.make_node("Transpose", ["c"], ["y"], perm=[0, 2, 3, 1])]
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")]
    graph = helper.make_graph(nodes, "convnext_dw", [helper.make_tensor_value_info("t", F32, [1, 9, 10, 6])],
                              [helper.make_tensor_value_info("y", F32, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    report = _check(model, {"t": rng.standard_normal((1, 9, 10, 6)).astype("float32")})
    assert report.canonicalized.get("DepthwiseConvAsTaps") == 1, report.summary()
    assert report.canonicalized.get("LayoutChainAsReshape") == 1, report.summary()
