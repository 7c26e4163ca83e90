"""Models written with torch's own building blocks, not Hugging Face's: ``nn.TransformerEncoder`` (its layers call
``nn.MultiheadAttention`` without the weights: 4-D matmuls over heads split on 3-D ``[B·H, S, D]`` tensors) and
``nn.MultiheadAttention`` called directly (it returns the averaged weights too: 3-D matmuls over seq-first
``[S, B·H, D]`` heads), batch-first or not. Both compute the softmax scale at run time (``sqrt(1/sqrt(d))`` on q
and k). Every attention must fuse and the model match torch at the valid positions; a dynamic-axes export that
baked the traced length into its head split must run at that length and refuse another in one line."""

import contextlib
import io
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")

SEQ, BATCH, WIDTH = 20, 2, 64


class _Block(torch.nn.Module):
    """A residual block around ``nn.MultiheadAttention`` called as users call it: ``attn(h, h, h, key_padding_mask=)``."""

    def __init__(self, batch_first: bool):
        super().__init__()
        self.batch_first = batch_first
        self.attn = torch.nn.MultiheadAttention(WIDTH, 4, batch_first=batch_first)
        self.norm = torch.nn.LayerNorm(WIDTH)

    def forward(self, x, pad):
        h = x if self.batch_first else x.transpose(0, 1)
        a, _ = self.attn(h, h, h, key_padding_mask=pad)
        return self.norm(x + (a if self.batch_first else a.transpose(0, 1)))


class _Encoder(torch.nn.Module):
    def __init__(self, batch_first: bool):
        super().__init__()
        self.batch_first = batch_first
        layer = torch.nn.TransformerEncoderLayer(WIDTH, 4, dim_feedforward=128, dropout=0.0, activation="gelu",
                                                 batch_first=batch_first)
        self.encoder = torch.nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)

    def forward(self, x, pad):
        if self.batch_first:
            return self.encoder(x, src_key_padding_mask=pad)
        return self.encoder(x.transpose(0, 1), src_key_padding_mask=pad).transpose(0, 1)


def _inputs(batch=BATCH, seq=SEQ, seed=0):
    g = torch.Generator().manual_seed(seed)
    pad = torch.zeros(batch, seq, dtype=torch.bool)
    pad[1 % batch, seq - 6:] = True
    return torch.randn(batch, seq, WIDTH, generator=g), pad


def _export(module, path, exporter, dynamic=False):
    kw = {"dynamic_axes": {"x": {0: "batch", 1: "seq"}, "pad": {0: "batch", 1: "seq"}}} if dynamic else {}
    # not under no_grad: there torch's eval-mode fast path (one fused native op per layer) would be traced, and
    # the legacy exporter has no ONNX for it
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter("ignore")
        torch.onnx.export(module, _inputs(), path, input_names=["x", "pad"], output_names=["y"],
                          dynamo=exporter == "dynamo", opset_version=18 if exporter == "dynamo" else 17, **kw)
    return path


def _check(module, path, layers, batch=BATCH, seq=SEQ):
    from tvm_fusion_ext.frontend import load_onnx
    from tvm_fusion_ext.runtime import CompiledModel

    compiled = CompiledModel.from_module(load_onnx(path))
    assert compiled.report.fused["attention"] == layers, compiled.report.fused
    x, pad = _inputs(batch, seq, seed=1)
    with torch.no_grad():
        want = module(x, pad).numpy()
    got = compiled.run({"x": x.numpy(), "pad": pad.numpy()})["y"]
    valid = ~pad.numpy()
    np.testing.assert_allclose(got[valid], want[valid], rtol=1e-4, atol=1e-4)
    return compiled


_CASES = [(_Encoder, True, 2), (_Encoder, False, 2), (_Block, True, 1), (_Block, False, 1)]
_IDS = ["encoder-batch-first", "encoder-seq-first", "mha-batch-first", "mha-seq-first"]


@pytest.mark.parametrize("exporter", ["legacy", pytest.param("dynamo", marks=pytest.mark.slow)])
@pytest.mark.parametrize("make, batch_first, layers", _CASES, ids=_IDS)
def test_torch_attention_fuses_and_matches_torch(export_dir, make, batch_first, layers, exporter):
    torch.manual_seed(0)
    module = make(batch_first).eval()
    path = _export(module, str(export_dir / f"nn_{make.__name__}_{batch_first}_{exporter}.onnx"), exporter)
    _check(module, path, layers)


@pytest.mark.slow  # 14-15 s each
@pytest.mark.parametrize("make, batch_first, layers", [(_Encoder, True, 2), (_Block, False, 1)],
                         ids=["encoder-batch-first", "mha-seq-first"])
def test_dynamic_export_with_the_traced_length_baked_in(export_dir, make, batch_first, layers):
    # the direct module's 3-D matmuls then run over [S, batch·4, D] heads with a symbolic batch: read as batch·4
    # batches of one head (transposed first), so they fuse too
    from tvm_fusion_ext.errors import InputError

    torch.manual_seed(0)
    module = make(batch_first).eval()
    path = _export(module, str(export_dir / f"nn_{make.__name__}_dynamic.onnx"), "legacy", dynamic=True)
    compiled = _check(module, path, layers, batch=3)  # another batch at the traced length: fused, and right
    assert compiled.bounds["seq"] == (SEQ, SEQ)
    x, pad = _inputs(2, 13)
    with pytest.raises(InputError, match=r"\(seq\) is 13, outside the range the model was compiled for \(20\.\.20\): "
                                         r"node '.*Reshape.*' reshapes \[seq, batch, 64\] to \[20, batch \* 4, 16\]"):
        compiled.run({"x": x.numpy(), "pad": pad.numpy()})


def test_transformer_decoder_fuses_causal_self_and_cross_attention(export_dir):
    """``nn.TransformerDecoder`` (pre-norm): a causal self-attention (the float ``-inf`` upper triangle of
    ``generate_square_subsequent_mask``) and a cross-attention over 20 memory positions per layer."""
    from tvm_fusion_ext.frontend import load_onnx
    from tvm_fusion_ext.runtime import CompiledModel

    torch.manual_seed(0)
    layer = torch.nn.TransformerDecoderLayer(WIDTH, 4, dim_feedforward=128, dropout=0.0, batch_first=True,
                                             norm_first=True)
    decoder = torch.nn.TransformerDecoder(layer, num_layers=2).eval()

    class Decoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.decoder = decoder

        def forward(self, tgt, memory):
            causal = torch.nn.Transformer.generate_square_subsequent_mask(tgt.shape[1])
            return self.decoder(tgt, memory, tgt_mask=causal)

    module = Decoder().eval()
    g = torch.Generator().manual_seed(2)
    tgt, memory = torch.randn(2, 12, WIDTH, generator=g), torch.randn(2, SEQ, WIDTH, generator=g)
    path = str(export_dir / "nn_decoder_legacy.onnx")
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter("ignore")
        torch.onnx.export(module, (tgt, memory), path, input_names=["tgt", "memory"], output_names=["y"],
                          dynamo=False, opset_version=17)
    compiled = CompiledModel.from_module(load_onnx(path))
    assert compiled.report.fused["attention"] == 4, compiled.report.fused
    with torch.no_grad():
        want = module(tgt, memory).numpy()
    got = compiled.run({"tgt": tgt.numpy(), "memory": memory.numpy()})["y"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
