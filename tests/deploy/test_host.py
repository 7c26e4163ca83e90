"""Reading this machine's CPU features and matching them to LLVM's feature names."""

from __future__ import annotations

import pytest

from tvm_fusion_ext.deploy import host
from tvm_fusion_ext.errors import IncompatibleArtifactError


def test_cpuinfo_flags_x86_and_arm(tmp_path):
    x86 = tmp_path / "x86"
    x86.write_text("processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu sse sse2 pni avx avx2 fma\n\n"
                   "processor\t: 1\nflags\t\t: fpu sse sse2 pni avx avx2 fma\n")
    assert host.cpu_flags(str(x86)) == {"fpu", "sse", "sse2", "pni", "avx", "avx2", "fma"}
    arm = tmp_path / "arm"
    arm.write_text("processor\t: 0\nBogoMIPS\t: 50.00\nFeatures\t: fp asimd atomics asimddp sve\n")
    assert host.cpu_flags(str(arm)) == {"fp", "asimd", "atomics", "asimddp", "sve"}
    assert host.cpu_flags(str(tmp_path / "missing")) is None


def test_only_features_code_can_use_are_checked():
    llvm = ["avx2", "fma", "sse3", "sse4.1", "avx512f", "fast-gather", "slow-3ops-lea", "mwaitx", "xsaves", "64bit"]
    assert host.checked_features("x86_64", llvm) == ["avx2", "avx512f", "fma", "sse3", "sse4.1"]
    flags = {"avx2", "fma", "pni", "sse4_1"}  # cpuinfo spells sse3 "pni" and sse4.1 "sse4_1"
    assert host.missing_features("x86_64", llvm, flags) == ["avx512f"]
    assert host.missing_features("aarch64", ["neon", "dotprod", "sve"], {"asimd", "asimddp"}) == ["sve"]


def test_this_machines_own_target_passes():
    """What LLVM enables for this CPU (the default target) is what this CPU has."""
    import tvm
    from tvm.target import codegen

    flags = host.cpu_flags()
    if not flags or host.machine_arch() not in host.LLVM_TO_CPUINFO:
        pytest.skip("needs Linux /proc/cpuinfo on x86_64 or aarch64")
    target = tvm.target.Target({"kind": "llvm", "mcpu": str(codegen.llvm_get_system_cpu())})
    features = [str(f) for f in codegen.llvm_get_cpu_features(target)]
    assert host.checked_features(host.machine_arch(), features)
    assert host.missing_features(host.machine_arch(), features, flags) == []
    host.check_cpu("art", {"triple": str(codegen.llvm_get_system_triple()), "checked_features": features})


def test_check_gpu_refusals():
    class Device:
        def __init__(self, exist, version="8.0"):
            self.exist, self.compute_version = exist, version

    with pytest.raises(IncompatibleArtifactError, match="no CUDA GPU"):
        host.check_gpu("art", "sm_90", Device(False))
    with pytest.raises(IncompatibleArtifactError, match="compiled for CUDA sm_90, this GPU is sm_80"):
        host.check_gpu("art", "sm_90", Device(True, "8.0"))
    host.check_gpu("art", "sm_80", Device(True, "9.0"))  # a newer GPU runs it


def test_llvm_cpu_targets():
    from tvm_fusion_ext.errors import TargetError
    from tvm_fusion_ext.targets import TargetInfo, resolve_target

    if host.machine_arch() != "x86_64":
        pytest.skip("x86-64 CPU names")
    v3 = resolve_target("llvm:x86-64-v3")
    assert str(v3.attrs["mcpu"]) == "x86-64-v3" and TargetInfo.of(v3).lanes("float32") == 8
    assert TargetInfo.of(resolve_target("llvm:x86-64-v4")).lanes("float32") == 16
    with pytest.raises(TargetError, match="unknown LLVM CPU 'pentium-9000'"):
        resolve_target("llvm:pentium-9000")
