"""What holds a loaded artifact's weights on CPU: memory on 2 MiB pages or the mapped weights file
(deploy/weights.py). Either way the kernels read the same bytes, checked against the manifest."""

from __future__ import annotations

import os

import numpy as np
import pytest
from _artifacts import flip_a_byte, symbolic_feeds, symbolic_reference

from tvm_fusion_ext.deploy import load
from tvm_fusion_ext.deploy import weights as W
from tvm_fusion_ext.deploy.manifest import WEIGHTS_FILE
from tvm_fusion_ext.errors import CorruptArtifactError

MB = 1 << 20


@pytest.fixture
def thp(monkeypatch):
    """``thp(available)``: pretend the kernel does (or does not) offer transparent huge pages."""
    return lambda available: monkeypatch.setattr(W, "huge_pages_available", lambda: available)


@pytest.mark.parametrize("requested,size,available,env,want", [
    ("auto", 40 * MB, True, None, "huge"),
    ("auto", 1 * MB, True, None, "file"),           # under one huge page: nothing to gain
    ("auto", 40 * MB, False, None, "file"),         # no THP (or not Linux)
    ("huge", 40 * MB, False, None, "file"),         # asked for, not offered: the file mapping, never a failure
    ("huge", 1 * MB, True, None, "huge"),           # asked for: even a small file
    ("file", 40 * MB, True, None, "file"),
    ("auto", 40 * MB, True, "file", "file"),        # the environment decides for "auto" ...
    ("file", 40 * MB, True, "huge", "file"),        # ... and only for "auto"
    ("auto", 1 * MB, True, "huge", "huge"),
])
def test_policy(requested, size, available, env, want, thp, monkeypatch):
    thp(available)
    monkeypatch.setattr(W, "_available_memory", lambda: 8 << 30)
    if env is None:
        monkeypatch.delenv(W.WEIGHT_PAGES_ENV, raising=False)
    else:
        monkeypatch.setenv(W.WEIGHT_PAGES_ENV, env)
    assert W.weight_pages_for(requested, size) == want


def test_weights_over_half_the_free_memory_stay_file_mapped(thp, monkeypatch):
    thp(True)
    monkeypatch.delenv(W.WEIGHT_PAGES_ENV, raising=False)
    monkeypatch.setattr(W, "_available_memory", lambda: 100 * MB)
    assert W.weight_pages_for("auto", 60 * MB) == "file"
    assert W.weight_pages_for("auto", 40 * MB) == "huge"
    assert W.weight_pages_for("huge", 60 * MB) == "huge"  # asked for explicitly


def test_bad_policies_are_refused_by_name(monkeypatch):
    with pytest.raises(ValueError, match="weight_pages must be one of auto, huge, file, got 'big'"):
        W.weight_pages_for("big", MB)
    monkeypatch.setenv(W.WEIGHT_PAGES_ENV, "2M")
    with pytest.raises(ValueError, match="TFX_WEIGHT_PAGES must be one of auto, huge, file, got '2M'"):
        W.weight_pages_for("auto", MB)


def test_huge_page_buffer_is_aligned_and_holds_the_file(tmp_path):
    data = np.random.default_rng(0).integers(0, 256, 3 * MB + 123, dtype=np.uint8)
    file = tmp_path / "w.bin"
    data.tofile(file)
    buffer = W.read_into_huge_pages(str(file))
    assert buffer.ctypes.data % W.HUGE_PAGE == 0
    np.testing.assert_array_equal(buffer, data)
    empty = tmp_path / "empty.bin"
    empty.write_bytes(b"")
    assert W.read_into_huge_pages(str(empty)).size == 0


@pytest.mark.skipif(not W.huge_pages_available(), reason="this kernel offers no transparent huge pages")
def test_huge_page_buffer_is_backed_by_huge_pages(tmp_path):
    """Where THP is offered the advice takes: the buffer's range counts anonymous huge pages (a fragmented
    machine may give fewer than all; one is enough to show the advice reached the kernel)."""
    data = np.ones(8 * MB, np.uint8)
    file = tmp_path / "w.bin"
    data.tofile(file)
    buffer = W.read_into_huge_pages(str(file))
    start = buffer.ctypes.data
    with open("/proc/self/smaps") as f:
        lines = f.read().splitlines()
    huge_kb, inside = 0, False
    for line in lines:
        head = line.split()[0]
        if "-" in head and ":" not in head:
            lo, hi = (int(x, 16) for x in head.split("-"))
            inside = lo <= start < hi
        elif inside and head == "AnonHugePages:":
            huge_kb = int(line.split()[1])
    assert huge_kb >= 2048


@pytest.mark.parametrize("pages", ["huge", "file"])
def test_both_holders_run_the_same_model(symbolic_artifact, pages):
    path, w = symbolic_artifact
    model = load(path, weight_pages=pages)
    assert model.weight_pages == (pages if W.huge_pages_available() else "file")
    for n in (1, 5, 64):
        feeds = symbolic_feeds(n)
        got = model.run(feeds)
        for name, want in symbolic_reference(w, feeds).items():
            np.testing.assert_allclose(got[name], want, rtol=1e-5, atol=1e-5)


def test_a_damaged_weights_file_is_refused_from_huge_pages_too(symbolic_artifact, copy_artifact):
    path = copy_artifact(symbolic_artifact[0])
    flip_a_byte(path, WEIGHTS_FILE)
    with pytest.raises(CorruptArtifactError, match=WEIGHTS_FILE):
        load(path, weight_pages="huge")


def test_load_refuses_an_unknown_policy(symbolic_artifact):
    with pytest.raises(ValueError, match="weight_pages must be one of"):
        load(symbolic_artifact[0], weight_pages="2M")
