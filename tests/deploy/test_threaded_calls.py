"""A server calls ``run`` from many threads at once: 8 threads × 50 calls of mixed lengths on one loaded model,
every output equal to the single-thread result for the same input."""

from __future__ import annotations

import threading

import numpy as np
from _artifacts import SYMBOLIC_BOUND, symbolic_feeds

from tvm_fusion_ext.deploy import load

THREADS, CALLS = 8, 50


def _hammer(model, feeds, expected):
    start = threading.Barrier(THREADS)
    mismatches, errors = [], []

    def work(t):
        start.wait()  # all threads call at the same time
        try:
            for i in range(CALLS):
                k = (t * 7 + i) % len(feeds)
                got = model.run(feeds[k])
                if not all(np.array_equal(got[n], expected[k][n]) for n in expected[k]):
                    mismatches.append((t, i, k))
        except Exception as err:  # noqa: BLE001  (reported below, with the thread that hit it)
            errors.append((t, repr(err)))

    threads = [threading.Thread(target=work, args=(t,)) for t in range(THREADS)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=600)
    assert not errors, errors
    assert not mismatches, f"{len(mismatches)} of {THREADS * CALLS} calls differ from the single-thread result"


def test_threads_with_mixed_lengths(symbolic_artifact):
    model = load(symbolic_artifact[0])
    lengths = [1, 3, 8, 17, 30, 33, SYMBOLIC_BOUND, 2, 50, 12, 5]
    feeds = [symbolic_feeds(n, seed=i) for i, n in enumerate(lengths)]
    expected = [model.run(f) for f in feeds]
    _hammer(model, feeds, expected)


def test_threads_on_the_fused_encoder(tiny_artifact, tiny_onnx):
    from tvm_fusion_ext.models import sample_inputs

    model = load(tiny_artifact)
    feeds = [sample_inputs(tiny_onnx, seed=s) for s in range(5)]
    expected = [model.run(f) for f in feeds]
    _hammer(model, feeds, expected)
