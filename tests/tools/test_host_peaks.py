"""The host's peak per precision (tools/bench/host_peaks.py): built with the system's C compiler, measured in
seconds, read against each dense kernel's rate in ``bench --kernels``; no compiler is one line, not a crash."""

import shutil

import pytest

from tvm_fusion_ext.deploy.profile import KernelProfile, KernelTime
from tvm_fusion_ext.tools.bench import host_peaks
from tvm_fusion_ext.tools.bench.host_peaks import describe_peaks, measure_peaks, peak_for


@pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None, reason="no C compiler")
def test_peaks_are_measured_for_every_precision_with_the_instruction_used(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    peaks = measure_peaks(1)
    assert "error" not in peaks, peaks
    assert peaks["threads"] == 1 and peaks["fp32_gflops"] > 1 and peaks["copy_gbs"] > 0.1
    with open("/proc/cpuinfo") as f:
        flags = f.read()
    # without AVX512_BF16 bf16's limit is fp32's (the weights are widened); int8 has a dot product either way
    if " avx512_bf16" not in flags:
        assert peaks["bf16_gflops"] == peaks["fp32_gflops"] and "widened" in peaks["bf16_instruction"]
    assert peaks["int8_gops"] > 1 and ("vpdpbusd" if " avx512_vnni" in flags else "vpmaddwd") in peaks["int8_instruction"]
    assert list(tmp_path.glob("tvm_fusion_ext/host-peaks-*"))  # cached: the next benchmark does not rebuild it
    assert peak_for(peaks, "int8") == peaks["int8_gops"] and peak_for(peaks, "bf16") == peaks["bf16_gflops"]
    assert describe_peaks(peaks).startswith("host peaks, 1 threads, measured now: fp32 ")


def test_no_compiler_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    monkeypatch.setattr(host_peaks.shutil, "which", lambda _: None)
    peaks = measure_peaks(2)
    assert set(peaks) == {"error"} and "\n" not in peaks["error"]
    assert peak_for(peaks, "fp32") is None and describe_peaks(peaks).startswith("host peaks: not measured (")


def test_the_kernel_table_reads_each_dense_against_its_peak():
    profile = KernelProfile([KernelTime("fused_dense_int8", 4, 2.0, gflops=0.2), KernelTime("fused_dense", 2, 1.0,
                                                                                           gflops=0.05),
                             KernelTime("fused_layernorm", 2, 0.5)], call_ms=3.6, profiled_ms=3.8, runs=3)
    peaks = {"int8": 200.0, "fp32": 100.0}
    rows = profile.table(peak=lambda name: peaks["int8" if "int8" in name else "fp32"]).splitlines()
    assert rows[0].endswith("| GFLOP/s | of peak |")
    assert rows[2].endswith("| 100.0 | 50 % |") and rows[3].endswith("| 50.0 | 50 % |")
    assert rows[4].endswith("|  |  |")  # no work count, no share
