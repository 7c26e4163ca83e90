"""An ONNX file with dynamic batch and sequence dims compiles, without ``--shape``, to one artifact that serves
every size within its ``--max-shape`` bounds, and agrees with ONNX Runtime and with static builds."""

from __future__ import annotations

import numpy as np
import pytest
from _artifacts import dynamic_feeds, dynamic_onnx

from tvm_fusion_ext.cli import main
from tvm_fusion_ext.deploy import load
from tvm_fusion_ext.errors import InputError


@pytest.fixture(scope="module")
def dynamic_model(tmp_path_factory):
    return dynamic_onnx(tmp_path_factory.mktemp("dynamic") / "dynamic.onnx")


def test_one_artifact_for_every_size(dynamic_model, tmp_path, run_ort, capsys):
    out = tmp_path / "sym"
    assert main(["compile", dynamic_model, "-o", str(out), "--max-shape", "x:4x32x8,mask:4x32"]) == 0
    printed = capsys.readouterr().out
    assert "dim    batch: 1 .. 4" in printed and "dim    seq: 1 .. 32" in printed
    model = load(str(out))
    assert model.input_specs == {"x": (("batch", "seq", 8), "float32"), "mask": (("batch", "seq"), "float32")}
    assert model.manifest["dims"] == {"batch": {"min": 1, "max": 4, "why": {"max": "given (--max-shape)"}},
                                      "seq": {"min": 1, "max": 32, "why": {"max": "given (--max-shape)"}}}
    assert "dim    seq: 1 .. 32  (max: given (--max-shape))" in printed
    assert model.manifest["outputs"] == [{"name": "y", "dtype": "float32", "shape": ["batch", "seq", 16]}]
    assert model.manifest["fusion"]["fused"]["dense"] == 1  # MatMul + Add + Relu, with symbolic rows
    for batch, seq in ((1, 1), (2, 7), (4, 32), (3, 19)):
        feeds = dynamic_feeds(batch, seq, seed=seq)
        got = model.run(feeds)["y"]
        assert got.shape == (batch, seq, 16)
        np.testing.assert_allclose(got, run_ort(dynamic_model, feeds)[0], rtol=1e-5, atol=1e-5)
    with pytest.raises(InputError, match=r"dim 1 \(seq\) is 33, outside the range .* \(1\.\.32\)"):
        model.run(dynamic_feeds(1, 33))
    with pytest.raises(InputError, match=r"input 'mask' dim 1 \(seq\) is 6, but input 'x' has seq = 5"):
        model.run({**dynamic_feeds(1, 5), "mask": dynamic_feeds(1, 6)["mask"]})


@pytest.mark.parametrize("batch, seq", [(1, 9), (3, 16)])
def test_symbolic_and_static_artifacts_agree(dynamic_model, tmp_path, batch, seq):
    from tvm_fusion_ext.compile import compile_artifact

    compile_artifact(dynamic_model, str(tmp_path / "sym"), max_shapes={"x": [4, 32, 8], "mask": [4, 32]})
    symbolic = load(str(tmp_path / "sym"))
    compile_artifact(dynamic_model, str(tmp_path / "static"), shapes={"x": [batch, seq, 8], "mask": [batch, seq]})
    static = load(str(tmp_path / "static"))
    assert static.manifest["dims"] == {} and static.input_specs["x"] == ((batch, seq, 8), "float32")
    feeds = dynamic_feeds(batch, seq, seed=batch)
    np.testing.assert_allclose(symbolic.run(feeds)["y"], static.run(feeds)["y"], rtol=1e-4, atol=1e-4)
