"""A thread's steady calls reuse its input buffers (deploy/io.py ``InputBuffers``): the checks are skipped only
where the last checked call decides them, new values always reach the model, outputs are the caller's own."""

from __future__ import annotations

import numpy as np
import pytest
from _artifacts import SYMBOLIC_BOUND, symbolic_feeds, symbolic_reference

import tvm_fusion_ext.deploy.loader as loader_module
from tvm_fusion_ext.deploy import load
from tvm_fusion_ext.errors import InputError


@pytest.fixture
def counted(symbolic_artifact, monkeypatch):
    """``(model, w, checks)``: a freshly loaded model whose input checks are counted in ``checks[0]``."""
    checks = [0]
    real = loader_module.check_inputs

    def counting(*args, **kwargs):
        checks[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(loader_module, "check_inputs", counting)
    path, w = symbolic_artifact
    return load(path), w, checks


def _close(got, want):
    for name, ref in want.items():
        np.testing.assert_allclose(got[name], ref, rtol=1e-5, atol=1e-5)


def test_steady_calls_skip_the_checks_and_see_their_own_values(counted):
    model, w, checks = counted
    first_feeds, second_feeds = symbolic_feeds(5, seed=0), symbolic_feeds(5, seed=1)
    first = model.run(first_feeds)
    kept = {k: v.copy() for k, v in first.items()}
    second = model.run(second_feeds)
    assert checks[0] == 1  # same names, order, shapes, dtypes: decided by the first call's checks
    _close(first, symbolic_reference(w, first_feeds))
    _close(second, symbolic_reference(w, second_feeds))
    for name in first:  # the first call's outputs are untouched by the second's inputs
        np.testing.assert_array_equal(first[name], kept[name])
        assert not np.shares_memory(first[name], second[name])


def test_outputs_are_the_callers_own(counted):
    model, w, _ = counted
    feeds = symbolic_feeds(4, seed=2)
    out = model.run(feeds)
    out["twice_x"][:] = 0  # an output never aliases an input buffer, a weight or a later output
    _close(model.run(feeds), symbolic_reference(w, feeds))
    feeds["x.in"][:] = 1  # nor is the caller's array read after the call
    np.testing.assert_array_equal(model.run(symbolic_feeds(4, seed=2))["twice_x"],
                                  2 * symbolic_feeds(4, seed=2)["x.in"])


class _Subclass(np.ndarray):
    pass


@pytest.mark.parametrize("change", ["shape", "order", "subclass"])
def test_anything_else_is_checked_again(counted, change):
    model, w, checks = counted
    model.run(symbolic_feeds(5))
    feeds = symbolic_feeds(7 if change == "shape" else 5, seed=3)
    if change == "order":
        feeds = dict(reversed(list(feeds.items())))
    if change == "subclass":
        feeds = {k: v.view(_Subclass) for k, v in feeds.items()}
    _close(model.run(feeds), symbolic_reference(w, {k: np.asarray(v) for k, v in feeds.items()}))
    assert checks[0] == 2


def test_strided_inputs_of_the_same_shape_are_copied_in(counted):
    model, w, checks = counted
    model.run(symbolic_feeds(5))
    wide = symbolic_feeds(10, seed=4)
    feeds = {k: v[::2] for k, v in wide.items()}  # every other row: not contiguous
    _close(model.run(feeds), symbolic_reference(w, {k: np.ascontiguousarray(v) for k, v in feeds.items()}))
    assert checks[0] == 1


@pytest.mark.parametrize("bad,match", [
    (lambda f: {k: v.astype(np.float64) for k, v in f.items()}, "has dtype float64, expected float32"),
    (lambda f: symbolic_feeds(SYMBOLIC_BOUND + 1), "outside the range the model was compiled for"),
    (lambda f: {"x.in": f["x.in"], "y": f["y"][:3]}, "dim 0 .* is 3, but input 'x.in' has"),
])
def test_a_bad_call_after_good_ones_is_still_refused(counted, bad, match):
    model, _, _ = counted
    feeds = symbolic_feeds(5)
    model.run(feeds)
    model.run(feeds)
    with pytest.raises(InputError, match=match):
        model.run(bad(feeds))
    model.run(feeds)  # and the model still runs


def test_the_in_process_model_reuses_its_buffers_too(tiny_onnx, run_ort):
    from tvm_fusion_ext.models import sample_inputs
    from tvm_fusion_ext.runtime import CompiledModel

    model = CompiledModel.from_onnx(tiny_onnx)
    outs = [model.run(sample_inputs(tiny_onnx, seed=seed)) for seed in (0, 1, 0)]
    np.testing.assert_array_equal(outs[0]["last_hidden_state"], outs[2]["last_hidden_state"])
    assert not np.array_equal(outs[0]["last_hidden_state"], outs[1]["last_hidden_state"])
    np.testing.assert_allclose(outs[1]["last_hidden_state"], run_ort(tiny_onnx, sample_inputs(tiny_onnx, seed=1))[0],
                               rtol=1e-4, atol=1e-4)
