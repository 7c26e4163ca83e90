"""Greedy generation over a compiled KV-cache decoder (``deploy.generate``): a prefill against an empty past,
then one token per step with ``present`` fed back as ``past``; the tokens must equal transformers' greedy
``generate`` on the same random-weight LLaMA, for a batch with a left-padded row, and stop at EOS as it does."""

import numpy as np
import pytest

from tvm_fusion_ext.deploy.generate import DecoderIO, generate
from tvm_fusion_ext.errors import InputError

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def compiled_tiny_lm(tiny_causal_lm):
    from tvm_fusion_ext.frontend import load_onnx
    from tvm_fusion_ext.runtime import CompiledModel

    return CompiledModel.from_module(load_onnx(tiny_causal_lm), fuse=True)


def _torch_greedy(ids, mask, new, eos=None):
    from tvm_fusion_ext.models.causal_lm import causal_lm

    model, _ = causal_lm("tiny")  # seed 0: the weights the export has
    with torch.no_grad():
        out = model.generate(torch.from_numpy(ids), attention_mask=torch.from_numpy(mask), max_new_tokens=new,
                             do_sample=False, eos_token_id=eos, pad_token_id=0 if eos is None else eos)
    return out.numpy()


def test_greedy_tokens_equal_transformers_generate(compiled_tiny_lm):
    ids = np.array([[11, 57, 300, 42, 7], [0, 0, 99, 512, 3]], np.int64)
    mask = np.array([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]], np.int64)  # the second prompt left-padded
    got = generate(compiled_tiny_lm, ids, max_new_tokens=12, attention_mask=mask)
    np.testing.assert_array_equal(got, _torch_greedy(ids, mask, 12))
    assert got.shape == (2, 17)


def test_generation_stops_at_eos_like_transformers(compiled_tiny_lm):
    ids = np.array([[11, 57, 300, 42, 7]], np.int64)
    free = generate(compiled_tiny_lm, ids, max_new_tokens=8)
    eos = int(free[0, 5 + 2])  # the third generated token: generation must stop right after it
    got = generate(compiled_tiny_lm, ids, max_new_tokens=8, eos_token_id=eos)
    np.testing.assert_array_equal(got, _torch_greedy(ids, np.ones_like(ids), 8, eos=eos))
    assert got.shape[1] <= 5 + 3 and got[0, -1] == eos


def test_bad_calls_are_one_line_errors(compiled_tiny_lm):
    with pytest.raises(InputError, match="input_ids must be a"):
        generate(compiled_tiny_lm, np.zeros((2,), np.int64))
    with pytest.raises(InputError, match="attention_mask has shape"):
        generate(compiled_tiny_lm, np.ones((1, 3), np.int64), attention_mask=np.ones((1, 4), np.int64))

    class Encoder:
        input_specs = {"input_ids": (("b", "s"), "int64"), "attention_mask": (("b", "s"), "int64")}
        output_names = ["last_hidden_state"]

    with pytest.raises(InputError, match="no past"):
        DecoderIO(Encoder())
